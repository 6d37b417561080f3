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

The answer is read within ``timeout_s`` and ``max_bytes`` (:func:`rankscope.bounded_http.bounded_get`),
its JSON checked; anything else is :class:`SourceUnavailable` naming the server and what went wrong.
"""

from __future__ import annotations

import json
import math
import re

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
_MAX_TEXT = 1024


class DcgmPrometheus:
    """dcgm-exporter's series of some hosts, from the Prometheus at ``url``."""

    name = "prometheus"

    def __init__(self, url: str, *, auth: HttpAuth | None = None, timeout_s: float = 5.0,
                 max_bytes: int = 16 << 20, host_label: str = "Hostname", selector: str = "",
                 host_map: dict[str, str] | None = None, max_points: int = 240, min_step_s: float = MIN_STEP_S):
        if not re.match(r"https?://[^/]", url):
            raise ValueError(f"prometheus_url {url!r} is not an http(s) URL (e.g. http://prometheus:9090)")
        if not _LABEL.fullmatch(host_label):
            raise ValueError(f"host_label {host_label!r} is not a Prometheus label name")
        self.url = url.rstrip("/")
        self.auth, self.timeout_s, self.max_bytes = auth, float(timeout_s), int(max_bytes)
        self.host_label, self.selector = host_label, selector.strip().strip("{}").strip()
        self.host_map, self.max_points = dict(host_map or {}), int(max_points)
        self.min_step_s = max(1.0, float(min_step_s))   # a shorter onset window asks for a finer step
        self.note = ""

    def __repr__(self) -> str:
        return f"DcgmPrometheus({self.url!r}, host_label={self.host_label!r})"

    def names(self, hosts: list[str]) -> list[str]:
        """Every name ``hosts`` are asked for by (names no query can carry are left out)."""
        idx = HostIndex(hosts, self.host_map)
        return sorted({a for h in hosts for a in idx.aliases(h) if _HOST_NAME.fullmatch(a)})

    def query(self, hosts: list[str]) -> str:
        """The PromQL selector of every metric for ``hosts``."""
        names = self.names(hosts)
        alternatives = "|".join(re.escape(a).replace("\\", "\\\\") for a in names)
        metric = "|".join(METRICS)
        extra = f",{self.selector}" if self.selector else ""
        return (f'{{__name__=~"{metric}",{self.host_label}=~"(?i)({alternatives})(\\\\..+)?(:[0-9]+)?"{extra}}}')

    def samples(self, job: str, hosts: list[str], start_ms: int, end_ms: int) -> pd.DataFrame:
        """Every sample of ``hosts`` in ``start_ms`` .. ``end_ms`` (:mod:`analyzer.read.gpu_samples`), asked
        for :data:`HOSTS_PER_QUERY` hosts at a time (each answer stays well inside ``max_bytes``)."""
        self.note = f"no host name a query can carry among {', '.join(hosts[:3])}"
        if not self.names(hosts) or end_ms <= start_ms:
            return empty()
        self.note = f"{self.host_label} matching {', '.join(hosts[:3])}{' ...' if len(hosts) > 3 else ''}"
        parts = [self._query(hosts[i:i + HOSTS_PER_QUERY], start_ms, end_ms)
                 for i in range(0, len(hosts), HOSTS_PER_QUERY)]
        parts = [p for p in parts if len(p)]
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0] if parts else empty()

    def _query(self, hosts: list[str], start_ms: int, end_ms: int) -> pd.DataFrame:
        if not self.names(hosts):
            return empty()
        step = max(self.min_step_s, math.ceil((end_ms - start_ms) / 1000 / self.max_points))
        try:
            body = bounded_get(f"{self.url}/api/v1/query_range",
                               {"query": self.query(hosts), "start": f"{start_ms / 1000:.3f}",
                                "end": f"{end_ms / 1000:.3f}", "step": f"{step:g}"},
                               timeout_s=self.timeout_s, max_bytes=self.max_bytes, auth=self.auth)
        except HttpFailure as exc:
            raise SourceUnavailable(f"Prometheus {exc}") from None
        return self.parse(body, HostIndex(hosts, self.host_map))

    def parse(self, body: bytes, idx: HostIndex) -> pd.DataFrame:
        """The samples of an answer to :meth:`query`, for the job's hosts of ``idx``: per series its
        labels once and its points as arrays; of duplicate series of one GPU and metric the one with
        the most points; one frame at the end, its text columns categories (thousands of series a
        query, hundreds of thousands of points: nothing is done per point in Python)."""
        result = _matrix(body, self.url)
        meta, points, where = [], [], []
        for i, series in enumerate(result):
            labels, vals = _series(series, f"{self.url}: series {i}")
            host = idx.job_host(labels.get(self.host_label, "").rsplit(":", 1)[0]
                                if self.host_label == "instance" else labels.get(self.host_label, ""))
            name = labels.get("__name__", "")
            if host is None or name not in METRICS or not len(vals):
                continue
            bit = 0   # a clock-event count stands for its reason's bit while it counts
            if name == CLOCK_EVENTS_COUNT:
                bit = gh.CLOCK_EVENT_BITS.get(gh.EXPORTER_CLOCK_EVENTS.get(labels.get("clock_event", ""), ""))
                if bit is None:
                    continue
            meta.append((host, _gpu_index(labels.get("gpu", "")), labels.get("UUID", labels.get("uuid", "")),
                         METRICS[name], f"{name}/{labels.get('clock_event', '')}", len(vals), len(points), bit))
            points.append(vals)
            where.append(f"{self.url}: series {i}")
        if not meta:
            return empty()
        m = pd.DataFrame(meta, columns=["host", "gpu", "uuid", "signal", "series", "n", "i", "bit"])
        m = m.sort_values(["n", "i"], ascending=[False, True]).drop_duplicates(["host", "gpu", "series"]).sort_values("i")
        n = m["n"].to_numpy()
        tv = _numbers([points[i] for i in m["i"]], [where[i] for i in m["i"]])
        bit = np.repeat(m["bit"].to_numpy(dtype=float), n)
        v = np.where(bit > 0, np.where(tv[:, 1] > 0, bit, np.where(np.isfinite(tv[:, 1]), 0.0, np.nan)), tv[:, 1])
        frame = pd.DataFrame({c: _repeated(m[c], n) for c in ("host", "uuid", "signal")})
        frame.insert(1, "gpu", np.repeat(m["gpu"].to_numpy(dtype=np.int64), n))
        frame["time"], frame["value"] = tv[:, 0] * 1000.0, v
        return clean(frame)


