"""NVIDIA dcgm-exporter's metrics from a Prometheus, over its HTTP API: one ``query_range`` for
the hosts asked about, every metric of :data:`METRICS` at once::

    GET <url>/api/v1/query_range?query={__name__=~"DCGM_FI_DEV_SM_CLOCK|...",Hostname=~"(?i)(a|b)(\\..+)?(:[0-9]+)?"}
        &start=<s>&end=<s>&step=<s>

Hosts are asked for by every name monitoring may know them by (full, short, ``host_map``:
:class:`rankscope.hostnames.HostIndex`), a short name also as the first label of a longer one,
in the label ``host_label`` (``Hostname`` by default; ``instance`` as ``host:port``; ``node`` where
relabelling puts the Kubernetes node there); ``selector`` adds matchers (``cluster="a"``). The
step keeps every series to at most ``max_points`` samples. Field 112 is read under both its
names (``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``, older exporters; ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``,
newer) and from ``DCGM_EXP_CLOCK_EVENTS_COUNT`` (one series per ``clock_event``, a count per window:
its reason's bit where the count is above 0). Duplicate series of one GPU and metric (two scrape
jobs, an HA pair) count once: the one with the most samples.

A check asks for less where it says so (:class:`~analyzer.read.gpu_samples.TelemetrySource`):
only the metrics of its ``signals``, and the baseline before ``onset_ms`` in a query of its own,
for ``baseline_hosts`` only (the culprits: peers are compared after the onset), at a step that
gives it about ``baseline_points`` samples a series (its medians, shares and rates need no more;
the onset window keeps the fine step). That is less than half the points of one query at the fine
step over both windows and hosts, and the JSON decoded and laid out scales with them.

The answer is read within ``timeout_s`` and ``max_bytes`` (:func:`rankscope.bounded_http.bounded_get`),
its JSON checked; anything else is :class:`SourceUnavailable` naming the server and what went wrong.
"""

from __future__ import annotations

import gc
import json
import math
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from itertools import chain

import numpy as np
import pandas as pd

from analyzer.read.gpu_samples import SourceUnavailable, clean, empty
from rankscope import gpu_health as gh
from rankscope.bounded_http import HttpAuth, HttpFailure, bounded_get
from rankscope.hostnames import HostIndex

#: dcgm-exporter's metric names -> the signal each is read into.
METRICS: dict[str, str] = {
    "DCGM_FI_DEV_SM_CLOCK": gh.SM_CLOCK, "DCGM_FI_DEV_GPU_TEMP": gh.TEMPERATURE,
    "DCGM_FI_DEV_POWER_USAGE": gh.POWER, "DCGM_FI_DEV_GPU_UTIL": gh.UTILIZATION,
    "DCGM_FI_DEV_XID_ERRORS": gh.XID, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": gh.PCIE_REPLAYS,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": gh.ROW_REMAP_FAILURE,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": gh.REMAPPED_ROWS,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": gh.NVLINK_BANDWIDTH,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": gh.REASONS, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": gh.REASONS,
    "DCGM_EXP_CLOCK_EVENTS_COUNT": gh.REASONS,
}
CLOCK_EVENTS_COUNT = "DCGM_EXP_CLOCK_EVENTS_COUNT"
#: Host names as DNS writes them: anything else is not put into a query.
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MAX_LABELS = 64
#: Hosts asked for in one query: 24 hosts of 8 GPUs x 12 metrics x 240 points is ~7 MB of JSON.
HOSTS_PER_QUERY = 24
#: The finest step asked for: the scrape interval of NVIDIA's Prometheus set-up for dcgm-exporter (30 s).
#: A step finer than the scrape interval only repeats samples (Prometheus answers each step with the
#: newest sample of the last 5 minutes) and doubles the points to decode and compare; where a site
#: scrapes every 15 s it leaves out every other sample, which medians and shares over minutes do not need.
MIN_STEP_S = 30
#: Samples a series in the baseline before the onset (30 min at a 120 s step): its median, its
#: share of each reason and its rate, against ``min_samples`` (3) needed.
BASELINE_POINTS = 15
_MAX_TEXT = 1024


