"""What the GPUs' own telemetry shows in a run (``gpu_health``, as the collector's NVML sampler writes
it): for a fault with ``telemetry`` set, its ranks' GPUs and those of the nodes they are compared
with (:func:`rankscope.gpu_health.peer_nodes`), :data:`SAMPLES` samples an iteration.

Healthy GPUs under load: SM clock ~1980 MHz, ~62 °C, ~620 W, and SW power capping now and then on
every GPU (in :data:`POWER_CAP_SHARE` of the samples: a decoy every GPU shows, never a fault).
While the fault is active its GPUs show what ``telemetry`` says:

- ``thermal``: ~91 °C, HW and SW thermal slowdown, the clock at 60%, less power;
- ``power_brake``: HW power brake, the clock halved, ~250 W;
- ``hw_slowdown``: HW slowdown, the clock halved;
- ``pcie_replays``: the PCIe replay counter climbing at ~50/s;
- ``xid_<code>``: that XID (e.g. ``xid_48``) at the fault's start and now and then after;
- ``ecc``: double-bit ECC errors counted;
- ``clean``: nothing (a slow GPU whose telemetry says nothing).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rankscope import gpu_health as gh
from rankscope.gpu_health import peer_nodes
from rankscope.stage_rows import LOCAL_GPU, stage_rows
from rankscope.topology import Topology

TELEMETRY = ("thermal", "power_brake", "hw_slowdown", "pcie_replays", "ecc", "clean")
SAMPLES = 2
POWER_CAP_SHARE = 0.3
PEER_NODES = 12


def valid_telemetry(name: str) -> bool:
    if name in TELEMETRY:
        return True
    return name.startswith("xid_") and name[4:].isdigit() and 0 < int(name[4:]) < 1000


def health_ranks(topo: Topology, faults) -> np.ndarray:
    """The ranks whose GPUs the run's telemetry covers (empty: no fault has ``telemetry``)."""
    bad = [f for f in faults if getattr(f, "telemetry", "")]
    if not bad:
        return np.zeros(0, dtype=np.int64)
    culprit_nodes = np.unique(topo.node_index[np.concatenate([f.ranks for f in bad])])
    nodes = np.union1d(culprit_nodes, peer_nodes(culprit_nodes, topo.nodes, PEER_NODES))
    return np.flatnonzero(np.isin(topo.node_index, nodes))


def health_frame(job: str, topo: Topology, faults, ranks: np.ndarray, iteration: int, time_ms: int,
                 iteration_ms: float, seed: int, counters: dict[str, np.ndarray]) -> pd.DataFrame:
    """``gpu_health`` points of ``ranks`` for one iteration (``counters``: their running totals)."""
    rng = np.random.default_rng([seed, 11, iteration])
    n, k = len(ranks), SAMPLES
    shape = (k, n)
    clock = rng.normal(1980, 10, shape)
    temp = rng.normal(62, 2.5, shape)
    power = rng.normal(620, 20, shape)
    reasons = np.where(rng.random(shape) < POWER_CAP_SHARE, gh.CLOCK_EVENT_BITS["sw_power_cap"], 0)
    xid = np.zeros(shape, dtype=np.int64)
    inc = {name: np.zeros(shape, dtype=np.int64) for name in (gh.PCIE_REPLAYS, gh.ECC_DBE)}
    inc[gh.PCIE_REPLAYS] += rng.random(shape) < 0.02
    dt_s = max(iteration_ms, 1.0) / 1000 / k
    for f in faults:
        kind = getattr(f, "telemetry", "")
        if not kind or not f.active(iteration):
            continue
        on = np.broadcast_to(np.isin(ranks, f.ranks), shape)
        _fault_shows(kind, on, rng, clock, temp, power, reasons, xid, inc, dt_s, first=iteration == f.start)
    rows = []
    for s in range(k):
        for name, step in inc.items():
            counters[name] = counters.get(name, np.zeros(n, dtype=np.int64)) + step[s]
        t = int(time_ms - (k - 1 - s) * iteration_ms / k)
        frame = stage_rows(job, ranks, iteration, t, {}, topo=topo, gpu=LOCAL_GPU)
        rows.append(frame.drop(columns=["iteration"], errors="ignore").assign(**{
            gh.REASONS: reasons[s].astype(np.int64), gh.SM_CLOCK: np.round(clock[s], 0),
            gh.TEMPERATURE: np.round(temp[s], 1), gh.POWER: np.round(power[s], 1), gh.XID: xid[s],
            gh.PCIE_REPLAYS: counters[gh.PCIE_REPLAYS].copy(), gh.ECC_DBE: counters[gh.ECC_DBE].copy(),
            gh.REMAPPED_ROWS: np.zeros(n, dtype=np.int64), gh.ROW_REMAP_FAILURE: np.zeros(n, dtype=np.int64)}))
    return pd.concat(rows, ignore_index=True)


def _fault_shows(kind, on, rng, clock, temp, power, reasons, xid, inc, dt_s, first) -> None:
    """Write what a faulty GPU shows into the sample arrays, where ``on``."""
    bits = gh.CLOCK_EVENT_BITS
    p = rng.random(on.shape)
    if kind == "thermal":
        temp[on] = rng.normal(91, 1.5, on.shape)[on]
        clock[on] *= 0.6
        power[on] *= 0.75
        reasons[on & (p < 0.9)] |= bits["hw_thermal_slowdown"]
        reasons[on & (p < 0.7)] |= bits["sw_thermal_slowdown"]
    elif kind == "power_brake":
        clock[on] *= 0.5
        power[on] = rng.normal(250, 10, on.shape)[on]
        reasons[on & (p < 0.9)] |= bits["hw_power_brake"]
    elif kind == "hw_slowdown":
        clock[on] *= 0.5
        reasons[on & (p < 0.9)] |= bits["hw_slowdown"]
    elif kind == "pcie_replays":
        inc[gh.PCIE_REPLAYS][on] += rng.poisson(50 * dt_s, on.shape)[on]
    elif kind == "ecc":
        inc[gh.ECC_DBE][on & (p < 0.3)] += 1
    elif kind.startswith("xid_"):
        hit = on & ((p < 0.2) | first)
        xid[hit] = int(kind[4:])
