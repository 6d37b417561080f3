"""Rule: transient stalls, short hot streaks that end on their own (e.g. a JIT compile stall).

A streak of at most ``transient_max`` iterations that ends is a transient
stall when, at its peak, the cell was at least ``abs_ratio`` times its peers
and ``transient_z`` sigmas of its stage's one-iteration noise out: a noisy data
loader reaches 1.9x now and then; a stall is seconds. Cells a straggler incident
holds are not stalls.

Real jobs stall sporadically on random ranks (Python GC, page faults, OS jitter: most
stragglers in large fleets are not hardware, per the what-if study of ByteDance's fleet,
Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis",
OSDI 2025). A 12,960-rank job draws dozens of those an iteration; an incident for each is an
alert storm. So, in a job that stalls somewhere more than ``stall_rare`` times an iteration,
a stall is an incident only when it costs the job something beyond its own
jitter (its iteration time rose ``stall_min_excess`` above the level around it plus 3 robust
sigmas of the iteration-to-iteration jitter, or ``stall_min_gpu_hours`` in all) or the same ranks stall ``stall_repeat`` times within
``reopen_within`` iterations, and more often than the job's own sporadic-stall rate makes
likely on some rank by chance (:mod:`analyzer.diagnosis.stall_repeats`); the rest go into
:class:`~analyzer.diagnosis.stall_tally.SporadicStalls`, one job-level tally with an upper bound
of their cost (:mod:`analyzer.diagnosis.stall_cost`). The incident is written already resolved.

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

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.rank_cells import RankCells
from analyzer.diagnosis.rank_evidence import (
    new_rank_incident,
    onset_gap,
    split_by_onset_and_place,
    write_rank_evidence,
)
from analyzer.diagnosis.rule import Rule
from analyzer.diagnosis.stall_cost import JobLevels, lost_ms
from analyzer.diagnosis.stall_repeats import StallRepeats
from analyzer.diagnosis.stall_tally import SporadicStalls
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology


class TransientStallRule(Rule):
    """Short, large rank-level stalls that passed (and cost something, or keep coming back)."""

    classes = (IncidentClass.TRANSIENT_STALL,)

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig, cells: RankCells):
        super().__init__(job, topo, stages, cfg)
        self.cells = cells
        self.levels = JobLevels(max(cfg.history, 2 * cfg.l1_window))
        self.repeats = StallRepeats(topo.world)
        self.sporadic = SporadicStalls()

    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        cfg, cells = self.cfg, self.cells
        self.levels.push(obs.iteration, obs.job_ms)
        self.repeats.tick()
        prev = cells.prev_streak
        ended = ((~obs.hot) & (prev > 0) & (prev <= cfg.transient_max) & ~cells.assigned
                 & obs.present[:, None])
        ended &= (cells.peak >= cfg.abs_ratio) & (cells.peak_z >= cfg.transient_z)
        if not ended.any():
            return []
        # a job that rarely stalls (fewer than ``stall_rare`` stalls an iteration so far, once
        # there is a history to say so): a stall is news whatever it cost; the cost gate is for
        # jobs that stall somewhere every iteration
        rare = (self.repeats.iterations > max(3, cfg.l1_min_history)
                and self.repeats.stalls_per_iteration() < cfg.stall_rare)
        parts = self._parts(ended, obs)
        # every stall ending now includes the last iteration, so the job's excess there is
        # charged to the one that lost the most (a 40x stall on a node explains it, not a 2x
        # blip on one rank beside it); the others are incidents only when they keep coming back
        costly = [k for k, p in enumerate(parts)
                  if rare or p[3] >= cfg.stall_min_excess or p[4] >= cfg.stall_min_gpu_hours]
        charged = max(costly, key=lambda k: parts[k][6]) if costly else -1
        out = []
        for k, (part_r, part_o, s, _, _, repeated, lost) in enumerate(parts):
            if k != charged and not repeated:
                self._count_sporadic(part_r, int(part_o.min()), obs, lost)
                continue
            out.append(self._incident(part_r, part_o, s, obs, book))
        return out

    def _parts(self, ended: np.ndarray, obs: Observation) -> list[tuple]:
        """The stalls ending now, one per stage, onset and place: (ranks, onsets, stage index,
        cost fraction, GPU-hours, repeated, lost ms)."""
        cfg, cells = self.cfg, self.cells
        parts = []
        ranks_c, stages_c = np.nonzero(ended)
        for s in np.unique(stages_c):
            ranks = np.unique(ranks_c[stages_c == s])
            onsets = cells.onset[ranks, s]
            for part_r, part_o in split_by_onset_and_place(ranks, onsets, onset_gap(cfg.transient_max),
                                                           self.topo):
                onset = int(part_o.min())
                frac, gpu_h = self.levels.cost(onset, obs.iteration, cfg.l1_min_history, self.topo.world)
                repeated = self.repeats.repeats(part_r, obs.iteration, cfg.reopen_within,
                                                max(1, cfg.stall_repeat), cfg.stall_repeat_alpha)
                parts.append((part_r, part_o, int(s), frac, gpu_h, repeated,
                              lost_ms(obs.window, part_r, int(s), onset, obs.iteration)))
        return parts

    def _incident(self, ranks: np.ndarray, onsets: np.ndarray, s: int, obs: Observation,
                  book: IncidentBook) -> Incident:
        """A transient-stall incident, written resolved (registered in ``book``)."""
        inc = new_rank_incident(self.job, IncidentClass.TRANSIENT_STALL, self.stages.stages[s].name,
                                ranks, onsets, obs, self.topo)
        write_rank_evidence(inc, obs, self.topo, self.stages, self.cfg.short_collective_ratio)
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