class DcgmPrometheus:
    """dcgm-exporter's series of some hosts, from the Prometheus at ``url``."""

    name = "prometheus"

    def __init__(self, url: str, *, auth: HttpAuth | None = None, timeout_s: float = 5.0,
                 max_bytes: int = 16 << 20, host_label: str = "Hostname", selector: str = "",
                 host_map: dict[str, str] | None = None, max_points: int = 240, min_step_s: float = MIN_STEP_S,
                 baseline_points: int = BASELINE_POINTS):
        if not re.match(r"https?://[^/]", url):
            raise ValueError(f"prometheus_url {url!r} is not an http(s) URL (e.g. http://prometheus:9090)")
        if not _LABEL.fullmatch(host_label):
            raise ValueError(f"host_label {host_label!r} is not a Prometheus label name")
        self.url = url.rstrip("/")
        self.auth, self.timeout_s, self.max_bytes = auth, float(timeout_s), int(max_bytes)
        self.host_label, self.selector = host_label, selector.strip().strip("{}").strip()
        self.host_map, self.max_points = dict(host_map or {}), int(max_points)
        self.min_step_s = max(1.0, float(min_step_s))   # a shorter onset window asks for a finer step
        self.baseline_points = max(1, int(baseline_points))
        self.note = ""

    def __repr__(self) -> str:
        return f"DcgmPrometheus({self.url!r}, host_label={self.host_label!r})"

    def names(self, hosts: list[str]) -> list[str]:
        """Every name ``hosts`` are asked for by (names no query can carry are left out)."""
        idx = HostIndex(hosts, self.host_map)
        return sorted({a for h in hosts for a in idx.aliases(h) if _HOST_NAME.fullmatch(a)})

    def query(self, hosts: list[str], signals: frozenset[str] | None = None) -> str:
        """The PromQL selector of the metrics of ``signals`` (default: every one) for ``hosts``."""
        names = self.names(hosts)
        alternatives = "|".join(re.escape(a).replace("\\", "\\\\") for a in names)
        metric = "|".join(n for n, sig in METRICS.items() if signals is None or sig in signals)
        extra = f",{self.selector}" if self.selector else ""
        return (f'{{__name__=~"{metric}",{self.host_label}=~"(?i)({alternatives})(\\\\..+)?(:[0-9]+)?"{extra}}}')

    def steps(self, start_ms: int, end_ms: int, onset_ms: int | None = None) -> list[tuple[int, int, float]]:
        """The ranges asked for and the step of each (s): ``start`` .. ``end`` at the fine step, or,
        with an ``onset_ms`` inside, the baseline before it at :attr:`baseline_points` samples a series
        (never finer than the fine step) and the rest at the fine step."""
        cut = onset_ms if onset_ms is not None and start_ms < onset_ms < end_ms else start_ms
        fine = max(self.min_step_s, math.ceil((end_ms - cut) / 1000 / self.max_points))
        if cut == start_ms:
            return [(start_ms, end_ms, fine)]
        coarse = max(fine, math.ceil((cut - start_ms) / 1000 / self.baseline_points))
        return [(start_ms, cut - 1, coarse), (cut, end_ms, fine)]   # query_range includes its end: no sample twice

    def samples(self, job: str, hosts: list[str], start_ms: int, end_ms: int, *, onset_ms: int | None = None,
                baseline_hosts: frozenset[str] | None = None,
                signals: frozenset[str] | None = None) -> pd.DataFrame:
        """Every sample of ``signals`` of ``hosts`` in ``start_ms`` .. ``end_ms`` (:mod:`analyzer.read.gpu_samples`),
        asked for :data:`HOSTS_PER_QUERY` hosts at a time (each answer stays well inside ``max_bytes``)
        and per range of :meth:`steps`; the baseline range for ``baseline_hosts`` only."""
        self.note = f"no host name a query can carry among {', '.join(hosts[:3])}"
        if not self.names(hosts) or end_ms <= start_ms:
            return empty()
        self.note = f"{self.host_label} matching {', '.join(hosts[:3])}{' ...' if len(hosts) > 3 else ''}"
        ranges = self.steps(start_ms, end_ms, onset_ms)
        asked = [(chunk, lo, hi, step) for n, (lo, hi, step) in enumerate(ranges)
                 for chunk in _chunks(hosts if n + 1 == len(ranges) or baseline_hosts is None
                                      else [h for h in hosts if h in baseline_hosts])
                 if self.names(chunk)]
        # the next answer is on its way while one is parsed: Prometheus works on another core
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="prometheus") as pool:
            bodies = pool.map(lambda a: self._get(a[0], a[1], a[2], a[3], signals), asked)
            parts = [p for (h, *_), body in zip(asked, bodies, strict=True)
                     if len(p := self.parse(body, HostIndex(h, self.host_map)))]
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0] if parts else empty()

    def _get(self, hosts: list[str], start_ms: int, end_ms: int, step: float, signals: frozenset[str] | None) -> bytes:
        try:
            return bounded_get(f"{self.url}/api/v1/query_range",
                               {"query": self.query(hosts, signals), "start": f"{start_ms / 1000:.3f}",
                                "end": f"{end_ms / 1000:.3f}", "step": f"{step:g}"},
                               timeout_s=self.timeout_s, max_bytes=self.max_bytes, auth=self.auth)
        except HttpFailure as exc:
            raise SourceUnavailable(f"Prometheus {exc}") from None

    def parse(self, body: bytes, idx: HostIndex) -> pd.DataFrame:
        """The samples of an answer to :meth:`query`, for the job's hosts of ``idx``: per series the
        labels read once; of duplicate series of one GPU and metric the one with the most points;
        every kept series' points converted at once; one frame at the end, its text columns
        categories (thousands of series a query, hundreds of thousands of points: nothing is done
        per point in Python)."""
        with _no_collection():
            result = _matrix(body, self.url)
            meta: dict[tuple[str, int, str], tuple] = {}   # one series a GPU and metric: the most points
            for i, series in enumerate(result):
                labels, vals = _series(series, i, self.url)
                host = idx.job_host(_label(labels, self.host_label, i, self.url).rsplit(":", 1)[0]
                                    if self.host_label == "instance" else _label(labels, self.host_label, i, self.url))
                name, event = _label(labels, "__name__", i, self.url), _label(labels, "clock_event", i, self.url)
                if host is None or name not in METRICS or not vals:
                    continue
                bit = 0   # a clock-event count stands for its reason's bit while it counts
                if name == CLOCK_EVENTS_COUNT:
                    bit = gh.CLOCK_EVENT_BITS.get(gh.EXPORTER_CLOCK_EVENTS.get(event, ""))
                    if bit is None:
                        continue
                uuid = _label(labels, "UUID", i, self.url) or _label(labels, "uuid", i, self.url)
                gpu = _gpu_index(_label(labels, "gpu", i, self.url))
                seen = meta.get(key := (host, gpu, f"{name}/{event}"))
                if seen is None or len(vals) > len(seen[-1]):
                    meta[key] = (i, host, gpu, uuid, METRICS[name], bit, vals)
            if not meta:
                return empty()
            at, host, gpu, uuid, signal, bit, points = zip(*sorted(meta.values(), key=lambda m: m[0]), strict=True)
            tv = _numbers(list(points), list(at), self.url)
        n = np.fromiter((len(p) for p in points), np.int64, len(points))
        bit = np.repeat(np.asarray(bit, dtype=float), n)
        v = np.where(bit > 0, np.where(tv[:, 1] > 0, bit, np.where(np.isfinite(tv[:, 1]), 0.0, np.nan)), tv[:, 1])
        frame = pd.DataFrame({"host": _repeated(host, n), "gpu": np.repeat(np.asarray(gpu, dtype=np.int64), n),
                              "uuid": _repeated(uuid, n), "signal": _repeated(signal, n)})
        frame["time"], frame["value"] = tv[:, 0] * 1000.0, v
        return clean(frame)


