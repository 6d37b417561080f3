"""What an incident report shows, read from the store: the incident record and the
stage latencies around it, as arrays ready to plot (no plotting here)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.frames import LatencyCube, frame_to_cube
from rankscope.incident import Incident
from rankscope.job_steps import segments, step_numbers
from rankscope.store import Store
from rankscope.topology import Topology
from rankscope.topology_inference import infer_topology

#: Most rows a report heatmap draws (a PNG stays legible below this).
MAX_HEATMAP_ROWS = 1000


@dataclass
class IncidentWindow:
    """Stage latencies of every rank around an incident."""

    topology: Topology
    cube: LatencyCube
    restarts: list[dict] | None = None   # job_lifecycle points in the window (restarts, ends)

    @property
    def stages(self) -> list[str]:
        return self.cube.stages

    def after(self, incident: Incident) -> np.ndarray:
        """Mask of the iterations from the onset on (to the resolution when resolved)."""
        it = self.cube.iterations
        mask = it >= incident.onset_iteration
        if incident.resolved_iteration >= 0:
            mask &= it < incident.resolved_iteration
        return mask


def iteration_times_ms(store: Store, incident: Incident) -> tuple[float, float] | None:
    """Iteration time before and after the onset, from the incident's L1 evidence or the
    job's ``l1_changepoint`` nearest to the onset; None when neither says."""
    l1 = incident.evidence.get("l1") if isinstance(incident.evidence, dict) else None
    if isinstance(l1, dict) and l1.get("before_ms") and l1.get("after_ms"):
        return float(l1["before_ms"]), float(l1["after_ms"])
    cps = store.read(schema.L1_CHANGEPOINT, incident.job)
    if len(cps) and {"before_ms", "after_ms"} <= set(cps.columns):
        row = cps.iloc[int(np.argmin(np.abs(cps["time"].to_numpy() - incident.onset_ms)))]
        return float(row["before_ms"]), float(row["after_ms"])
    return None


def load_window(store: Store, incident: Incident, before_iterations: int = 20,
                after_iterations: int = 20, fallback_ms: tuple[int, int] = (2 * 3600_000, 6 * 3600_000)
                ) -> IncidentWindow:
    """The job's stage_latency around the onset: about ``before_iterations`` before it and
    ``after_iterations`` after it (past the resolution when resolved), so a report on a
    long job reads only what it draws. Without iteration times, ``fallback_ms``."""
    times = iteration_times_ms(store, incident)
    if times is None:
        before_ms, after_ms = fallback_ms
    else:
        after_n = after_iterations
        if incident.resolved_iteration >= 0:
            after_n = max(after_n, incident.resolved_iteration - incident.onset_iteration + 5)
        before_ms, after_ms = int(before_iterations * times[0] * 1.2), int(after_n * times[1] * 1.2)
    end = incident.onset_ms + after_ms
    df = store.read_stage_latency(incident.job, incident.onset_ms - before_ms, end)
    if not len(df):
        raise ValueError(f"job {incident.job!r} has no stage_latency around incident {incident.id}")
    # each rank's newest row (the ranks stamp by their own clocks: few share the newest time)
    first = df.sort_values("time", kind="stable").drop_duplicates("rank", keep="last")
    topo = infer_topology(*(first[c].to_numpy() for c in ("rank", "tp", "pp", "dp", "ep_group", "node")))
    stages = [s for s in schema.stage_fields(df.columns) if pd.api.types.is_numeric_dtype(df[s])]
    # after a restart the same iteration numbers run again: the analyzer's steps keep them apart
    life = store.read(schema.JOB_LIFECYCLE, incident.job)
    if len(segments(life)):
        df = df.assign(**{schema.ITERATION_FIELD: step_numbers(df["time"], df[schema.ITERATION_FIELD], life)})
    shown = life[(life["time"] >= incident.onset_ms - before_ms) & (life["time"] <= end)] if len(life) else life
    return IncidentWindow(topo, frame_to_cube(df, topo.world, stages),
                          shown.sort_values("time").to_dict("records") if len(shown) else [])


def rows_around(ranks: np.ndarray, world: int, pad: int) -> np.ndarray:
    """Consecutive ranks from ``pad`` before the lowest to ``pad`` after the highest, inside the world."""
    lo = max(0, int(ranks.min()) - pad)
    hi = min(world - 1, int(ranks.max()) + pad)
    rows = np.arange(lo, hi + 1)
    return rows[:MAX_HEATMAP_ROWS]


def dp_band_rows(topo: Topology, group_ranks: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranks of the group's dp range (plus ``pad`` dp on each side) at EVERY pp stage.

    Returns (ranks, pp of each row, dp of each row), rows ordered pp-major.
    """
    dps = topo.dp_index[group_ranks]
    lo, hi = max(0, int(dps.min()) - pad), min(topo.dp - 1, int(dps.max()) + pad)
    dp = np.arange(lo, hi + 1)
    pp = np.arange(topo.pp)
    pp_grid, dp_grid = np.meshgrid(pp, dp, indexing="ij")
    ranks = np.asarray(topo.rank_of(tp=0, pp=pp_grid.reshape(-1), dp=dp_grid.reshape(-1)))
    keep = slice(0, MAX_HEATMAP_ROWS)
    return ranks[keep], pp_grid.reshape(-1)[keep], dp_grid.reshape(-1)[keep]


def stage_comparison(window: IncidentWindow, incident: Incident) -> pd.DataFrame:
    """Per stage: the culprits' median and their group-mates' median after the onset."""
    after = window.after(incident)
    if not after.any():
        after = np.ones_like(after)
    values = window.cube.values[after]
    ranks = np.asarray(incident.ranks, dtype=np.int64)
    mates = np.setdiff1d(np.asarray(incident.group_ranks, dtype=np.int64), ranks)
    if not mates.size:
        mates = np.setdiff1d(window.topology.ranks, ranks)
    with np.errstate(all="ignore"):
        culprit = np.nanmedian(values[:, ranks, :], axis=(0, 1))
        group = np.nanmedian(values[:, mates, :], axis=(0, 1))
    return pd.DataFrame({"stage": window.stages, "culprit_ms": culprit, "group_ms": group,
                         "ratio": culprit / group})