def _gpu_index(label: str) -> int:
    """The ``gpu`` label as a device index (-1 where it is none)."""
    return int(label) if label.isascii() and label.isdigit() and len(label) < 6 else -1   # "²".isdigit()


def _repeated(column: pd.Series, n: np.ndarray) -> pd.Categorical:
    """Each series' label repeated for its points, as a category (no string per point)."""
    codes, names = pd.factorize(column)
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


def _series(s: object, where: str) -> tuple[dict[str, str], np.ndarray]:
    """(labels, its ``[[t, v], ...]`` as an object array, converted later with every series'); a
    malformed one is refused naming it."""
    metric = s.get("metric") if isinstance(s, dict) else None
    if not isinstance(metric, dict) or len(metric) > _MAX_LABELS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 128 and len(v) <= _MAX_TEXT
            for k, v in metric.items()):
        raise SourceUnavailable(f"{where}: 'metric' is not a set of at most {_MAX_LABELS} text labels")
    values = s.get("values")
    if not isinstance(values, list):
        raise SourceUnavailable(f"{where}: 'values' is not a list")
    try:
        arr = np.array(values, dtype=object)
    except ValueError:
        arr = None
    if arr is None or (len(values) and (arr.ndim != 2 or arr.shape[1] != 2)):
        raise SourceUnavailable(f"{where}: 'values' is not a list of [time, \"value\"] pairs")
    return metric, arr.reshape(-1, 2)


def _numbers(points: list[np.ndarray], where: list[str]) -> np.ndarray:
    """Every series' points as floats at once (one conversion a query, not one a point in Python);
    a series whose time or value is no number is refused naming it."""
    try:
        return np.concatenate(points).astype(float)
    except (TypeError, ValueError):
        for p, w in zip(points, where, strict=True):
            try:
                p.astype(float)
            except (TypeError, ValueError):
                raise SourceUnavailable(f"{w}: 'values' is not a list of [time, \"value\"] pairs") from None
        raise
