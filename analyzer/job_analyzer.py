"""One job's analyzer: all the streaming state, fed one iteration at a time.

Pure computation (no I/O): :class:`JobAnalyzer` takes latency cubes and events
and returns what to write (change points, incidents, L2 points). The cycle
(:mod:`analyzer.service.analyzer_service`) does the reading and writing.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyzer.config import AnalyzerConfig
from analyzer.detect.l1 import ChangePoint, L1Monitor
from analyzer.detect.window import Window
from analyzer.diagnosis import Diagnoser, Observation
from analyzer.diagnosis.event_verdicts import OutOfBandEvent
from analyzer.diagnosis.host_gaps import explain_stalls
from analyzer.diagnosis.kernel_evidence import attach_kernels
from analyzer.score.impact import ImpactTracker
from analyzer.score.l2_points import l2_frames, l2_rank_frame, window_medians
from analyzer.score.rank_scores import RankScorer, RankScores
from analyzer.score.recovery import RecoveryTracker
from analyzer.score.stage_balance import PipelineBalanceScorer
from analyzer.score.transfer_floors import TransferFloorScorer
from rankscope.frames import LatencyCube
from rankscope.incident import Incident
from rankscope.schema import StageSet
from rankscope.topology import Topology


@dataclass
class FeedResult:
    """What feeding some iterations produced."""

    iterations: list[int] = field(default_factory=list)
    changepoints: list[ChangePoint] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)


class JobAnalyzer:
    """L1, L2 and diagnosis state of one job."""

    def __init__(self, job: str, topo: Topology, stages: StageSet, config: AnalyzerConfig | None = None):
        self.job, self.topo, self.stages = job, topo, stages
        self.cfg = config or AnalyzerConfig()
        self.l1 = L1Monitor(job, topo.world, self.cfg)
        self.ranks = RankScorer(topo, stages, self.cfg)
        self.floors = TransferFloorScorer(topo, stages, self.cfg)
        self.balance = PipelineBalanceScorer(topo, stages, self.cfg)
        self._diag = Diagnoser(job, topo, stages, self.cfg)
        self.l1_step: dict | None = None
        self.impact = ImpactTracker(topo.world)
        self.recovery = RecoveryTracker(self.cfg)   # timelines, times to detect and recover
        self.window = Window(self.cfg.history)
        self.last_iteration = -1
        self.last_time_ms = 0
        self.last_scores: RankScores | None = None

    def feed(self, cube: LatencyCube) -> FeedResult:
        """Process the iterations of ``cube`` newer than what was seen, in order."""
        if cube.stages != self.stages.names:
            idx = [cube.stages.index(s) if s in cube.stages else -1 for s in self.stages.names]
            values = np.where(np.array(idx)[None, None, :] >= 0, cube.values[:, :, idx], np.nan)
        else:
            values = cube.values
        res = FeedResult()
        changed: dict[str, Incident] = {}
        for i, it in enumerate(cube.iterations):
            if it <= self.last_iteration:
                continue
            cps, incs = self.step(int(it), int(cube.times[i]), values[i], cube.iteration_ms[i])
            res.iterations.append(int(it))
            res.changepoints += cps
            for inc in incs:
                changed[inc.id] = inc
        for inc in self._diag.rejudge_events(self.window):
            changed[inc.id] = inc
        res.incidents = list(changed.values())
        return res

    def step(self, iteration: int, time_ms: int, values: np.ndarray,
             iteration_ms: np.ndarray) -> tuple[list[ChangePoint], list[Incident]]:
        present = np.isfinite(values).any(axis=1)
        self.window.push(iteration, time_ms, values)
        cps = self.l1.update(iteration, time_ms, iteration_ms)
        for cp in cps:
            if cp.scope == "job" and cp.kind == "step" and cp.recovered_iteration < 0:
                self.l1_step = {"iteration": cp.iteration, "before_ms": round(cp.before_ms, 1),
                                "after_ms": round(cp.after_ms, 1)}
        scores = self.ranks.update(values, present)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # an iteration nobody reported
            job_ms = it_med = float(np.nanmedian(iteration_ms))
            if not np.isfinite(job_ms):   # collectors that write no iteration time
                job_ms = float(np.nanmedian(np.where(present, np.nansum(values, axis=1), np.nan)))
        obs = Observation(iteration, time_ms, self.window, scores, self.floors.update(values),
                          self.balance.update(values), self.balance.last_ratio, present, self.l1_step,
                          job_ms, self.balance.static)
        incs = self._diag.update(obs)
        self.impact.push(iteration, it_med / 1000.0)
        self.recovery.push(iteration, time_ms, it_med / 1000.0)
        # every open incident's cost grows with the iteration: it is written again
        touched = {i.id: i for i in incs} | {i.id: i for i in self._diag.incidents if i.is_open}
        for inc in touched.values():
            self.impact.update(inc, iteration, time_ms, self.window, self.stages)
            inc.updated_ms = time_ms   # what a restarted analyzer need not count again
        for inc in self._diag.incidents:   # timelines and recoveries, of the resolved ones too
            if self.recovery.update(inc, iteration, time_ms, it_med / 1000.0):
                touched[inc.id] = inc
        incs = list(touched.values())
        self.impact.retain({i.id for i in self._diag.incidents})
        self.recovery.retain({i.id for i in self._diag.incidents})
        self.last_scores = scores
        self.last_iteration, self.last_time_ms = iteration, time_ms
        return cps, incs

    def reconfigure(self, cfg: AnalyzerConfig) -> None:
        """New thresholds from the next iteration on, the state kept (a reload, not a restart).
        Settings of :data:`analyzer.config.RESTART_ONLY` keep their running values."""
        self.cfg = cfg
        self.recovery.cfg = cfg
        self.l1.reconfigure(cfg)
        for part in (self.ranks, self.floors, self.balance):
            part.cfg = cfg
        self._diag.reconfigure(cfg)

    def replace_placement(self, topo: Topology) -> None:
        """Follow a new rank placement (host names, nodes) of the same parallel layout, e.g. a
        node replaced after an elastic restart; incidents from here on name the new hosts."""
        if (topo.tp, topo.pp, topo.dp, topo.ep, topo.gpus_per_node) != (
                self.topo.tp, self.topo.pp, self.topo.dp, self.topo.ep, self.topo.gpus_per_node):
            raise ValueError(f"job {self.job}: the parallel layout changed ({self.topo} -> {topo}); "
                             f"a new layout needs a new analyzer")
        moved = self.topo.node_index != topo.node_index
        if self.topo.hosts and topo.hosts:   # the same node ids, other machines: moved too
            old_h, new_h = np.asarray(self.topo.hosts, dtype=object), np.asarray(topo.hosts, dtype=object)
            if len(old_h) == len(new_h):
                moved |= (old_h != new_h)[topo.node_index]
        self.topo = topo
        for part in (self.ranks, self.floors, self.balance):
            part.topo = topo
        self._diag.replace_topology(topo)
        self.recovery.note_placement(topo, self._diag.incidents, self.last_time_ms)
        self.ranks.baseline.forget(moved)   # another GPU under those ranks: their own past is not theirs

    def restarted(self) -> None:
        """The job restarted from a checkpoint (same layout): each rank's own baseline starts
        afresh (processes, communicators and often GPUs are new); the job's L1 baseline and the
        incidents carry over."""
        self.ranks.baseline.forget()
        self.recovery.note_restart(self.last_time_ms)

    def note_actions(self, drains: dict[str, int], now_ms: int) -> list[Incident]:
        """The first drain done on each held incident (``drains``: id -> epoch ms, from the
        ``action`` points) and how long a drained job has waited to recover; those changed."""
        return self.recovery.note_actions(self._diag.incidents, drains, now_ms)

    # ------------------------------------------------- the job's incidents
    def incidents(self) -> list[Incident]:
        """Open and recently resolved incidents held in memory (all of them live in the store)."""
        return self._diag.incidents

    def adopt(self, incidents: list[Incident]) -> None:
        """Continue the incidents of a previous analyzer (read back from the store): iterations
        replayed up to their last update neither resolve them nor add to their cost again."""
        self._diag.adopt(incidents)
        for inc in incidents:
            if inc.is_open:
                self.impact.adopt(inc)

    def note_kernels(self, findings: pd.DataFrame, gaps: pd.DataFrame) -> list[Incident]:
        """What the kernel windows found (L3): launch gaps (``gaps``, with the analyzer's
        ``step``) make the transient stalls they explain host-side
        (:mod:`analyzer.diagnosis.host_gaps`); confirmed kernels on an open incident's culprits
        join its evidence (:mod:`analyzer.diagnosis.kernel_evidence`). The incidents changed."""
        changed = {i.id: i for i in explain_stalls(self._diag.incidents, gaps)}
        changed.update({i.id: i for i in attach_kernels(self._diag.incidents, findings)})
        return list(changed.values())

    def add_events(self, events: list[OutOfBandEvent]) -> None:
        """Out-of-band events to judge against the incidents."""
        self._diag.add_events(events)

    def event_horizon_ms(self) -> int | None:
        """Events older than this cannot change any verdict (None: read them all)."""
        return self._diag.event_horizon(self.window)

    @property
    def reporting_ranks(self) -> int:
        """Ranks that have reported at least once (0 before the first iteration)."""
        return self._diag.reporting_ranks

    @property
    def events_held(self) -> int:
        """Out-of-band events held in memory (bounded)."""
        return self._diag.events_held

    def health_row(self, late_points: int = 0) -> dict:
        """The job's ``job_health`` point: how complete its data is (points expected from the
        ranks that reported once, against points received; points that came after their
        iteration was analyzed) and the sporadic stalls that were noise, not incidents
        (:class:`~analyzer.diagnosis.health.DiagnosisHealth`)."""
        return self._diag.health.row(self.job, self.last_time_ms, self.last_iteration, late_points)

    def l2_frames(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """``l2_kind``, ``l2_group`` and ``l2_rank`` points for the latest window."""
        if self.last_scores is None or not len(self.window):
            return pd.DataFrame(), pd.DataFrame(), pd.DataFrame()
        med = window_medians(self.window.recent(self.cfg.l2_window))
        r = l2_rank_frame(self.job, self.topo, self.stages, med, self.last_scores, self.ranks.ref_kind,
                          self.last_time_ms, self.cfg)
        k, g = l2_frames(self.job, self.topo, self.stages, med, self.last_time_ms, self.cfg, r)
        return k, g, r
