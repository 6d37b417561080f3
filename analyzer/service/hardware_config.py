"""The ``[hardware]`` table of the ``--config`` file: where the GPUs' telemetry is and how the culprit
GPUs are compared, every value checked (type, range, unknown keys with the nearest known name).

::

    [hardware]
    prometheus_url = "http://prometheus:9090"   # or env RANKSCOPE_PROMETHEUS_URL, or --prometheus
    host_label = "Hostname"                      # the label dcgm-exporter puts the host in
    nvidia_smi_database = "telegraf"             # Telegraf's nvidia_smi on the store's InfluxDB
    [hardware.host_map]                          # the job's host name -> monitoring's
    "gpu-node-01294" = "rack12-u07"

The URL's precedence: ``--prometheus``, then ``RANKSCOPE_PROMETHEUS_URL``, then the file. Bearer or
basic credentials come from the environment only: ``RANKSCOPE_PROMETHEUS_TOKEN``, or
``RANKSCOPE_PROMETHEUS_USERNAME`` and ``RANKSCOPE_PROMETHEUS_PASSWORD``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from analyzer.score.gpu_signals import SignalRules

URL_ENV = "RANKSCOPE_PROMETHEUS_URL"
AUTH_PREFIX = "RANKSCOPE_PROMETHEUS"


@dataclass(frozen=True)
class HardwareSettings:
    """Where the telemetry is, the windows compared, and the bounds of a cycle's queries."""

    prometheus_url: str | None = None
    prometheus_timeout_s: float = 5.0     # one query's whole answer
    prometheus_max_mb: float = 16.0       # the largest answer read
    host_label: str = "Hostname"
    selector: str = ""                    # more PromQL matchers, e.g. cluster="a"
    nvidia_smi_database: str | None = None
    nvidia_smi_measurement: str = "nvidia_smi"
    gpu_health: bool = True               # the store's own gpu_health (collector, simulator)
    host_map: dict[str, str] = field(default_factory=dict)
    baseline_s: float = 1800.0            # the window before the onset a GPU is compared with
    window_s: float = 600.0               # the window after the onset
    lag_s: float = 60.0                   # telemetry is complete this long after its time
    refresh_s: float = 120.0              # an open incident's evidence is read again this often
    peer_hosts: int = 12                  # the job's other hosts compared with
    max_culprit_hosts: int = 8            # an incident naming more hosts is not checked
    max_checks: int = 100                 # incidents checked per job and cycle (the rest next cycle)
    max_points: int = 240                 # samples per series and query
    baseline_points: int = 15             # samples per series in the baseline (Prometheus: its own, coarser step)
    rules: SignalRules = field(default_factory=SignalRules)


_RANGES: dict[str, tuple[float, float]] = {
    "prometheus_timeout_s": (0.1, 120), "prometheus_max_mb": (0.1, 1024), "baseline_s": (60, 7 * 86400),
    "window_s": (30, 86400), "lag_s": (0, 3600), "refresh_s": (0, 86400), "peer_hosts": (0, 256),
    "max_culprit_hosts": (1, 256), "max_checks": (1, 10_000), "max_points": (10, 11_000), "baseline_points": (3, 11_000),
    "min_share_gap": (0.01, 1), "clock_drop": (0.01, 0.99), "temp_rise_c": (0.5, 100), "power_change": (0.01, 0.99),
    "rate_ratio": (1.01, 1e6), "min_rate": (0, 1e9), "nvlink_drop": (0.01, 0.99), "min_samples": (1, 10_000),
    "peer_share": (0.01, 1),
}
_INTS = {"peer_hosts", "max_culprit_hosts", "max_checks", "max_points", "baseline_points", "min_samples"}
_TEXTS = {"prometheus_url", "host_label", "selector", "nvidia_smi_database", "nvidia_smi_measurement"}
_RULES = {f.name for f in dataclasses.fields(SignalRules)}
KEYS = sorted({f.name for f in dataclasses.fields(HardwareSettings)} - {"rules"} | _RULES)


def _check(key: str, value: Any) -> str | None:
    """What is wrong with one value (None: nothing)."""
    if key in _TEXTS:
        return None if isinstance(value, str) and value.strip() else "not a non-empty string"
    if key == "gpu_health":
        return None if isinstance(value, bool) else "not true or false"
    if key == "host_map":
        ok = isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) and v for k, v in value.items())
        return None if ok else "not a table of host name = \"monitoring's name\""
    lo, hi = _RANGES[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or (key in _INTS and not isinstance(value, int)):
        return f"not {'an integer' if key in _INTS else 'a number'} in [{lo:g}, {hi:g}]"
    if not math.isfinite(value) or not lo <= value <= hi:
        return f"not a finite number in [{lo:g}, {hi:g}]"
    return None


def hardware_settings(table: Mapping[str, Any], env: Mapping[str, str],
                      prometheus_url: str | None = None) -> HardwareSettings:
    """The settings of a ``[hardware]`` table; ValueError naming every bad key and why."""
    errors = []
    for key, value in table.items():
        if key not in KEYS:
            near = difflib.get_close_matches(key, KEYS, 1)
            errors.append(f"[hardware] {key}: unknown key" + (f" (did you mean {near[0]}?)" if near else ""))
        elif (why := _check(key, value)) is not None:
            errors.append(f"[hardware] {key} = {value!r}: {why}")
    url = prometheus_url or env.get(URL_ENV) or table.get("prometheus_url")
    if isinstance(url, str) and url and not url.startswith(("http://", "https://")):
        errors.append(f"prometheus URL {url!r} is not http:// or https:// (e.g. http://prometheus:9090)")
    if errors:
        raise ValueError("; ".join(errors))
    rules = SignalRules(**{k: v for k, v in table.items() if k in _RULES})
    plain = {k: v for k, v in table.items() if k not in _RULES and k != "prometheus_url"}
    return HardwareSettings(prometheus_url=url or None, rules=rules, **plain)
