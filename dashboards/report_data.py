"""What an incident report shows, read from the store: the incident record and the
stage latencies around it, as arrays ready to plot, and the culprit GPUs' hardware
evidence as table rows and bars (:func:`hardware_view`); no plotting here."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rankscope import gpu_health as gh
from rankscope import schema
from rankscope.frames import LatencyCube, frame_to_cube
from rankscope.incident import Incident
from rankscope.job_steps import segments, step_numbers
from rankscope.store import Store
from rankscope.topology import Topology, format_ranks
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


# ------------------------------------------------------------------ hardware evidence
#: The levels every culprit GPU's record holds, as the report names them: (record key, label, unit).
HARDWARE_LEVELS = tuple((name, label, unit) for name, (label, unit) in gh.LEVEL_NAMES.items())
#: Verdicts whose record compares culprit GPUs with their peers (the others have a summary only).
COMPARED_VERDICTS = ("hardware_fault", "no_hardware_signal")
#: Most culprit GPUs a hardware figure draws (the table lists them all).
MAX_HARDWARE_GPUS = 16


@dataclass
class HardwareView:
    """What the report shows of an incident's ``hardware`` record
    (:mod:`analyzer.diagnosis.hardware_verdict`): empty ``verdict`` when there is none."""

    verdict: str = ""
    source: str = ""
    summary: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    checked: str = ""
    final: bool | None = None                        # None: the record does not say
    peer_gpus: int = 0
    gpus: list[dict] = field(default_factory=list)   # the record's culprit GPU entries (compared verdicts only)
    rows: list[dict] = field(default_factory=list)   # one table row per culprit GPU

    @property
    def compared(self) -> bool:
        """The record compares culprit GPUs with their peers (a table and a figure)."""
        return self.verdict in COMPARED_VERDICTS and bool(self.gpus)


def _num(x: object) -> float | None:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def _cell(x: object) -> str:
    v = _num(x)
    return "–" if v is None else f"{v:.0f}" if abs(v) >= 10 else f"{v:.3g}"


def _share(x: object) -> str:
    v = _num(x)
    return "?" if v is None else f"{100 * v:.0f}%"


def signal_text(s: dict) -> str:
    """One signal of a culprit GPU in words: ``hw_thermal_slowdown 0% → 100% of samples (peers 0%)``."""
    name = str(s.get("signal", "?"))
    if "share_after" in s:
        return f"{name} {_share(s.get('share_before'))} → {_share(s.get('share_after'))} of samples " \
               f"(peers {_share(s.get('share_peers'))})"
    if "samples_after" in s:
        xids = "; ".join(f"XID {x.get('code')}: {x.get('meaning')}" for x in s.get("xids") or [] if isinstance(x, dict))
        return f"{name} in {s.get('samples_after')} samples after the onset ({s.get('samples_before')} before; " \
               f"peers {_share(s.get('share_peers'))})" + (f": {xids}" if xids else "")
    return f"{name} {_cell(s.get('before'))} → {_cell(s.get('after'))} (peers {_cell(s.get('peers'))})"


def gpu_label(entry: dict, hosts: int) -> str:
    """``GPU 3`` (one host) or ``host:3``."""
    gpu = entry.get("gpu")
    index = "?" if gpu is None else str(gpu)
    return f"GPU {index}" if hosts <= 1 else f"{entry.get('host', '?')}:{index}"


def hardware_view(hw: dict) -> HardwareView:
    """The report's view of a ``hardware`` record (tolerant of missing or odd fields)."""
    if not isinstance(hw, dict) or not hw.get("verdict"):
        return HardwareView()
    entries = [e for e in hw.get("gpus") or [] if isinstance(e, dict)]
    view = HardwareView(verdict=str(hw["verdict"]), source=str(hw.get("source") or ""),
                        summary=str(hw.get("summary") or ""),
                        sources={str(k): str(v) for k, v in (hw.get("sources") or {}).items()}
                        if isinstance(hw.get("sources"), dict) else {},
                        checked=str(hw.get("checked") or ""),
                        final=None if "final" not in hw else bool(hw["final"]),
                        peer_gpus=int(_num(hw.get("peer_gpus")) or 0))
    if view.verdict not in COMPARED_VERDICTS:
        return view
    view.gpus = entries
    for e in entries:
        signals = [s for s in e.get("signals") or [] if isinstance(s, dict)]
        levels = {key: e.get(key) if isinstance(e.get(key), dict) else {} for key, _, _ in HARDWARE_LEVELS}
        view.rows.append({
            "host": str(e.get("host") or "?"), "gpu": "?" if e.get("gpu") is None else str(e["gpu"]),
            "uuid": str(e.get("uuid") or "–"), "ranks": format_ranks(e.get("ranks") or []) or "–",
            "signals": [signal_text(s) for s in signals],
            "context": [str(c) for c in e.get("context") or []],
            "levels": [[_cell(levels[key].get(p)) for p in ("before", "after", "peers")] for key, _, _ in HARDWARE_LEVELS]})
    return view


def hardware_levels(view: HardwareView) -> list[tuple[str, str, list[tuple[str, float | None, float | None, float | None]]]]:
    """Per level the culprit GPUs show (SM clock, temperature, power, then the rates and levels
    of their signals, e.g. PCIe replays): ``(label, unit, [(gpu, before, after, peers)])``, at
    most :data:`MAX_HARDWARE_GPUS` GPUs each."""
    entries = view.gpus[:MAX_HARDWARE_GPUS]
    hosts = len({e.get("host") for e in view.gpus})
    out = []
    for key, label, unit in HARDWARE_LEVELS:
        bars = [(gpu_label(e, hosts), *(_num(e[key].get(p)) for p in ("before", "after", "peers")))
                for e in entries if isinstance(e.get(key), dict)]
        if any(v is not None for b in bars for v in b[1:]):
            out.append((label, unit, bars))
    drawn = {key for key, _, _ in HARDWARE_LEVELS}
    others = sorted({str(s.get("signal")) for e in entries for s in e.get("signals") or []
                     if isinstance(s, dict) and "after" in s and s.get("signal") not in drawn})
    for name in others:
        bars = [(gpu_label(e, hosts), *(_num(s.get(p)) for p in ("before", "after", "peers")))
                for e in entries for s in e.get("signals") or [] if isinstance(s, dict) and s.get("signal") == name]
        out.append((name.replace("_", " "), "", bars))
    return out


def hardware_shares(view: HardwareView) -> list[tuple[str, float | None, float | None, float | None]]:
    """Per clock-event reason among the culprit GPUs' signals: the median over the GPUs that show
    it of ``share_before``, ``share_after`` and ``share_peers``."""
    found: dict[str, list[dict]] = {}
    for e in view.gpus:
        for s in e.get("signals") or []:
            if isinstance(s, dict) and "share_after" in s:
                found.setdefault(str(s.get("signal")), []).append(s)

    def med(rows: list[dict], key: str) -> float | None:
        vals = [v for v in (_num(r.get(key)) for r in rows) if v is not None]
        return float(np.median(vals)) if vals else None

    return [(name, med(rows, "share_before"), med(rows, "share_after"), med(rows, "share_peers"))
            for name, rows in found.items()]
