"""Evidence of a rank-level incident: how much slower, against which group, and what the
culprits' own collectives did. Shared by the straggler and the transient-stall rules.

Collective times are symptoms (mostly waiting), so the evidence that names a
culprit is a compute or host stage slow against its peers while its own
collectives are SHORT: it arrived last and everybody else waited for it.
"""

from __future__ import annotations

import warnings

import numpy as np

from analyzer.detect.group_scores import group_medians
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.rule import culprit_incident
from analyzer.score.rank_scores import peer_kind
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology, format_ranks, rank_phrase

#: Group kinds that can localise a compute culprit, smallest first (pipeline
#: members do different work, so they are not peers).
LOCAL_KINDS = ("tp", "node", "ep", "dp")


def onset_gap(transient_max: int) -> int:
    """Onsets this close belong to one fault."""
    return transient_max + 1


def split_by_onset_and_place(ranks: np.ndarray, onsets: np.ndarray, gap: int,
                             topo: Topology) -> list[tuple[np.ndarray, np.ndarray]]:
    """Ranks that went slow together (onsets within ``gap``) and sit together (on one node, or no
    more than a node apart in rank) are one fault; the rest are others."""
    order = np.argsort(onsets, kind="stable")
    ranks, onsets = ranks[order], onsets[order]
    cuts = np.flatnonzero(np.diff(onsets) > gap) + 1
    parts = []
    for part_r, part_o in zip(np.split(ranks, cuts), np.split(onsets, cuts), strict=True):
        o = np.argsort(part_r, kind="stable")
        part_r, part_o = part_r[o], part_o[o]
        label = together(part_r, topo)
        for k in np.unique(label):
            parts.append((part_r[label == k], part_o[label == k]))
    return parts


def together(ranks: np.ndarray, topo: Topology) -> np.ndarray:
    """Component label of each of the sorted ``ranks``: ranks are joined when they are at most
    ``gpus_per_node`` apart or on the same node (the real placement need not be contiguous)."""
    label = np.concatenate([[0], np.cumsum(np.diff(ranks) > topo.gpus_per_node)])
    node = topo.node_index[ranks]
    for n in np.unique(node):
        comps = np.unique(label[node == n])
        if len(comps) > 1:
            label[np.isin(label, comps)] = comps[0]
    _, label = np.unique(label, return_inverse=True)
    return label


def new_rank_incident(job: str, cls: IncidentClass, stage: str, ranks: np.ndarray, onsets: np.ndarray,
                      obs: Observation, topo: Topology) -> Incident:
    """An incident for culprit ranks of one stage (evidence still to be written)."""
    onset = int(onsets.min())
    return culprit_incident(job, cls, ranks, topo, onset, obs.window.time_of(onset, obs.time_ms),
                            stage=stage, ratio=1.0, group_type=None, group_ranks=[])


def write_rank_evidence(inc: Incident, obs: Observation, topo: Topology, stages: StageSet,
                        short_ratio: float) -> None:
    """Ratio, localising group, collective behaviour and the L1 context of a rank incident; the
    culprits' collectives count as short (they arrived last) below ``short_ratio`` of their
    group-mates' (``short_collective_ratio`` of :class:`~analyzer.config.AnalyzerConfig`)."""
    win = obs.window
    s = stages.index(inc.stage)
    ranks = np.asarray(inc.ranks, dtype=np.int64)
    since = win.since(inc.onset_iteration, inc.resolved_iteration if inc.resolved_iteration >= 0 else None)
    vals = win.values[since][:, :, s]                       # [T, R]
    peers = peer_kind(topo)
    culprit_ms, group_median_ms = _against_peers(vals, ranks, peers, topo)
    ratio = culprit_ms / group_median_ms if group_median_ms > 0 else float("nan")
    inc.ratio = ratio
    loc_kind, loc_ranks = _localising_group(vals, ranks, culprit_ms, ratio, peers, topo)
    loc_cv = _group_cv(vals[:, loc_ranks])
    inc.group_type, inc.group_ranks = loc_kind, loc_ranks.tolist()
    comm, arrived_last = _collectives(inc, ranks, since, obs, topo, stages, short_ratio)
    summary = _summary(inc, obs, stages, comm, arrived_last, ratio, loc_kind, loc_ranks,
                       culprit_ms, group_median_ms, loc_cv)
    inner = inc.evidence.get("inner")   # a descent into inner groups (inner_groups.py) stays
    inc.evidence = {
        "summary": summary, "stage": inc.stage, "stage_kind": stages[inc.stage].kind,
        "ratio": round(ratio, 3), "culprit_ms": round(culprit_ms, 3),
        "group_median_ms": round(group_median_ms, 3), "peer_group": peers,
        "group": {"type": loc_kind, "id": int(topo.group_ids(loc_kind)[ranks[0]]),
                  "ranks": format_ranks(loc_ranks), "cv": round(loc_cv, 3)},
        "collectives": comm, "arrived_last": arrived_last, "l1": obs.l1_step,
        **({"inner": inner} if inner else {}),
    }


