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
- ``iteration_s_if_restored``: what the job would take with the culprits restored, their
  excess removed with the waits it causes the others (:mod:`analyzer.score.what_if`): the
  level before, moved by what the non-culprits' own work did since the onset. NaN for the
  classes of :data:`~rankscope.incident.NO_WHAT_IF` (a silent rank reports no time to restore).

Example::

    >>> t = ImpactTracker(world=8)
    >>> for i, s in enumerate([30.0] * 5 + [90.0] * 3):
    ...     t.push(i, s)
    >>> round(t.level_before(5), 1), round(t.excess_gpu_hours(5, 8, 30.0), 3)
    (30.0, 0.4)
"""

from __future__ import annotations

from collections import deque

import numpy as np

from analyzer.detect.window import Window
from analyzer.score.what_if import Footing, footing, restored_s
from rankscope.incident import NO_WHAT_IF, Impact, Incident
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
        self._footing: dict[str, Footing] = {}        # incident id -> the non-culprits' footing before
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
        for table in (self._accounted, self._footing, self._replayed):
            for key in [k for k in table if k not in ids]:
                del table[key]

    def _if_restored(self, inc: Incident, imp: Impact, win: Window, stages: StageSet) -> float:
        if inc.cls in NO_WHAT_IF or not len(win):
            return float("nan")
        it = win.iterations
        # the culprits' and the ranks that only waited for them inside their inner groups (which
        # look slow as long as the culprits are: their excess is the culprits')
        held = np.union1d(inc.ranks, inc.waiting_ranks).astype(np.int64)
        if inc.id not in self._footing:   # once, while the window still holds the iterations before
            then = footing(win.values[it < inc.onset_iteration][-BEFORE_ITERATIONS:], held, stages)
            if then.known:
                self._footing[inc.id] = then
        during = it >= inc.last_onset
        if inc.resolved_iteration >= 0:
            during &= it < inc.resolved_iteration
        if not during.any():   # the episode has left the window: its figure stands
            return imp.iteration_s_if_restored
        now = footing(win.values[during][-NOW_ITERATIONS:], held, stages)
        return restored_s(imp.iteration_s_before, imp.iteration_s_now, self._footing.get(inc.id, Footing()), now)
