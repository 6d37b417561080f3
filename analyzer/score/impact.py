"""What each incident costs: the iteration-time excess, the GPU-hours lost, and a what-if.

The job's iteration time is the median over its ranks of each iteration's time
(in a synchronous job every rank waits for the slowest). For an incident:

- ``iteration_s_before``: the median job iteration time over the (up to
  :data:`BEFORE_ITERATIONS`) iterations before its onset, fixed once known;
- ``iteration_s_now``: the median over its last :data:`NOW_ITERATIONS` iterations
  (up to its resolution);
- ``gpu_hours_lost``: world size x the excess of every iteration from the onset to
  the resolution over the level before, in hours; summed signed (noise cancels; the
  running total is floored at zero), iteration by iteration as they come, final at
  resolution; an intermittent fault's later episodes add to it, the first is not counted
  twice. Concurrent incidents each count the whole job's excess (their culprits share it):
  their figures do not add up;
- ``iteration_s_if_restored``: what the job would take if the culprits ran at their
  group's median now. Under the additive model of a critical path, the job's excess
  scales with the culprits' own excess in the incident's stage:
  ``now - (now - before) * (culprit_now - peers_now) / (culprit_now - culprit_before)``
  (the fraction clipped to [0, 1]): if the peers are as fast as the culprits used to
  be, the job would be back at its old level; if the peers slowed too, part of the
  excess is theirs and stays. For a link degradation the whole excess is the link's (every
  member of its collectives waits alike, so there is no peer to compare with).

Example::

    >>> t = ImpactTracker(world=8)
    >>> for i, s in enumerate([30.0] * 5 + [90.0] * 3):
    ...     t.push(i, s)
    >>> round(t.level_before(5), 1), round(t.excess_gpu_hours(5, 8, 30.0), 3)
    (30.0, 0.4)
"""

from __future__ import annotations

import warnings
from collections import deque

import numpy as np

from analyzer.detect.window import Window
from rankscope.incident import Impact, Incident, IncidentClass
from rankscope.schema import StageSet

#: Iterations before the onset whose median is the level before.
BEFORE_ITERATIONS = 20
#: Latest iterations whose median is the level now.
NOW_ITERATIONS = 10
#: Job iteration times remembered (enough for the longest lookback above, with margin).
KEEP_ITERATIONS = 512