@contextmanager
def _no_collection() -> Iterator[None]:
    """The cyclic garbage collector held off while an answer is decoded: JSON's hundreds of thousands
    of small lists (none of them a cycle) would set off collections that walk every object the
    analyzer holds, about as long as the decoding itself on a busy process."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _chunks(hosts: list[str]) -> list[list[str]]:
    return [hosts[i:i + HOSTS_PER_QUERY] for i in range(0, len(hosts), HOSTS_PER_QUERY)]


def _gpu_index(label: str) -> int:
    """The ``gpu`` label as a device index (-1 where it is none)."""
    return int(label) if label.isascii() and label.isdigit() and len(label) < 6 else -1   # "²".isdigit()


def _repeated(labels: tuple[str, ...], n: np.ndarray) -> pd.Categorical:
    """Each series' label repeated for its points, as a category (no string per point)."""
    codes, names = pd.factorize(np.asarray(labels, dtype=object))
    return pd.Categorical.from_codes(np.repeat(codes, n), categories=pd.Index(names, dtype=object))


def _matrix(body: bytes, url: str) -> list:
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        raise SourceUnavailable(f"Prometheus {url}: the answer is not JSON (not Prometheus' query API?): "
                                f"{body[:60].decode('utf-8', 'replace')!r}") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        err = str(answer.get("error", "no status success"))[:300] if isinstance(answer, dict) else "not an object"
        raise SourceUnavailable(f"Prometheus {url} refused the query: {err}")
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise SourceUnavailable(f"Prometheus {url}: the answer has no data.result matrix")
    return data["result"]


