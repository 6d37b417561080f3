"""Descent into inner groups: which member of a group that looks slow from outside is slow.

When the members of an inner group (a TP group, or the GPUs of one host that share an NVLink
communicator) all wait for one member at their inner collective, all of them leave it late
together, so all of them arrive late at the outer collectives (the data-parallel all-reduce,
the EP all-to-all) and all of them look slow from outside; where a collector times a region
that holds the inner collective (a layer whose TP all-reduces sit inside it), their compute
looks slow too. The inner collective says which one it is: every member ends it together, so
the one that arrived last *waits least* there, and the others' waits are its lateness.

:func:`descend` takes the ranks a rule found and, for every group of a collective stage of
which at least half the members are among them (innermost kind first), names only the members
whose time in that stage is

- below ``arrival_short_ratio`` of the median of their group-mates', by ``arrival_min_gap_ms`` at least,
- and whose lead over their mates rose since the onset by at least :data:`EXPLAINS` of the
  mates' own excess (how much slower they look from outside): the mates' slowness is mostly
  their wait for it. A whole node slowed alike leaves tiny leads (only jitter) against a large
  excess, so its members all stay named;

a minority of the group (half of it at most); the others of such a group that the rule found
become the ranks that *waited* (held by the incident, not named) when their wait there rose by
:data:`WAITED_SHARE` of their own excess at least (else they are slow on their own, and named). Vectorised over the groups of each kind.

Example (a TP group of 4 whose rank 2 is slow; all four look 10 ms slower from outside)::

    >>> import numpy as np
    >>> from analyzer.config import AnalyzerConfig
    >>> from rankscope.schema import Stage, StageSet
    >>> from rankscope.topology import Topology
    >>> topo, stages = Topology(tp=4, dp=4, gpus_per_node=4), StageSet((Stage("tp_comm", "comm", "tp"),))
    >>> before, now = np.full((3, 16, 1), 0.5), np.full((3, 16, 1), 10.5)
    >>> now[:, 2] = 0.4                                # it waits for nobody; its mates wait 10 ms
    >>> d = descend(np.arange(4), now, before, np.full(16, 10.0), topo, stages, AnalyzerConfig())
    >>> d.ranks.tolist(), d.waited.tolist()
    ([2], [0, 1, 3])
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.node_culprits import complete_nodes
from analyzer.diagnosis.observation import Observation
from rankscope.incident import Incident
from rankscope.schema import StageSet
from rankscope.topology import Topology, format_ranks

#: Share of the mates' excess (how much slower they look from outside) their wait for the
#: named member must explain.
EXPLAINS = 0.25
#: Share of its own excess a found member's wait must have risen by to be a waiter, not a culprit.
WAITED_SHARE = 0.5


@dataclass(frozen=True)
class Descent:
    """The culprits named (``ranks``), the ranks of their inner groups that only waited for
    them (``waited``), and per group descended into, what says so (``groups``)."""

    ranks: np.ndarray
    waited: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    groups: list[dict] = field(default_factory=list)


def _mates_median(v: np.ndarray) -> np.ndarray:
    """Per member of each group (``v``: [G, k]), the median of the other members."""
    k = v.shape[1]
    others = np.where(np.eye(k, dtype=bool)[None], np.nan, v[:, None, :])   # [G, k, k]
    return np.nanmedian(others, axis=2)


def _named(now: np.ndarray, before: np.ndarray, excess: np.ndarray, cfg: AnalyzerConfig) -> np.ndarray:
    """Bool [G, k]: the members the others waited for (see the module's doc)."""
    mates_now, mates_before = _mates_median(now), _mates_median(before)
    lead = mates_now - now
    rise = lead - np.nan_to_num(mates_before - before, nan=0.0)
    explains = EXPLAINS * np.nan_to_num(_mates_median(excess), nan=0.0)
    short = ((now < cfg.arrival_short_ratio * mates_now) & (lead >= cfg.arrival_min_gap_ms)
             & (rise >= np.maximum(cfg.arrival_min_gap_ms, explains)))
    few = short.any(axis=1) & (2 * short.sum(axis=1) <= now.shape[1])
    return short & few[:, None]


def descend(ranks: np.ndarray, now: np.ndarray, before: np.ndarray, excess: np.ndarray, topo: Topology,
            stages: StageSet, cfg: AnalyzerConfig) -> Descent:
    """The members of ``ranks``' inner groups that the others waited for (module doc).

    ``now`` and ``before``: values ``[T, R, S]`` since the onset and before it (``before`` may
    have no iteration); ``excess``: per rank (``[R]``, ms, NaN where unknown) how much slower it
    looks from outside in the stage that named it."""
    ranks = np.unique(np.asarray(ranks, dtype=np.int64))
    comm = [(j, st) for j, st in enumerate(stages) if st.kind == "comm" and topo.group_size(st.group) > 1]
    comm.sort(key=lambda c: topo.group_size(c[1].group))
    if len(ranks) < 2 or not comm or not len(now):
        return Descent(ranks)
    waited, groups = np.empty(0, np.int64), []
    for j, st in comm:
        in_r = np.zeros(topo.world, dtype=bool)
        in_r[ranks] = True
        members = topo.members(st.group)
        cand = np.unique(topo.group_ids(st.group)[ranks])
        cand = cand[2 * in_r[members[cand]].sum(axis=1) >= members.shape[1]]
        if not len(cand):
            continue
        m = members[cand]                                            # [C, k]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            v_now = np.nanmedian(now[:, m, j], axis=0)
            v_before = np.nanmedian(before[:, m, j], axis=0) if len(before) else np.full(m.shape, np.nan)
            named = _named(v_now, v_before, excess[m], cfg)
        hit = named.any(axis=1)
        if not hit.any():
            continue
        # a member found slow that is not named is only a waiter when its wait there rose by a
        # good part of how much slower it looks: one slow on its own (half a slow node in an EP
        # group, say, that arrived a little before the node's last) stays named
        rise = v_now - np.nan_to_num(v_before, nan=0.0)
        keep = named | (in_r[m] & ~(rise >= WAITED_SHARE * np.nan_to_num(excess[m], nan=0.0)))
        for c in np.flatnonzero(hit):
            groups.append(_group_record(st.name, st.group, m[c], keep[c], v_now[c], v_before[c]))
        inside = m[hit].reshape(-1)
        waited = np.union1d(waited, np.setdiff1d(inside[in_r[inside]], m[hit][keep[hit]]))
        ranks = np.union1d(np.setdiff1d(ranks, inside), m[hit][keep[hit]])
    return Descent(ranks, np.setdiff1d(waited, ranks), groups)


def _group_record(stage: str, kind: str, members: np.ndarray, named: np.ndarray, now: np.ndarray,
                  before: np.ndarray) -> dict:
    """What the evidence keeps of one group descended into."""
    def ms(x: np.ndarray) -> float | None:
        v = float(np.nanmedian(x)) if np.isfinite(x).any() else float("nan")
        return round(v, 3) if np.isfinite(v) else None

    return {"stage": stage, "kind": kind, "group_ranks": format_ranks(members),
            "named": [int(r) for r in members[named]], "named_ms": ms(now[named]),
            "waited_ms": ms(now[~named]), "named_before_ms": ms(before[named]),
            "waited_before_ms": ms(before[~named])}


def note_descent(inc: Incident, d: Descent) -> None:
    """Keep in the incident's evidence the ranks that waited (never named as culprits, kept out
    of its what-if's drift) and a sentence saying why the descent names whom it names."""
    if not d.groups:
        return
    waited = np.union1d(inc.waiting_ranks, d.waited).astype(np.int64)
    inc.evidence["inner"] = {"waited": format_ranks(waited), "groups": d.groups}
    g = d.groups[0]
    more = f" (and {len(d.groups) - 1} more such group(s))" if len(d.groups) > 1 else ""
    sentence = (f" Inside {g['kind'].upper()} group {g['group_ranks']}{more} the others waited for "
                f"rank(s) {format_ranks(g['named'])} in {g['stage']} ({g['waited_ms']} ms vs {g['named_ms']} ms "
                f"for {'it' if len(g['named']) == 1 else 'them'}; {g['waited_before_ms']} vs "
                f"{g['named_before_ms']} ms before): it arrived last there, so the whole group arrives "
                f"late at the outer collectives and looks slow from outside; only "
                f"{'it is' if len(g['named']) == 1 else 'they are'} slow.")
    inc.evidence["summary"] = inc.evidence.get("summary", "") + sentence


def descend_in_stage(ranks: np.ndarray, onset: int, s: int, obs: Observation, topo: Topology,
                     stages: StageSet, cfg: AnalyzerConfig) -> Descent:
    """The culprits of ranks found slow in compute or host stage ``s`` from ``onset``: the risen
    ranks of their mostly slow nodes added (:func:`~analyzer.diagnosis.node_culprits.complete_nodes`),
    then :func:`descend`, each rank's excess its largest rise in a compute or host stage (its time
    since the onset over its time before): a TP group waits for its slow member after attention
    and after the MLP alike."""
    win = obs.window
    now, before = win.values[win.since(onset)], win.values[win.before(onset)]
    own = [j for j, st in enumerate(stages) if st.kind != "comm"] or [s]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        excess = (np.nanmax(np.nanmedian(now[:, :, own], axis=0) - np.nanmedian(before[:, :, own], axis=0), axis=1)
                  if len(before) and len(now) else np.full(topo.world, np.nan))
    return descend(complete_nodes(ranks, now, before, s, topo), now, before, excess, topo, stages, cfg)
