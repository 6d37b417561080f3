"""Pull NCCL Inspector's samples from a running Prometheus over its HTTP API.

Where node_exporter's textfile collector serves the Inspector's ``.prom`` files, the
cluster's Prometheus already holds them. Each series (its labels include ``coll_sn`` and
``timestamp``, so every collective sampled is a series of its own) is read with its raw
samples by an instant query of a range selector, one time window at a time::

    GET <url>/api/v1/query?query=nccl_collective_exec_time_microseconds{<selector>}[<w>ms]&time=<end>

``<selector>`` (``--selector``) picks the job's series, e.g. ``slurm_job_id="4711"``. Windows
of :data:`DEFAULT_WINDOW_MS` cover ``--since`` .. ``--until``; a series seen in two windows
counts once. Every answer is data from the network: read within a byte limit
(``--max-response-mb``; a window whose answer is larger is split in two and asked again, down
to :data:`MIN_WINDOW_MS`, then refused naming the flag), within ``--timeout`` seconds, its JSON
checked (labels text, at most :data:`~collector.nccl_import.prom_text.MAX_LABELS` of them,
values numbers). Errors name the URL and what went wrong: no connection, no answer in time,
Prometheus's own error (a bad selector), an answer that is not the API's.
"""

from __future__ import annotations

import http.client
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import pandas as pd

from collector.nccl_import.prom_records import EXEC_METRIC
from collector.nccl_import.prom_text import MAX_LABELS, samples_frame
from collector.nccl_import.records import NcclError
from collector.untrusted.bounded_read import MB, FileLimit
from rankscope.times import format_time

#: Time covered by one query (a window whose answer is over the limit is split).
DEFAULT_WINDOW_MS = 30 * 60_000
#: The smallest window asked for before an answer over the limit is refused.
MIN_WINDOW_MS = 1_000
#: Default bound on one answer (MB), and its flag.
DEFAULT_MAX_RESPONSE_MB = 64
RESPONSE_FLAG = "--max-response-mb"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_MAX_TEXT = 4096


class _TooLarge(Exception):
    """An answer over the limit (the window is split)."""


@dataclass
class PromSource:
    """A Prometheus server and how to ask it: base URL, series selector, timeout, limit."""

    url: str
    selector: str = ""
    timeout_s: float = 30.0
    limit: FileLimit = field(default_factory=lambda: FileLimit(DEFAULT_MAX_RESPONSE_MB * MB, RESPONSE_FLAG))

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise NcclError(f"--prometheus {self.url!r} is not an http(s) URL (e.g. http://prometheus:9090)")
        if not (isinstance(self.timeout_s, int | float) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise NcclError(f"--timeout must be a positive number of seconds, got {self.timeout_s!r}")
        self.url = self.url.rstrip("/")
        selector = self.selector.strip()
        if selector.startswith("{") and selector.endswith("}"):
            selector = selector[1:-1]
        self.selector = selector
        proxies = {} if parts.hostname in _LOOPBACK else None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))

    def query_text(self, window_ms: int) -> str:
        """The PromQL of one window."""
        return f"{EXEC_METRIC}{{{self.selector}}}[{int(window_ms)}ms]"

    def _get(self, path: str, params: dict[str, str]) -> bytes:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with self._opener.open(url, timeout=self.timeout_s) as resp:
                return _bounded_body(resp, self.limit)
        except urllib.error.HTTPError as exc:
            raise NcclError(f"{self.url}: Prometheus answered {exc.code}: {_api_error(exc)}") from None
        except TimeoutError:
            raise NcclError(f"{self.url}: no answer within {self.timeout_s:g} s (--timeout)") from None
        except urllib.error.URLError as exc:
            raise NcclError(f"{self.url}: cannot reach Prometheus: {exc.reason}") from None
        except (ConnectionError, OSError) as exc:
            raise NcclError(f"{self.url}: cannot reach Prometheus: {exc}") from None

    def window(self, end_ms: int, window_ms: int) -> list[dict]:
        """The series with samples in the window ending at ``end_ms`` (the API's ``result``)."""
        body = self._get("/api/v1/query", {"query": self.query_text(window_ms), "time": f"{end_ms / 1000:.3f}"})
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            raise NcclError(f"{self.url}: the answer is not JSON, so not Prometheus's query API: "
                            f"{body[:60].decode('utf-8', 'replace')!r}") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise NcclError(f"{self.url}: Prometheus refused the query: {_describe(answer)}")
        data = answer.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise NcclError(f"{self.url}: the answer has no data.result matrix (not Prometheus's query API?)")
        return data["result"]

    def fetch(self, start_ms: int, end_ms: int, window_ms: int = DEFAULT_WINDOW_MS) -> pd.DataFrame:
        """The samples frame (see :mod:`~collector.nccl_import.prom_text`) of every series with
        samples in ``start_ms`` .. ``end_ms``: per series its last value and first sample time."""
        if end_ms <= start_ms:
            raise NcclError(f"--since {format_time(start_ms)} is not before --until {format_time(end_ms)}")
        frames: list[pd.DataFrame] = []
        todo = [(start_ms + k, min(start_ms + k + window_ms, end_ms)) for k in range(0, end_ms - start_ms, window_ms)]
        while todo:
            lo, hi = todo.pop(0)
            try:
                frames.append(series_samples(self.window(hi, hi - lo), self.url))
            except _TooLarge:
                if hi - lo <= MIN_WINDOW_MS:
                    raise NcclError(self._too_large(hi - lo)) from None
                mid = (lo + hi) // 2
                todo[:0] = [(lo, mid), (mid, hi)]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else series_samples([], self.url)

    def _too_large(self, window_ms: int) -> str:
        return (f"{self.url}: the answer to {self.query_text(window_ms)} is more than "
                f"{self.limit.max_bytes / MB:.3g} MB even for {window_ms} ms of samples; refused. Pick the job's "
                f"series with --selector, or raise {RESPONSE_FLAG} (MB; default {DEFAULT_MAX_RESPONSE_MB})")


