"""Rule: link degradation, where the transfer floors of the culprits' collective groups rose.

A degraded link shows in no compute stage; it raises the *floor* (the fastest
member's time: the pure transfer) of every collective group the ranks behind
it take part in, and the culprits are at the intersection of those groups
(:func:`~analyzer.score.transfer_floors.intersect_risen`). Floors that rise in a single kind of
collective are a chunk waiting on someone, not a link; groups on the
pipelines of a hot straggler are explained by it. Candidates whose own
pipeline p2p times did not rise are dropped (a p2p hop involves only the two
ranks it joins). Without pipeline hops (pp = 1), a node whose EP group spans
other nodes is told from them by the expert reduce: the ranks holding the same
experts (the ``edp`` groups) differ between the nodes of one EP group. The
episode is confirmed after ``transient_max + 1`` iterations and stays active
while the floors of those ranks stay risen.

Example::

    >>> from analyzer.config import AnalyzerConfig
    >>> from rankscope.schema import DEFAULT_STAGES
    >>> from rankscope.topology import Topology
    >>> [c.value for c in LinkRule("j", Topology(pp=2, dp=8, ep=4, gpus_per_node=4), DEFAULT_STAGES,
    ...                             AnalyzerConfig()).classes]
    ['link_degradation']
"""

from __future__ import annotations

import warnings

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.rank_evidence import together
from analyzer.diagnosis.rank_sets import overlap
from analyzer.diagnosis.rule import Episode, Rule, culprit_incident
from analyzer.score.transfer_floors import FloorScores, intersect_risen
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology, format_ranks

#: Iterations whose median p2p times locate the slow hops (robust to one noisy iteration).
P2P_ITERATIONS = 3


