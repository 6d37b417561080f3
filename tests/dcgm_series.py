"""DCGM-shaped telemetry for the hardware-evidence tests and benchmark: dcgm-exporter's series of a
few small jobs' GPUs written as OpenMetrics text, backfilled into a TSDB with
``promtool tsdb create-blocks-from openmetrics`` and served by a real Prometheus (Debian's
``prometheus``, 2.42) on a free loopback port (:class:`BackfilledPrometheus`).

Each :class:`Job` is ``nodes`` hosts of ``gpus`` GPUs, one of them (``culprit``) showing ``kind``
from ``onset_ms`` on; the others are healthy GPUs under load (SM clock ~1980 MHz, ~62 °C, ~620 W).
``kind``:

- ``thermal``: ~91 °C, SW and HW thermal slowdown (bits 0x20, 0x40), the clock at 60%, less power;
- ``power_brake``: HW power brake (0x80), the clock halved, ~250 W;
- ``clean``: nothing (a slow GPU whose telemetry says nothing);
- ``decoy``: SW power capping (0x4) from the onset on *every* GPU of the job, the culprit's too;
- ``pcie``: the PCIe replay counter climbing ~50/s, reset to 0 half way through the window;
- ``nan``: every value of the culprit host NaN (an exporter that lost its GPUs);
- ``ghost``: no series at all for the culprit host.

``label_host`` says what dcgm-exporter puts in ``Hostname`` for a job's host name (the short name,
an upper-case FQDN, a rack name); ``reasons_metric`` which of field 112's names the job's exporter
uses; ``duplicate``: every series of the culprit host exported twice (a second scrape job with
another ``instance``, fewer samples).
"""

from __future__ import annotations

import shutil
import subprocess
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.alertmanager_server import PrometheusProcess

SAMPLE_S = 60
BEFORE_S, AFTER_S = 40 * 60, 15 * 60
THROTTLE = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"


@dataclass
class Job:
    """One job's hosts and GPUs (see the module doc)."""

    name: str
    kind: str
    onset_ms: int
    nodes: int = 4
    gpus: int = 4
    culprit: int = 2
    reasons_metric: str = THROTTLE
    label_host: Callable[[str], str] = field(default=lambda h: h)
    full_names: bool = False
    duplicate: bool = False

    def hosts(self) -> list[str]:
        """The job's host names (as its ranks report them)."""
        suffix = ".dc1.example.com" if self.full_names else ""
        return [f"{self.name}-node-{n:02d}{suffix}" for n in range(self.nodes)]

    def uuid(self, node: int, gpu: int) -> str:
        return f"GPU-{zlib.crc32(f'{self.name}/{node}'.encode()):08x}-{gpu:04d}"


def levels(job: Job, culprit: bool, t: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per dcgm-exporter metric, one GPU's values at times ``t`` (ms)."""
    n = len(t)
    after = t >= job.onset_ms
    v = {"DCGM_FI_DEV_SM_CLOCK": rng.normal(1980, 10, n), "DCGM_FI_DEV_GPU_TEMP": rng.normal(62, 2, n),
         "DCGM_FI_DEV_POWER_USAGE": rng.normal(620, 15, n), job.reasons_metric: np.zeros(n),
         "DCGM_FI_DEV_XID_ERRORS": np.zeros(n), "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": np.cumsum(rng.random(n) < 0.05)}
    if job.kind == "decoy":
        v[job.reasons_metric] = np.where(after, 4.0, 0.0)
    if not culprit:
        return v
    if job.kind == "thermal":
        v["DCGM_FI_DEV_GPU_TEMP"][after] = rng.normal(91, 1, after.sum())
        v["DCGM_FI_DEV_SM_CLOCK"][after] *= 0.6
        v["DCGM_FI_DEV_POWER_USAGE"][after] *= 0.75
        v[job.reasons_metric][after] = 0x20 | 0x40
    elif job.kind == "power_brake":
        v["DCGM_FI_DEV_SM_CLOCK"][after] *= 0.5
        v["DCGM_FI_DEV_POWER_USAGE"][after] = rng.normal(250, 5, after.sum())
        v[job.reasons_metric][after] = 0x80
    elif job.kind == "pcie":
        climb = np.cumsum(np.where(after, 50.0 * SAMPLE_S, 0.0)) + v["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]
        reset = job.onset_ms + AFTER_S * 500
        climb[t >= reset] -= climb[t >= reset][0]   # the exporter restarted: the counter starts at 0 again
        v["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] = climb
    elif job.kind == "nan":
        v = {k: np.full(n, np.nan) for k in v}
    return v


def _value(x: float) -> str:
    return "NaN" if not np.isfinite(x) else repr(float(x))


def sample_times(job: Job) -> np.ndarray:
    """The sample times (ms) of every series of ``job``."""
    return np.arange(job.onset_ms - BEFORE_S * 1000, job.onset_ms + AFTER_S * 1000 + 1, SAMPLE_S * 1000)


def series_lines(job: Job) -> dict[str, list[str]]:
    """Per metric, the OpenMetrics sample lines of ``job``'s GPUs."""
    t = sample_times(job)
    rng = np.random.default_rng(zlib.crc32(job.name.encode()))
    out: dict[str, list[str]] = {}
    for node, host in enumerate(job.hosts()):
        culprit = node == job.culprit
        if culprit and job.kind == "ghost":
            continue
        for gpu in range(job.gpus):
            copies = [("dcgm", t)] + ([("dcgm-ha", t[::2])] if culprit and job.duplicate else [])
            values = levels(job, culprit, t, rng)
            for scrape_job, times in copies:
                labels = (f'gpu="{gpu}",UUID="{job.uuid(node, gpu)}",Hostname="{job.label_host(host)}",'
                          f'instance="{job.label_host(host)}:9400",job="{scrape_job}",modelName="NVIDIA H100 80GB HBM3"')
                keep = np.isin(t, times)
                for metric, v in values.items():
                    out.setdefault(metric, []).extend(
                        f"{metric}{{{labels}}} {_value(x)} {ts / 1000:.3f}" for x, ts in zip(v[keep], times, strict=True))
    return out


def openmetrics(jobs: list[Job]) -> str:
    """The OpenMetrics text of every job (one family after the other, ``# EOF`` last)."""
    families: dict[str, list[str]] = {}
    for job in jobs:
        for metric, lines in series_lines(job).items():
            families.setdefault(metric, []).extend(lines)
    text = []
    for metric, lines in families.items():
        text.append(f"# TYPE {metric} gauge")
        text.extend(lines)
    return "\n".join(text) + "\n# EOF\n"


def backfill(text: str, tsdb: Path) -> None:
    """``promtool tsdb create-blocks-from openmetrics`` of ``text`` into ``tsdb``."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("promtool not found: install Debian's 'prometheus' package (make test does: make prometheus)")
    tsdb.mkdir(parents=True, exist_ok=True)
    src = tsdb.parent / "dcgm.om"
    src.write_text(text)
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(src), str(tsdb)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed ({done.returncode}): {done.stderr[-2000:]}")


NO_SCRAPES = "global:\n  scrape_interval: 1h\nscrape_configs: []\n"


class BackfilledPrometheus(PrometheusProcess):
    """A real Prometheus over a TSDB backfilled with ``jobs``' series (nothing scraped)."""

    def __init__(self, jobs: list[Job], root: Path) -> None:
        super().__init__(NO_SCRAPES, root, ("--storage.tsdb.retention.time=30d", "--log.level=warn"))
        backfill(openmetrics(jobs), root / "tsdb")
