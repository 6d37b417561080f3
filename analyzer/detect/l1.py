"""L1: the iteration time of the job and of every rank, watched for spikes and steps.

The job series is the median over ranks of each iteration's time (in a
synchronous job every rank waits for the slowest, so the job's step is what
the operator feels); rank series catch ranks whose own iteration time moves
while the job's does not. Both go through the same
:class:`~analyzer.detect.step.StepDetector` and :class:`~analyzer.detect.spike.SpikeDetector`
(vectorised over ranks). Rank-scope change points are reported only when a
small fraction of ranks moves (``l1_rank_fraction``); when most ranks move it
is the job's change point.
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.detect.spike import SpikeDetector
from analyzer.detect.step import StepDetector

#: Updates whose iteration and time the monitor remembers (onsets are at most
#: ``persist`` or ``max_len`` updates back).
RECENT_UPDATES = 256
#: Unrecovered job steps remembered (a job that keeps stepping up does not grow the list).
MAX_OPEN_STEPS = 16


@dataclass
class ChangePoint:
    """One L1 finding (an ``l1_changepoint`` point; time = onset)."""

    job: str
    scope: str          # job | rank
    rank: int           # -1 for the job
    kind: str           # step | spike
    iteration: int
    onset_ms: int
    before_ms: float
    after_ms: float
    ranks_affected: int
    recovered_iteration: int = -1

    @property
    def magnitude(self) -> float:
        return self.after_ms / self.before_ms if self.before_ms else float("nan")

    @property
    def text(self) -> str:
        who = "job" if self.scope == "job" else f"rank {self.rank}"
        s = (f"{self.kind} of the {who}'s iteration time at iteration {self.iteration}: "
             f"{self.before_ms / 1000:.1f} s -> {self.after_ms / 1000:.1f} s ({self.magnitude:.2f}x)")
        if self.recovered_iteration >= 0:
            s += f", recovered at iteration {self.recovered_iteration}"
        return s

    def to_row(self) -> dict:
        return {"time": int(self.onset_ms), "job": self.job, "scope": self.scope, "rank": int(self.rank),
                "kind": self.kind, "iteration": int(self.iteration), "before_ms": float(self.before_ms),
                "after_ms": float(self.after_ms), "magnitude": float(self.magnitude),
                "ranks_affected": int(self.ranks_affected),
                "recovered_iteration": int(self.recovered_iteration), "text": self.text}


class L1Monitor:
    """Spike and step detection on the job's and each rank's iteration time."""

    def __init__(self, job: str, world: int, config: AnalyzerConfig | None = None):
        cfg = config or AnalyzerConfig()
        self.job, self.cfg = job, cfg
        kw = dict(window=cfg.l1_window, min_history=cfg.l1_min_history, threshold=cfg.l1_threshold,
                  min_change=cfg.l1_min_change)
        self.job_step = StepDetector(1, persist=cfg.l1_persist, **kw)
        self.job_spike = SpikeDetector(1, max_len=cfg.l1_spike_max, **kw)
        self.rank_step = StepDetector(world, persist=cfg.l1_persist, refresh_every=8, **kw)
        # (iteration, time) of the most recent updates: the detectors name onsets by update
        # count, never further back than a few updates, so a short ring is enough
        self._recent: deque[tuple[int, int]] = deque(maxlen=RECENT_UPDATES)
        self._updates = 0
        self.open_steps: list[ChangePoint] = []

    def reconfigure(self, cfg: AnalyzerConfig) -> None:
        """New alarm thresholds (``l1_threshold``, ``l1_min_change``, ``l1_rank_fraction``);
        the detectors keep their history."""
        self.cfg = cfg
        for det in (self.job_step, self.job_spike, self.rank_step):
            det.threshold, det.min_change = cfg.l1_threshold, cfg.l1_min_change

    def _at(self, index: int) -> tuple[int, int]:
        """``(iteration, time_ms)`` of the ``index``-th update (the oldest kept one if older)."""
        offset = index - (self._updates - len(self._recent))
        return self._recent[min(max(offset, 0), len(self._recent) - 1)]

    def update(self, iteration: int, time_ms: int, iteration_ms: np.ndarray) -> list[ChangePoint]:
        """Feed one iteration (per-rank iteration times, NaN where missing); new or updated points."""
        self._recent.append((int(iteration), int(time_ms)))
        self._updates += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            job_value = np.array([np.nanmedian(iteration_ms)])
        out: list[ChangePoint] = []
        st = self.job_step.update(job_value)
        sp = self.job_spike.update(job_value)
        rk = self.rank_step.update(iteration_ms)
        n_ranks = int(np.sum(np.isfinite(iteration_ms)))
        if st.confirmed[0]:
            it, t = self._at(int(st.onset_index[0]))
            moved = int(np.sum(rk.out | rk.confirmed))
            cp = ChangePoint(self.job, "job", -1, "step", it, t, float(st.before[0]), float(st.after[0]), moved)
            self.open_steps = [*self.open_steps[-(MAX_OPEN_STEPS - 1):], cp]
            out.append(cp)
        if st.recovered[0]:
            rec_it, _ = self._at(int(st.recovered_index[0]))
            for cp in self.open_steps:
                if cp.scope == "job" and cp.recovered_iteration < 0:
                    cp.recovered_iteration = rec_it
                    out.append(cp)
            self.open_steps = [c for c in self.open_steps if c.recovered_iteration < 0]
        if sp.spike[0]:
            it, t = self._at(int(sp.onset_index[0]))
            out.append(ChangePoint(self.job, "job", -1, "spike", it, t, float(sp.level[0]), float(sp.peak[0]),
                                   n_ranks))
        # ranks moving on their own
        conf = np.flatnonzero(rk.confirmed)
        if 0 < len(conf) <= self.cfg.l1_rank_fraction * max(n_ranks, 1) and not st.confirmed[0]:
            for r in conf[:100]:
                it, t = self._at(int(rk.onset_index[r]))
                out.append(ChangePoint(self.job, "rank", int(r), "step", it, t, float(rk.before[r]),
                                       float(rk.after[r]), 1))
        return out