def _series(s: object, i: int, url: str) -> tuple[dict, list]:
    """(labels, its ``[[t, v], ...]``), checked as far as their shape; each pair and label is
    checked where it is used (:func:`_numbers`, :func:`_label`)."""
    metric = s.get("metric") if isinstance(s, dict) else None
    if not isinstance(metric, dict) or len(metric) > _MAX_LABELS:
        raise SourceUnavailable(f"{url}: series {i}: 'metric' is not a set of at most {_MAX_LABELS} text labels")
    values = s.get("values")
    if not isinstance(values, list):
        raise SourceUnavailable(f"{url}: series {i}: 'values' is not a list")
    return metric, values


def _label(labels: dict, name: str, i: int, url: str) -> str:
    """A label read from a series ("" where it has none); one that is no short text is refused."""
    v = labels.get(name, "")
    if not isinstance(v, str) or len(v) > _MAX_TEXT:
        raise SourceUnavailable(f"{url}: series {i}: label {name[:40]!r} is not a text of at most {_MAX_TEXT} characters")
    return v


def _numbers(points: list[list], series: list[int], url: str) -> np.ndarray:
    """Every kept series' ``[time, "value"]`` pairs as one float array (one conversion a query, not
    one a series or point in Python); a series with anything else is refused naming it."""
    total = sum(len(p) for p in points)
    try:
        arr = np.array(list(chain.from_iterable(points)), dtype=object)
        if arr.shape != (total, 2):
            raise ValueError
        return arr.astype(float)
    except (TypeError, ValueError):
        for p, i in zip(points, series, strict=True):   # only on a bad answer: which series
            try:
                if np.array(p, dtype=object).astype(float).shape != (len(p), 2):
                    raise ValueError
            except (TypeError, ValueError):
                raise SourceUnavailable(f"{url}: series {i}: 'values' is not a list of [time, \"value\"] pairs") from None
        raise SourceUnavailable(f"{url}: 'values' are not lists of [time, \"value\"] pairs") from None
