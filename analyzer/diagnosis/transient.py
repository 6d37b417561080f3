"""Rule: transient stalls, short hot streaks that end on their own (e.g. a JIT compile stall).

A streak of at most ``transient_max`` iterations that ends is a transient
stall when, at its peak, the cell was at least ``abs_ratio`` times its peers
and ``transient_z`` sigmas of its stage's one-iteration noise out: a noisy data
loader reaches 1.9x now and then; a stall is seconds. Cells a straggler incident
holds are not stalls.

Real jobs stall sporadically on random ranks (Python GC, page faults, OS jitter: most
stragglers in large fleets are not hardware, per the what-if study of ByteDance's fleet,
Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis",
OSDI 2025). A 12,960-rank job draws dozens of those an iteration, an 8-rank job one in fifty
iterations; an incident for each is an alert storm in the first and a page for nothing in the
second. So a stall is an incident only when it cost the job at least ``stall_min_excess``
iterations' worth of time (its excess over the level around it, where beyond the job's own
swings: :mod:`analyzer.diagnosis.stall_cost`) or ``stall_min_gpu_hours`` in all, or when the
same ranks stall ``stall_repeat`` times within ``reopen_within`` iterations, and more often than
the job's own sporadic-stall rate makes likely on some rank by chance, or the stall is wider (TP
groups of its nodes stalling with it) or longer (iterations in a row seen out) than that rate
explains anywhere in the job (:mod:`analyzer.diagnosis.stall_repeats`). The tests mean the same
at every size: the cost is a share of the job's own iteration, the repeats, width and length a
chance over all of the job's ranks. A stall still going on that lost more over the same
iterations takes their cost (it is charged when it ends), and an iteration's cost is charged
to one incident at most. The rest go
into :class:`~analyzer.diagnosis.stall_tally.SporadicStalls`, one job-level tally with an upper
bound of their cost. The incident is written already resolved.

A stall of a whole DP group at once (in a small job one node can hold a whole PP stage) has no
peer to stand out against: the pipeline-balance scorer sees the group against the other stages,
and such a short streak (:mod:`analyzer.diagnosis.stage_stalls`) is judged by its cost alone.

Example::

    >>> from analyzer.config import AnalyzerConfig
    >>> from rankscope.schema import DEFAULT_STAGES
    >>> from rankscope.topology import Topology
    >>> rule = TransientStallRule("j", Topology(dp=8, gpus_per_node=4), DEFAULT_STAGES,
    ...                           AnalyzerConfig(), RankCells(8, len(DEFAULT_STAGES)))
    >>> [c.value for c in rule.classes]
    ['transient_stall']
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.inner_groups import Descent, descend_in_stage, note_descent
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.rank_cells import RankCells
from analyzer.diagnosis.rank_evidence import (
    new_rank_incident,
    onset_gap,
    own_peak_ratio,
    split_by_onset_and_place,
    write_rank_evidence,
    write_stage_stall_evidence,
)
from analyzer.diagnosis.rule import Rule
from analyzer.diagnosis.stage_stalls import StageStall, StageStreaks
from analyzer.diagnosis.stall_cost import JobLevels, lost_ms
from analyzer.diagnosis.stall_repeats import StallRepeats, wide_or_long
from analyzer.diagnosis.stall_tally import SporadicStalls
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology


class StallPart(NamedTuple):
    """One stall ending now: its ranks and their onsets in stage ``s``; ``cost``: iterations'
    worth the job lost to it, ``gpu_hours`` the same in GPU-hours; ``unlikely``: it repeats, or is
    wider or longer, than the job's sporadic stalls explain by chance; ``lost_ms``: what its
    cells lost against their iteration's median (the tally's upper bound)."""

    ranks: np.ndarray
    onsets: np.ndarray
    s: int
    cost: float
    gpu_hours: float
    unlikely: bool
    lost_ms: float
    peak: float | None = None   # a whole DP group's stall (no peer to compare with): its own peak ratio


class TransientStallRule(Rule):
    """Short, large rank-level stalls that passed (and cost something, or are more than chance)."""

    classes = (IncidentClass.TRANSIENT_STALL,)

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig, cells: RankCells):
        super().__init__(job, topo, stages, cfg)
        self.cells = cells
        self.levels = JobLevels(max(cfg.history, 2 * cfg.l1_window))
        self.repeats = StallRepeats(topo.world)
        self.sporadic = SporadicStalls()
        self.stage_streaks = StageStreaks((topo.group_count("dp"), len(stages)))
        # per cell, in its streak: iterations seen out (hot, and far from its peers this very
        # iteration) and the last of them; a smoothed ratio may keep a cell hot an iteration
        # after a dropped point, which lengthens the streak, not the stall
        shape = cells.streak.shape
        self.out_n = np.zeros(shape, dtype=np.int64)
        self.last_out = np.zeros(shape, dtype=np.int64)

    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        cfg, cells = self.cfg, self.cells
        self.levels.push(obs.iteration, obs.job_ms)
        self.repeats.tick()
        with np.errstate(invalid="ignore"):
            out = obs.hot & (obs.scores.ratio >= cfg.abs_ratio)
        self.out_n = np.where(obs.hot & (cells.prev_streak == 0), 0, self.out_n) + out
        self.last_out = np.where(out, obs.iteration, self.last_out)
        prev = cells.prev_streak
        ended = ((~obs.hot) & (prev > 0) & (prev <= cfg.transient_max) & ~cells.assigned
                 & obs.present[:, None])
        ended &= (cells.peak >= cfg.abs_ratio) & (cells.peak_z >= cfg.transient_z)
        ended &= ~self._held(book)[:, None]   # a GPU an open incident names: its fault, in any stage
        parts = self._parts(ended, obs) if ended.any() else []
        parts += self._stage_parts(obs, parts)
        if not parts:
            return []
        # every stall ending now includes the last iteration, so the job's excess there is
        # charged to the one that lost the most (a 40x stall on a node explains it, not a 2x
        # blip on one rank beside it); the others are incidents only when chance explains them not
        costly = [k for k, p in enumerate(parts)
                  if (p.cost >= cfg.stall_min_excess or p.gpu_hours >= cfg.stall_min_gpu_hours)
                  and not self._outdone(p, obs)]
        charged = max(costly, key=lambda k: parts[k].lost_ms) if costly else -1
        out = []
        for k, p in enumerate(parts):
            if k != charged and not p.unlikely:
                self._count_sporadic(p.ranks, int(p.onsets.min()), obs, p.lost_ms)
                continue
            out.append(self._incident(p, obs, book))
        if charged >= 0:   # the job's time up to now is this incident's: nobody else's cost
            self.levels.charge(obs.iteration)
        return out

    def _held(self, book: IncidentBook) -> np.ndarray:
        """Bool ``[rank]``: the culprits of open straggler and host-stall incidents."""
        held = np.zeros(self.topo.world, dtype=bool)
        for inc in book.open():
            if inc.cls in (IncidentClass.COMPUTE_STRAGGLER, IncidentClass.HOST_STALL):
                r = np.asarray(inc.ranks, dtype=np.int64)
                held[r[(r >= 0) & (r < self.topo.world)]] = True
        return held

    def _parts(self, ended: np.ndarray, obs: Observation) -> list[StallPart]:
        """The stalls ending now, one per stage, onset and place."""
        cells = self.cells
        parts = []
        ranks_c, stages_c = np.nonzero(ended)
        for s in np.unique(stages_c):
            ranks = np.unique(ranks_c[stages_c == s])
            onsets = cells.onset[ranks, s]
            for part_r, part_o in split_by_onset_and_place(ranks, onsets, onset_gap(self.cfg.transient_max),
                                                           self.topo):
                parts.append(self._part(part_r, part_o, int(s), obs))
        return parts

    def _outdone(self, p: StallPart, obs: Observation) -> bool:
        """Whether a stall still going on in the same stage lost more than ``p`` over ``p``'s
        iterations: the job's excess there is that one's (charged when it ends), not ``p``'s."""
        going = np.flatnonzero(self._going(p.s, obs))
        return bool(len(going)) and lost_ms(obs.window, going, p.s, int(p.onsets.min()), obs.iteration) > p.lost_ms

    def _going(self, s: int, obs: Observation) -> np.ndarray:
        """Bool ``[rank]``: stage ``s``'s cells in a stall still going on (hot, or hot when their
        rank last reported; not yet long enough to be a straggler, held by no incident)."""
        cells = self.cells
        streak = cells.streak[:, s]
        return (streak > 0) & (streak <= self.cfg.transient_max) & ~cells.assigned[:, s]

    def _part(self, ranks: np.ndarray, onsets: np.ndarray, s: int, obs: Observation) -> StallPart:
        """One stall ending now, judged: its cost (the job's excess until its cells were last seen
        out) and whether chance explains it (its width, the iterations it was seen out, its repeats)."""
        cfg, topo, onset = self.cfg, self.topo, int(onsets.min())
        last = int(self.last_out[ranks, s].max())
        cost, gpu_h = self.levels.cost(onset, obs.iteration, cfg.l1_min_history, topo.world, last=last)
        # its width: the GPUs of its nodes that stalled with it, ended or still going on (a
        # dropped point ends one a little later); a GPU stalled shows on its whole TP group (TP
        # collectives run inside its kernels), so TP groups are counted
        beside = (self._going(s, obs) & np.isin(topo.node_index, topo.node_index[ranks])
                  & (np.abs(self.cells.onset[:, s] - onset) < onset_gap(cfg.transient_max)))
        units = len(np.unique(topo.group_ids("tp")[np.union1d(ranks, np.flatnonzero(beside))]))
        span = 2 * onset_gap(cfg.transient_max) - 1   # the onsets gathered into it: this one's, +- a gap
        rate = self.repeats.rate(ranks, obs.iteration, cfg.reopen_within)
        place = max(1, min(2 * topo.gpus_per_node, topo.world) // topo.tp)
        unlikely = (self.repeats.iterations > cfg.l1_min_history
                    and wide_or_long(units, int(self.out_n[ranks, s].max()), rate, place, max(1, topo.world // topo.tp),
                                     cfg.stall_repeat_alpha, span))
        repeated = self.repeats.repeats(ranks, obs.iteration, cfg.reopen_within, max(1, cfg.stall_repeat),
                                        cfg.stall_repeat_alpha)
        return StallPart(ranks, onsets, s, cost, gpu_h, unlikely or repeated,
                         lost_ms(obs.window, ranks, s, onset, obs.iteration))

    def _stage_parts(self, obs: Observation, rank_parts: list[StallPart]) -> list[StallPart]:
        """Whole DP groups' stalls ending now (:mod:`analyzer.diagnosis.stage_stalls`), those of
        one PP stage, stage and onset as one (a PP stage is ``tp`` DP groups), but where ranks of
        theirs stood out in the same stage (then the stall is theirs)."""
        members = self.topo.members("dp")
        present = obs.present[members].any(axis=1)
        merged: dict[tuple[int, int, int], list[StageStall]] = {}
        for g in self.stage_streaks.update(obs.iteration, obs.balance_hot, present, self.cfg):
            merged.setdefault((g.s, g.onset, int(self.topo.pp_index[members[g.group][0]])), []).append(g)
        out = []
        for (s, onset, _), gs in merged.items():
            ranks = np.sort(np.concatenate([members[g.group] for g in gs]))
            if any(p.s == s and np.isin(p.ranks, ranks).any() for p in rank_parts):
                continue
            part = self._stage_part(ranks, s, onset, max(g.last for g in gs), obs)
            if part is not None:
                out.append(part)
        return out

    def _stage_part(self, ranks: np.ndarray, s: int, onset: int, last: int, obs: Observation) -> StallPart | None:
        """A whole PP stage's stall, judged by its cost alone (every rank of the stage is in it,
        no chance of others explains it); None when at its peak its ranks took less than
        ``abs_ratio`` times their own time before (no stall)."""
        own = own_peak_ratio(obs, ranks, s, onset)
        if not own >= self.cfg.abs_ratio:
            return None
        cost, gpu_h = self.levels.cost(onset, obs.iteration, self.cfg.l1_min_history, self.topo.world, last=last)
        return StallPart(ranks, np.full(len(ranks), onset), s, cost, gpu_h, False,
                         lost_ms(obs.window, ranks, s, onset, obs.iteration), own)

    def _incident(self, p: StallPart, obs: Observation, book: IncidentBook) -> Incident:
        """A transient-stall incident, written resolved (registered in ``book``)."""
        d = (descend_in_stage(p.ranks, int(p.onsets.min()), p.s, obs, self.topo, self.stages, self.cfg)
             if p.peak is None else Descent(p.ranks))
        inc = new_rank_incident(self.job, IncidentClass.TRANSIENT_STALL, self.stages.stages[p.s].name,
                                d.ranks, np.full(len(d.ranks), p.onsets.min()), obs, self.topo)
        if p.peak is None:
            write_rank_evidence(inc, obs, self.topo, self.stages, self.cfg.short_collective_ratio)
            note_descent(inc, d)
        else:
            write_stage_stall_evidence(inc, p.peak, p.cost, obs, self.topo, self.stages)
        book.judge_events(inc, obs.window)
        inc.resolve(obs.iteration)
        return book.register(inc)

    def _count_sporadic(self, ranks: np.ndarray, onset: int, obs: Observation, lost: float) -> None:
        """A stall that is noise: into the job's tally (``lost``: what its cells lost, ms)."""
        hosts = self.topo.hosts_of(ranks) or [f"node {n}" for n in self.topo.nodes_of(ranks)]
        self.sporadic.count(ranks, hosts, lost * self.topo.world / 3.6e6, onset, obs.iteration)

    def active(self, inc: Incident, obs: Observation) -> bool:
        return False  # written resolved

    def quiet_to_resolve(self, inc: Incident) -> int:
        return 1
