"""What an incident report shows, read from the store: the incident record and the
stage latencies around it, as arrays ready to plot (no plotting here)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.frames import LatencyCube, frame_to_cube
from rankscope.store import Store
from rankscope.topology import Topology, infer_topology, parse_ranks

#: Most rows a report heatmap draws (a PNG stays legible below this).
MAX_HEATMAP_ROWS = 1000


@dataclass
class IncidentRecord:
    """One ``incident`` point, with its text fields parsed."""

    id: str
    job: str
    cls: str
    status: str
    title: str
    text: str
    ranks: np.ndarray
    nodes: np.ndarray
    stage: str
    ratio: float
    group_type: str
    group_ranks: np.ndarray
    onset_iteration: int
    resolved_iteration: int
    onset_ms: int
    updated_ms: int
    events: list[dict] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict) -> IncidentRecord:
        def ranks(text: object) -> np.ndarray:
            return parse_ranks(text) if isinstance(text, str) and text.strip() else np.array([], dtype=np.int64)

        def loads(text: object, empty):
            try:
                return json.loads(text) if isinstance(text, str) and text else empty
            except ValueError:
                return empty

        return cls(
            id=str(row["id"]), job=str(row["job"]), cls=str(row.get("class") or ""),
            status=str(row.get("status") or "open"), title=str(row.get("title") or row["id"]),
            text=str(row.get("text") or ""), ranks=ranks(row.get("ranks")), nodes=ranks(row.get("nodes")),
            stage=str(row.get("stage") or ""), ratio=float(row.get("ratio") or 0.0),
            group_type=str(row.get("group_type") or ""), group_ranks=ranks(row.get("group_ranks")),
            onset_iteration=int(row.get("onset_iteration", -1)),
            resolved_iteration=int(row.get("resolved_iteration", -1)), onset_ms=int(row["time"]),
            updated_ms=int(row.get("updated_ms") or 0), events=loads(row.get("events"), []),
            evidence=loads(row.get("evidence"), {}),
        )


def load_incident(store: Store, job: str, incident_id: str | None = None) -> IncidentRecord:
    """The incident ``incident_id`` of ``job``, or its most recent one (latest onset)."""
    df = store.read(schema.INCIDENT, job)
    if not len(df):
        raise ValueError(f"job {job!r} has no incidents in {store!r} (has the analyzer run?)")
    sort = ["time", "updated_ms"] if "updated_ms" in df.columns else ["time"]
    df = df.sort_values(sort, kind="stable").drop_duplicates("id", keep="last")
    if incident_id is not None:
        hit = df[df["id"].astype(str) == incident_id]
        if not len(hit):
            known = ", ".join(df["id"].astype(str).tolist()[-10:])
            raise ValueError(f"job {job!r} has no incident {incident_id!r}; known: {known}")
        return IncidentRecord.from_row(hit.iloc[-1].to_dict())
    return IncidentRecord.from_row(df.iloc[-1].to_dict())


@dataclass
class IncidentWindow:
    """Stage latencies of every rank around an incident."""

    topology: Topology
    cube: LatencyCube

    @property
    def stages(self) -> list[str]:
        return self.cube.stages

    def after(self, incident: IncidentRecord) -> np.ndarray:
        """Mask of the iterations from the onset on (to the resolution when resolved)."""
        it = self.cube.iterations
        mask = it >= incident.onset_iteration
        if incident.resolved_iteration >= 0:
            mask &= it < incident.resolved_iteration
        return mask


def iteration_times_ms(store: Store, incident: IncidentRecord) -> tuple[float, float] | None:
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


def load_window(store: Store, incident: IncidentRecord, before_iterations: int = 20,
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
    first = df[df["time"] == df["time"].max()]
    topo = infer_topology(*(first[c].to_numpy() for c in ("rank", "tp", "pp", "dp", "ep_group", "node")))
    stages = [s for s in schema.stage_fields(df.columns) if pd.api.types.is_numeric_dtype(df[s])]
    return IncidentWindow(topo, frame_to_cube(df, topo.world, stages))


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


def stage_comparison(window: IncidentWindow, incident: IncidentRecord) -> pd.DataFrame:
    """Per stage: the culprits' median and their group-mates' median after the onset."""
    after = window.after(incident)
    if not after.any():
        after = np.ones_like(after)
    values = window.cube.values[after]
    mates = np.setdiff1d(incident.group_ranks, incident.ranks)
    if not mates.size:
        mates = np.setdiff1d(window.topology.ranks, incident.ranks)
    with np.errstate(all="ignore"):
        culprit = np.nanmedian(values[:, incident.ranks, :], axis=(0, 1))
        group = np.nanmedian(values[:, mates, :], axis=(0, 1))
    return pd.DataFrame({"stage": window.stages, "culprit_ms": culprit, "group_ms": group,
                         "ratio": culprit / group})