class ImpactTracker:
    """The job's iteration times and, per open incident, the cost accounted so far."""

    def __init__(self, world: int, keep: int = KEEP_ITERATIONS):
        self.world = world
        self._times: deque[tuple[int, float]] = deque(maxlen=keep)
        self._accounted: dict[str, int] = {}          # incident id -> last iteration counted
        self._culprit_before: dict[str, float] = {}   # incident id -> culprits' stage level before
        self._replayed: dict[str, int] = {}           # adopted incident id -> time already accounted

    def adopt(self, inc: Incident) -> None:
        """An incident read back after a restart: its cost up to ``inc.updated_ms`` is in its
        record already; iterations replayed up to then add nothing again."""
        self._replayed[inc.id] = int(inc.updated_ms)

    def push(self, iteration: int, job_s: float) -> None:
        """One iteration's job iteration time (seconds; NaN when nobody reported)."""
        if np.isfinite(job_s):
            self._times.append((int(iteration), float(job_s)))

    def _series(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._times:
            return np.empty(0, np.int64), np.empty(0)
        it, s = zip(*self._times, strict=True)
        return np.asarray(it, dtype=np.int64), np.asarray(s, dtype=float)

    def level_before(self, onset: int) -> float:
        """Median job iteration time over the iterations before ``onset`` (NaN if none kept)."""
        it, s = self._series()
        before = s[it < onset][-BEFORE_ITERATIONS:]
        return float(np.median(before)) if len(before) else float("nan")

    def level_during(self, onset: int, end: int | None) -> float:
        """Median over the last iterations from ``onset`` (to ``end``, exclusive)."""
        it, s = self._series()
        m = it >= onset
        if end is not None and end >= 0:
            m &= it < end
        during = s[m][-NOW_ITERATIONS:]
        return float(np.median(during)) if len(during) else float("nan")

    def excess_gpu_hours(self, first: int, last: int, before_s: float) -> float:
        """World size x the summed excess over ``before_s`` of iterations ``first..last``, in hours."""
        it, s = self._series()
        m = (it >= first) & (it <= last)
        return float(self.world * np.sum(s[m] - before_s) / 3600.0)

    # ------------------------------------------------------------ per incident
    def update(self, inc: Incident, iteration: int, time_ms: int, win: Window, stages: StageSet) -> None:
        """Bring ``inc.impact`` up to ``iteration`` (call once per iteration while it is open,
        and once when it resolves)."""
        imp = inc.impact
        if inc.id in self._replayed:
            if time_ms <= self._replayed[inc.id]:
                self._accounted[inc.id] = iteration   # counted by the analyzer before the restart
                return
            del self._replayed[inc.id]
        if not np.isfinite(imp.iteration_s_before):
            imp.iteration_s_before = self.level_before(inc.onset_iteration)
        end = inc.resolved_iteration if inc.resolved_iteration >= 0 else None
        now = self.level_during(inc.last_onset, end)   # the latest episode of an intermittent fault
        if np.isfinite(now):
            imp.iteration_s_now = now
        before = imp.iteration_s_before
        if np.isfinite(before) and before > 0:
            last = iteration if end is None else end - 1
            first = max(inc.onset_iteration, self._accounted.get(inc.id, inc.onset_iteration - 1) + 1)
            if last >= first:
                imp.gpu_hours_lost = max(0.0, imp.gpu_hours_lost + self.excess_gpu_hours(first, last, before))
                self._accounted[inc.id] = last
            if np.isfinite(imp.iteration_s_now):
                imp.slowdown = imp.iteration_s_now / before
                imp.iteration_s_if_restored = self._if_restored(inc, imp, win, stages)
        if not inc.is_open:
            self._replayed.pop(inc.id, None)

    def retain(self, ids: set[str]) -> None:
        """Forget the incidents the analyzer no longer holds (their accounting is final). The
        accounting of a resolved incident is kept while it is held: it may reopen, and its
        next episode must not count the first one again."""
        for table in (self._accounted, self._culprit_before, self._replayed):
            for key in [k for k in table if k not in ids]:
                del table[key]

    def _if_restored(self, inc: Incident, imp: Impact, win: Window, stages: StageSet) -> float:
        now, before = imp.iteration_s_now, imp.iteration_s_before
        if inc.cls == IncidentClass.LINK_DEGRADATION:
            # every member of the culprits' collectives waits for the slow transfer alike, so
            # peers are no reference: the excess is the link's, the job would be back where it was
            return before
        if not inc.stage or inc.stage not in stages or not inc.ranks or not len(win):
            return float("nan")
        s = stages.index(inc.stage)
        ranks = np.asarray(inc.ranks, dtype=np.int64)
        values = win.values[:, :, s]                                     # [T, R]
        it = win.iterations
        peers = np.setdiff1d(np.asarray(inc.group_ranks or [], dtype=np.int64), ranks)
        if not len(peers):
            peers = np.setdiff1d(np.arange(values.shape[1]), ranks)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if inc.id not in self._culprit_before:
                pre = values[it < inc.onset_iteration][:, ranks]
                if pre.size:
                    self._culprit_before[inc.id] = float(np.nanmedian(pre))
            during = it >= inc.onset_iteration
            if inc.resolved_iteration >= 0:
                during &= it < inc.resolved_iteration
            if not during.any():
                return imp.iteration_s_if_restored
            culprit_now = float(np.nanmedian(values[during][:, ranks]))
            peers_now = float(np.nanmedian(values[during][:, peers]))
        culprit_before = self._culprit_before.get(inc.id, peers_now)
        rise = culprit_now - culprit_before
        if not (np.isfinite(rise) and np.isfinite(peers_now)) or rise <= 0:
            return now
        share = float(np.clip((culprit_now - peers_now) / rise, 0.0, 1.0))
        return now - (now - before) * share