def own_peak_ratio(obs: Observation, ranks: np.ndarray, s: int, onset: int) -> float:
    """The ranks' median time in stage ``s`` at its highest since ``onset``, over their median
    before it (NaN where the window holds no iteration before)."""
    win = obs.window
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        during = np.nanmax(np.nanmedian(win.values[win.since(onset)][:, ranks, s], axis=1))
        usual = np.nanmedian(win.values[win.before(onset)][:, ranks, s])
    return float(during / usual) if np.isfinite(during) and np.isfinite(usual) and usual > 0 else float("nan")


def write_stage_stall_evidence(inc: Incident, peak: float, cost: float, obs: Observation, topo: Topology,
                               stages: StageSet) -> None:
    """The evidence of a whole DP group's stall (:mod:`analyzer.diagnosis.stage_stalls`): no
    peer ran the same work, so its ratio is ``peak``, its own time in the stage at its highest
    against its own before the onset (:func:`own_peak_ratio`), and what it cost the job
    (``cost``: iterations' worth)."""
    ranks = np.asarray(inc.ranks, dtype=np.int64)
    pps = np.unique(topo.pp_index[ranks])
    inc.ratio, inc.group_type, inc.group_ranks = float(peak), "dp", ranks.tolist()
    inc.evidence = {
        "summary": (f"{rank_phrase(ranks.tolist(), capital=True)}, all of pipeline stage pp={format_ranks(pps)} at "
                    f"that TP index, stalled together in {inc.stage}: {peak:.1f}x their own time before, at "
                    f"its peak, for a few iterations, then recovered. No rank stood out in its DP group "
                    f"(the whole group was out): the other pipeline stages showed it; the job lost "
                    f"{cost:.2f} iterations' worth of time to it."),
        "stage": inc.stage, "stage_kind": stages[inc.stage].kind, "ratio": round(float(peak), 3),
        "against": "own_past", "pp": pps.tolist(), "cost_iterations": round(float(cost), 3),
        "group": {"type": "dp", "id": int(topo.group_ids("dp")[ranks[0]]), "ranks": format_ranks(ranks)},
        "l1": obs.l1_step,
    }


def _against_peers(vals: np.ndarray, ranks: np.ndarray, peers: str, topo: Topology) -> tuple[float, float]:
    """The culprits' median time in the stage (``vals``: [T, R]) and their peer groups' median
    with the culprits left out (robust for small groups too)."""
    culprit_ms = float(np.nanmedian(vals[:, ranks]))
    v_wo = vals.copy()
    v_wo[:, ranks] = np.nan
    peer_med = group_medians(v_wo.T, topo.members(peers))   # [G, T]
    gid = topo.group_ids(peers)[ranks]
    return culprit_ms, float(np.nanmedian(peer_med[gid]))


def _localising_group(vals: np.ndarray, ranks: np.ndarray, culprit_ms: float, ratio: float, peers: str,
                      topo: Topology) -> tuple[str, np.ndarray]:
    """The smallest group holding every culprit in which they stand out (the peer group when
    none does): its kind and its ranks."""
    for kind in LOCAL_KINDS:
        if topo.group_size(kind) < 2:
            continue
        members = topo.group_ranks(kind, int(ranks[0]))
        if not np.isin(ranks, members).all() or len(members) <= len(ranks):
            continue
        others = np.setdiff1d(members, ranks)
        med_others = float(np.nanmedian(vals[:, others]))
        if med_others > 0 and culprit_ms / med_others >= 1 + (ratio - 1) / 2:
            return kind, members
    return peers, topo.group_ranks(peers, int(ranks[0]))


