"""Rule: compute stragglers and host stalls, ranks slow in a compute or host stage for long.

A (rank, stage) cell hot for more than ``transient_max`` iterations in a row
is confirmed: a compute straggler when the stage is compute-only, a host
stall when it is host-side (the data loader). Ranks confirmed together
(onsets within ``transient_max + 1`` iterations, at most a node apart) that
rose alike form one incident (one far more or far less risen than the others
is a fault apart); ranks confirmed later that overlap an open incident, or sit
on its node or next to it with a close onset in the same stage having risen
about as much as its culprits, join it; but a culprit far slower now
in another stage than in the incident's (its rise from its own onset against
theirs: :func:`~analyzer.diagnosis.node_culprits.far_slower`) is a fault of its
own, named in that stage. The incident stays active while at least half of its
reporting culprits are hot in its stage.

Example::

    >>> from analyzer.config import AnalyzerConfig
    >>> from rankscope.schema import DEFAULT_STAGES
    >>> from rankscope.topology import Topology
    >>> rule = StragglerRule("j", Topology(pp=2, dp=8, ep=4, gpus_per_node=4), DEFAULT_STAGES,
    ...                      AnalyzerConfig(), RankCells(16, len(DEFAULT_STAGES)))
    >>> sorted(c.value for c in rule.classes)
    ['compute_straggler', 'host_stall']
"""

from __future__ import annotations

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.inner_groups import descend_in_stage, note_descent
from analyzer.diagnosis.node_culprits import far_slower, rises, rose_with
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.rank_cells import RankCells
from analyzer.diagnosis.rank_evidence import (
    new_rank_incident,
    onset_gap,
    split_by_onset_and_place,
    write_rank_evidence,
)
from analyzer.diagnosis.rank_sets import distance
from analyzer.diagnosis.rule import Rule, set_culprits
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology


class StragglerRule(Rule):
    """Persistent rank-level slowness in a compute (straggler) or host (stall) stage."""

    classes = (IncidentClass.COMPUTE_STRAGGLER, IncidentClass.HOST_STALL)

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig, cells: RankCells):
        super().__init__(job, topo, stages, cfg)
        self.cells = cells
        # rank -> the open incidents it is a culprit of and far slower than, now (one detect call)
        self._apart: dict[int, set[str]] = {}

    def class_of(self, stage: int) -> IncidentClass:
        return (IncidentClass.HOST_STALL if self.stages.stages[stage].kind == "host"
                else IncidentClass.COMPUTE_STRAGGLER)

    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        cells = self.cells
        confirmed = obs.hot & (cells.streak > self.cfg.transient_max) & ~cells.assigned
        if not confirmed.any():
            return []
        out: list[Incident] = []
        self._apart = {}
        gap = onset_gap(self.cfg.transient_max)
        ranks_c, stages_c = np.nonzero(confirmed)
        for s in np.unique(stages_c):
            s = int(s)
            ranks = np.unique(ranks_c[stages_c == s])
            parts = split_by_onset_and_place(ranks, cells.onset[ranks, s], gap, self.topo)
            for part_r, part_o in self._alike(parts, s, obs):
                # each part in turn: a part may join the incident the one before it opened
                part_r, part_o = self._join_open(part_r, part_o, s, self.class_of(s), obs, book, out)
                if len(part_r):
                    self._open(part_r, part_o, s, obs, book, out)
        return out

    def _alike(self, parts: list[tuple[np.ndarray, np.ndarray]], s: int,
               obs: Observation) -> list[tuple[np.ndarray, np.ndarray]]:
        """``parts`` split by how far each rank rose in the stage from its own onset, against the
        part's median rise (:func:`~analyzer.diagnosis.node_culprits.far_slower` both ways): the
        far slower first, then the body, then the far less risen. A rank the OS starved for a few
        iterations as another's fault began is confirmed beside it, not by its fault."""
        out = []
        win = obs.window
        for part_r, part_o in parts:
            if len(part_r) < 2:
                out.append((part_r, part_o))
                continue
            rise, _ = rises(part_r, part_o, s, part_r, s, int(part_o.min()), win.values, win.iterations)
            mid = float(np.nanmedian(rise)) if np.isfinite(rise).any() else float("nan")
            far, low = far_slower(rise, mid), far_slower(mid, rise)
            for keep in (far, ~far & ~low, low):
                if keep.any():
                    out.append((part_r[keep], part_o[keep]))
        return out

    def _open(self, ranks: np.ndarray, onsets: np.ndarray, s: int, obs: Observation, book: IncidentBook,
              out: list[Incident]) -> None:
        """A new incident for ``ranks`` of stage ``s``, but for the members of their inner groups
        that only waited for one of them: all of a TP group looks slow when it waits for one member."""
        cls = self.class_of(s)
        d = descend_in_stage(ranks, int(onsets.min()), s, obs, self.topo, self.stages, self.cfg)
        self.cells.claim(np.union1d(ranks, d.ranks), s)
        held = next((i for i in book.open() if i.cls == cls and np.isin(d.ranks, i.ranks).all()
                     and not any(i.id in self._apart.get(int(r), ()) for r in d.ranks)), None)
        if held is not None:   # they wait for the culprit of an open incident (found in another stage)
            note_descent(held, d)
            out.append(held)
            return
        inc = new_rank_incident(self.job, cls, self.stages.stages[s].name, d.ranks,
                                np.full(len(d.ranks), onsets.min()), obs, self.topo)
        write_rank_evidence(inc, obs, self.topo, self.stages, self.cfg.short_collective_ratio)
        note_descent(inc, d)
        book.judge_events(inc, obs.window)
        out.append(book.register(inc))

    def _join_open(self, ranks: np.ndarray, onsets: np.ndarray, s: int, cls: IncidentClass,
                   obs: Observation, book: IncidentBook, out: list[Incident]) -> tuple[np.ndarray, np.ndarray]:
        """Ranks that fit an open incident of the same class join it; the rest are returned. They
        fit when they are its culprits (unless far slower in another stage), or on its nodes and risen
        as much as its culprits, about (one
        machine is one fault to drain, in any stage, whenever its ranks cross the bar), or next to it with a close onset in its stage;
        those that only wait for its culprits (inner groups) are held by it, not named."""
        stage = self.stages.stages[s].name
        gap = onset_gap(self.cfg.transient_max)
        for inc in book.open():
            if inc.cls != cls:
                continue
            waited = np.isin(ranks, inc.waiting_ranks)
            if waited.any():
                self.cells.claim(ranks[waited], s)
                ranks, onsets = ranks[~waited], onsets[~waited]
            near = np.abs(onsets - inc.onset_iteration) <= gap
            close = distance(ranks, np.asarray(inc.ranks)) <= self.topo.gpus_per_node
            same_node = np.isin(self.topo.node_index[ranks], inc.nodes)
            win = obs.window
            beside = near & close & (inc.stage == stage)
            if (same_node | beside).any():   # by the same fault: risen as much as its culprits, about
                by = same_node | beside
                alike = np.zeros(len(ranks), dtype=bool)
                alike[by] = rose_with(ranks[by], onsets[by], s, np.asarray(inc.ranks, dtype=np.int64),
                                      self.stages.index(inc.stage), inc.onset_iteration, win.values, win.iterations)
                same_node &= alike
                beside &= alike
            ours = np.isin(ranks, inc.ranks)
            apart = np.zeros(len(ranks), dtype=bool)
            if ours.any() and inc.stage != stage:   # its culprits, slow in another stage: far slower there
                rise, theirs = rises(ranks[ours], onsets[ours], s, np.asarray(inc.ranks, dtype=np.int64),
                                     self.stages.index(inc.stage), inc.onset_iteration, win.values, win.iterations)
                apart[ours] = far_slower(rise, theirs)   # is a fault of its own (a new incident), not the same
                for r in ranks[apart].tolist():
                    self._apart.setdefault(r, set()).add(inc.id)
                ours &= ~apart
            join = (ours | same_node | beside) & ~apart
            if 2 * ours.sum() >= len(ranks):   # mostly its culprits: the rest come with them
                join = ~apart
            if not join.any():
                continue
            take = ranks[join]
            self.cells.claim(take, s)
            if not np.isin(take, inc.ranks).all():
                d = descend_in_stage(np.union1d(inc.ranks, take), inc.onset_iteration, self.stages.index(inc.stage),
                                     obs, self.topo, self.stages, self.cfg)
                set_culprits(inc, d.ranks, self.topo)
                write_rank_evidence(inc, obs, self.topo, self.stages, self.cfg.short_collective_ratio)
                note_descent(inc, d)
                out.append(inc)
            ranks, onsets = ranks[~join], onsets[~join]
            if not len(ranks):
                break
        return ranks, onsets

    def active(self, inc: Incident, obs: Observation) -> bool:
        ranks = np.asarray(inc.ranks, dtype=np.int64)
        reporting = obs.present[ranks]
        if not reporting.any():
            return True  # silent culprits are not recovered culprits
        return bool(obs.hot[ranks[reporting], self.stages.index(inc.stage)].mean() >= 0.5)

    def resolved(self, inc: Incident) -> None:
        self.cells.claim(inc.ranks, self.stages.index(inc.stage), held=False)

    def adopt(self, inc: Incident) -> None:
        if inc.stage in self.stages:
            self.cells.claim(inc.ranks, self.stages.index(inc.stage))
