"""Rule: transient stalls, short hot streaks that end on their own (e.g. a JIT compile stall).

A streak of at most ``transient_max`` iterations that ends is a transient
stall when, at its peak, the cell was at least ``abs_ratio`` times its peers
and ``transient_z`` sigmas of its stage's one-iteration noise out: a noisy data
loader reaches 1.9x now and then; a stall is seconds. The incident is written
already resolved; cells a straggler incident holds are not stalls.

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
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology


class TransientStallRule(Rule):
    """Short, large rank-level stalls that passed."""

    classes = (IncidentClass.TRANSIENT_STALL,)

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig, cells: RankCells):
        super().__init__(job, topo, stages, cfg)
        self.cells = cells

    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        cfg, cells = self.cfg, self.cells
        prev = cells.prev_streak
        ended = ((~obs.hot) & (prev > 0) & (prev <= cfg.transient_max) & ~cells.assigned
                 & obs.present[:, None])
        ended &= (cells.peak >= cfg.abs_ratio) & (cells.peak_z >= cfg.transient_z)
        if not ended.any():
            return []
        out = []
        ranks_c, stages_c = np.nonzero(ended)
        for s in np.unique(stages_c):
            ranks = np.unique(ranks_c[stages_c == s])
            stage = self.stages.stages[int(s)].name
            onsets = cells.onset[ranks, s]
            for part_r, part_o in split_by_onset_and_place(ranks, onsets, onset_gap(cfg.transient_max),
                                                           self.topo):
                inc = new_rank_incident(self.job, IncidentClass.TRANSIENT_STALL, stage, part_r, part_o,
                                        obs, self.topo)
                write_rank_evidence(inc, obs, self.topo, self.stages)
                book.judge_events(inc, obs.window)
                inc.resolve(obs.iteration)
                inc = book.register(inc)
                out.append(inc)
        return out

    def active(self, inc: Incident, obs: Observation) -> bool:
        return False  # written resolved

    def quiet_to_resolve(self, inc: Incident) -> int:
        return 1