class LinkRule(Rule):
    """Slow transfers of a set of ranks: a degraded link or NIC."""

    classes = (IncidentClass.LINK_DEGRADATION,)

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig):
        super().__init__(job, topo, stages, cfg)
        self.episodes: list[Episode] = []

    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        floors = obs.floors
        hot_ranks = obs.hot.any(axis=1)
        if hot_ranks.any():
            # a straggler's delay travels along its pipelines; floors of groups on those
            # pipelines are explained by it, not by a link
            tainted = np.zeros(self.topo.world, dtype=bool)
            pipes = np.unique(self.topo.group_ids("pipeline")[hot_ranks])
            tainted[self.topo.members("pipeline")[pipes].reshape(-1)] = True
            floors = _untaint(self.topo, floors, tainted)
        culprits, stage, ratio = intersect_risen(self.topo, floors)
        # a degraded link slows every kind of collective its ranks take part in; floors of a
        # single kind rising is the chunk waiting on someone (e.g. a late data loader)
        kinds_risen = {self._kind(k) for k, r in zip(floors.kind, floors.risen, strict=True) if r.any()}
        if len({self._kind(k) for k in floors.kind}) >= 2 and len(kinds_risen) < 2:
            culprits = np.empty(0, np.int64)
        separable = True
        if len(culprits) > 1:
            culprits, separable = self._refine_by_p2p(culprits, obs)
        if not len(culprits):
            self.episodes = []
            return []
        # one episode per set of culprits that sit together: two faults at once are two incidents
        culprits = np.sort(culprits)
        label = together(culprits, self.topo)
        episodes: list[Episode] = []
        for k in np.unique(label):
            part = culprits[label == k]
            ep = next((e for e in self.episodes if e not in episodes and overlap(e.ranks, part) >= 0.5), None)
            if ep is not None:
                ep.streak += 1
                ep.count(part)
                # what stays risen in most iterations is the culprit; chance risers drop out
                steady = ep.steady()
                ep.ranks = steady if len(steady) else part
                ep.ratio = max(ep.ratio, ratio)
                ep.stage = stage or ep.stage
            else:
                ep = Episode(part, stage, ratio, obs.iteration, obs.time_ms)
                ep.count(part)
            episodes.append(ep)
        self.episodes = episodes
        out = []
        for ep in episodes:
            if ep.streak < self.cfg.transient_max + 1:
                continue
            if any(inc.cls == IncidentClass.LINK_DEGRADATION and overlap(np.asarray(inc.ranks), ep.ranks) >= 0.5
                   for inc in book.open()):
                continue
            ambiguous = not separable and len(self.topo.nodes_of(ep.ranks)) > 1
            inc = self._incident(ep, floors, obs, ambiguous=ambiguous)
            inc = book.register(inc)
            book.judge_events(inc, obs.window)
            out.append(inc)
        return out

    def _kind(self, kind: str) -> str:
        """A group kind, with expert-data-parallel counted as DP when the two are the same groups
        (ep = 1): one set of groups rising is one kind, however many stages it runs."""
        return "dp" if kind == "edp" and self.topo.ep == 1 else kind

    def _incident(self, ep: Episode, floors: FloorScores, obs: Observation, ambiguous: bool) -> Incident:
        inc = culprit_incident(self.job, IncidentClass.LINK_DEGRADATION, ep.ranks, self.topo, ep.onset,
                               ep.onset_ms, stage=ep.stage, ratio=float(ep.ratio), group_type=None,
                               group_ranks=[])
        risen = [(n, k, float(np.nanmax(r[m]))) for n, k, r, m in
                 zip(floors.stage, floors.kind, floors.ratio, floors.risen, strict=True) if m.any()]
        kinds = sorted({k for _, k, _ in risen}, key=self.topo.group_size)
        inc.group_type = kinds[0] if kinds else None
        if inc.group_type:
            inc.group_ranks = self.topo.group_ranks(inc.group_type, int(ep.ranks[0])).tolist()
        txt = ", ".join(f"{n} ({k}) x{r:.1f}" for n, k, r in risen)
        summary = (f"The transfer floor (the fastest member's time, i.e. pure transfer) rose in every "
                   f"collective group of ranks {format_ranks(ep.ranks)} ({inc.where}): "
                   f"{txt}. Compute stages are normal, so the ranks at the intersection of those "
                   f"groups have slow transfers: a degraded link or NIC.")
        if ambiguous:
            expert = ("every expert has one copy, so there is no expert reduce either"
                      if self.topo.group_size("edp") == 1 else
                      "no expert reduce timed apart from the dense one")
            summary += (f" No timing separates these {len(inc.nodes)} machines: without pipeline hops "
                        f"of their own (pp={self.topo.pp}, EP groups of {self.topo.ep} ranks on "
                        f"{self.topo.gpus_per_node}-GPU nodes) and with {expert}, every collective "
                        f"they run includes them all, so this is the smallest set the data supports; "
                        f"the degraded link is on one of them: check each.")
        elif self.topo.pp > 1:
            summary += (" Inside their lockstep groups only these ranks' own pipeline hops (pp_send/"
                        "pp_recv) are slow, which puts the link on them.")
        elif "edp" in kinds and self.topo.ep * self.topo.tp > self.topo.gpus_per_node:
            summary += (" Their EP group spans other machines too, but only the expert-data-parallel "
                        "groups of these ranks (the ranks holding the same experts, one per EP group) "
                        "reduced their expert gradients slowly, which puts the link on them.")
        inc.evidence = {
            "summary": summary, "stage": ep.stage, "ratio": round(float(ep.ratio), 3), "risen_floors": risen,
            "ambiguous": ambiguous,
            "group": {"type": inc.group_type, "ranks": format_ranks(inc.group_ranks)}, "l1": obs.l1_step,
        }
        return inc

    def _refine_by_p2p(self, candidates: np.ndarray, obs: Observation) -> tuple[np.ndarray, bool]:
        """Narrow the candidates down to the ranks whose own pipeline hops are slow.

        Floors say which collective groups have a slow member, not which member. A pipeline
        hop involves only the two ranks it joins, and the ranks of one lockstep group (the EP
        group, or the TP group, at one pipeline stage) share their pipeline waits, so inside
        such a group a rank whose p2p times stand above its mates' has the slow link. Where a
        whole lockstep group is behind the link (nobody stands out), its candidates stay.
        Returns the culprits and whether pipeline hops could separate them at all.
        """
        p2p = [i for i, st in enumerate(self.stages) if st.kind == "comm" and st.group == "pipeline"]
        lock = "ep" if self.topo.ep > 1 else "tp" if self.topo.tp > 1 else None
        if not p2p or self.topo.pp < 2 or lock is None:
            return candidates, False
        recent = obs.window.recent(P2P_ITERATIONS)[:, :, p2p]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            level = np.nanmedian(recent, axis=0)                      # [R, P]
            groups = np.unique(self.topo.group_ids(lock)[candidates])
            members = self.topo.members(lock)[groups]                 # [G, size]
            v = level[members]                                        # [G, size, P]
            # against what the healthy mates achieve, even when half of the group is slow
            ref = np.nanquantile(v, self.cfg.reference_quantile, axis=1, keepdims=True)
            lr = np.nanmax(np.nan_to_num(np.log(v / ref), nan=0.0, neginf=0.0), axis=2)   # [G, size]
        top = lr.max(axis=1, keepdims=True)
        # out by the floor threshold, and comparable to the worst of the group (chance risers are not)
        stands = (lr >= np.log1p(self.cfg.floor_change)) & (lr >= 0.5 * top)
        few = stands.any(axis=1) & (stands.sum(axis=1) * 2 <= members.shape[1])
        keep = np.where(few[:, None], stands, True) & np.isin(members, candidates)
        culprits = np.unique(members[keep])
        # a node most of whose ranks stand out is behind the link as a whole (a shared NIC, a
        # node-level fault): its other candidate ranks, which noise kept under the bar, join
        node = self.topo.node_index
        nodes, counts = np.unique(node[culprits], return_counts=True)
        mostly = nodes[counts * 2 > self.topo.gpus_per_node]
        culprits = np.union1d(culprits, candidates[np.isin(node[candidates], mostly)])
        # separated only where some rank stood out from its lockstep mates
        return (culprits if len(culprits) else candidates), bool(few.any())

    def active(self, inc: Incident, obs: Observation) -> bool:
        return any(overlap(ep.ranks, np.asarray(inc.ranks)) >= 0.5 for ep in self.episodes)



def _untaint(topo: Topology, floors: FloorScores, tainted: np.ndarray) -> FloorScores:
    """The floor scores with groups mostly made of tainted ranks no longer risen."""
    risen = []
    for kind, r in zip(floors.kind, floors.risen, strict=True):
        bad = tainted[topo.members(kind)].mean(axis=1) > 0.5
        risen.append(r & ~bad)
    return FloorScores(floors.stage, floors.kind, floors.floor, floors.ratio, risen)