def _group_cv(g: np.ndarray) -> float:
    """Median over iterations of the group's coefficient of variation (``g``: [T, members])."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # iterations where the group is silent
        return float(np.nanmedian(np.nanstd(g, axis=1) / np.nanmean(g, axis=1)))


def _summary(inc: Incident, obs: Observation, stages: StageSet, comm: list[dict], arrived_last: bool,
             ratio: float, loc_kind: str, loc_ranks: np.ndarray, culprit_ms: float, group_median_ms: float,
             loc_cv: float) -> str:
    """The incident's one-paragraph explanation."""
    compute_only = stages[inc.stage].kind == "compute"
    ratio_txt = f"{ratio:.1f}x" if np.isfinite(ratio) else "?"
    summary = (f"{rank_phrase(inc.ranks, capital=True)} ({inc.where}) "
               f"{'takes' if len(set(inc.ranks)) == 1 else 'take'} "
               f"{ratio_txt} the time of their "
               f"{loc_kind.upper() if loc_kind in ('ep', 'dp', 'tp') else loc_kind} group "
               f"{format_ranks(loc_ranks)} in {inc.stage}"
               f"{', a compute-only stage' if compute_only else ', a host-side stage'}"
               f" ({culprit_ms:.0f} ms vs {group_median_ms:.0f} ms; group CV {loc_cv:.2f}).")
    if arrived_last:
        ex = next(c for c in comm if c["culprits_short"])
        summary += (f" Their own collectives are short ({ex['stage']} {ex['culprit_ms']:.0f} ms vs "
                    f"{ex['groupmates_ms']:.0f} ms for their group-mates): they arrive last and the "
                    f"group waits for them, so the slowness travels as communication waits.")
    if obs.l1_step:
        summary += (f" Job iteration time {obs.l1_step['before_ms'] / 1000:.1f} s -> "
                    f"{obs.l1_step['after_ms'] / 1000:.1f} s at iteration {obs.l1_step['iteration']}.")
    if inc.cls == IncidentClass.TRANSIENT_STALL:
        summary += f" It lasted {max(1, obs.iteration - inc.onset_iteration)} iteration(s) and passed."
    return summary


def _collectives(inc: Incident, ranks: np.ndarray, since: np.ndarray, obs: Observation, topo: Topology,
                 stages: StageSet, short_ratio: float) -> tuple[list[dict], bool]:
    """Per collective stage: the culprits' time against their group-mates' (now and before the
    onset); whether the culprits' collectives are short (below ``short_ratio`` of their
    group-mates') in most of them (they arrived last)."""
    win = obs.window
    now, before = win.values[since], win.values[win.before(inc.onset_iteration)]
    comm = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # iterations in which nobody reported
        for j, st in enumerate(stages):
            if st.kind != "comm" or topo.group_size(st.group) < 2:
                continue
            groups = np.unique(topo.group_ids(st.group)[ranks])
            mates = np.setdiff1d(topo.members(st.group)[groups].reshape(-1), ranks)
            c_ms = float(np.nanmedian(now[:, ranks, j]))
            m_ms = float(np.nanmedian(now[:, mates, j])) if len(mates) else float("nan")
            m_before = float(np.nanmedian(before[:, mates, j])) if len(mates) and len(before) else float("nan")
            comm.append({"stage": st.name, "group": st.group, "culprit_ms": round(c_ms, 3),
                         "groupmates_ms": round(m_ms, 3), "groupmates_before_ms": round(m_before, 3),
                         "culprits_short": bool(np.isfinite(m_ms) and c_ms < short_ratio * m_ms)})
    short = sum(c["culprits_short"] for c in comm)
    return comm, bool(comm) and short >= max(1, len(comm) // 2)