def _bounded_body(resp: http.client.HTTPResponse, limit: FileLimit) -> bytes:
    """The body, or :class:`_TooLarge` once it passes ``limit``."""
    length = resp.headers.get("Content-Length")
    if length and length.isdigit() and int(length) > limit.max_bytes:
        raise _TooLarge()
    out = bytearray()
    while chunk := resp.read(1 << 20):
        out += chunk
        if len(out) > limit.max_bytes:
            raise _TooLarge()
    return bytes(out)


def _api_error(exc: urllib.error.HTTPError) -> str:
    try:
        answer = json.loads(exc.read(64 << 10))
    except (ValueError, OSError, RecursionError):
        return str(exc.reason)
    return _describe(answer)


def _describe(answer: object) -> str:
    if isinstance(answer, dict) and "error" in answer:
        return f"{str(answer.get('errorType', 'error'))[:40]}: {str(answer['error'])[:300]}"
    return "an answer without status success"


def _labels(metric: object, where: str) -> dict[str, str]:
    if not isinstance(metric, dict) or len(metric) > MAX_LABELS + 3 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 128 and len(v) <= _MAX_TEXT
            for k, v in metric.items()):
        raise NcclError(f"{where}: 'metric' is not a set of at most {MAX_LABELS} text labels")
    return metric


def _series_row(s: object, where: str) -> tuple[dict[str, str], float, float]:
    """(labels, last value, first sample time ms) of one series of the answer."""
    if not isinstance(s, dict):
        raise NcclError(f"{where}: not a series")
    labels = _labels(s.get("metric"), where)
    values = s.get("values")
    if not isinstance(values, list) or not values or not all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], int | float) and isinstance(v[1], str)
            for v in values):
        raise NcclError(f"{where}: 'values' is not a list of [time, \"value\"] pairs")
    try:
        value = float(values[-1][1])
    except ValueError:
        raise NcclError(f"{where}: value {values[-1][1][:40]!r} is not a number") from None
    return labels, value, float(values[0][0]) * 1000.0


def series_samples(series: list[dict], url: str) -> pd.DataFrame:
    """The samples frame of the API's series (labels checked, ``@where`` naming each)."""
    labels, where, values, seen = [], [], [], []
    for i, s in enumerate(series):
        w = f"{url}: series {i}"
        lab, value, first_ms = _series_row(s, w)
        labels.append({"__name__": EXEC_METRIC, **lab})
        where.append(f"{w} ({lab.get('hostname', '?')}, comm {lab.get('comm_id', '?')}, sn {lab.get('coll_sn', '?')})")
        values.append(value)
        seen.append(first_ms)
    return samples_frame(labels, where, values, seen)
