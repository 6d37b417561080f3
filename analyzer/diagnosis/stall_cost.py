"""What a transient stall cost: the job's time lost to it, in iterations, and the stalled cells' loss.

A stall's cost is what the job lost to it: the excess of the job's iteration time over the level
around the stall, summed over the stall's iterations, as a share of that level (iterations' worth
lost). That share means the same at every size: a one-iteration 3x stall on one rank costs an
8-rank job 20-30% of one iteration, and a 12,960-rank job nothing (it waits for some rank's stall
every iteration anyway: the level holds it). An iteration counts only where the job rose beyond
its own swings (3 robust sigmas of its recent iteration times), and once: what was charged to
one incident is not charged again to a stall of the same iterations (a TP partner ending later).
:class:`JobLevels` keeps the job's recent iteration times and measures a stall's cost on them
(:meth:`JobLevels.cost`); :func:`lost_ms` is the upper bound of a noise stall's cost, counted in
the sporadic-stall tally.

Example::

    >>> lv = JobLevels(40)
    >>> for it in range(12):
    ...     lv.push(it, 100.0 + (it % 3))
    >>> lv.push(12, 130.0)   # a stall: 30% of one iteration
    >>> lv.push(13, 101.0)
    >>> [round(x, 2) for x in lv.cost(12, 13, 8, world=8)]
    [0.29, 0.0]
    >>> lv.charge(13)        # charged to an incident: a later stall of the same iteration costs nothing
    >>> lv.cost(12, 14, 8, world=8)
    (0.0, 0.0)
"""

from __future__ import annotations

import warnings
from collections import deque

import numpy as np

from analyzer.detect.window import Window

#: MAD to sigma of a normal distribution.
_MAD_SIGMA = 1.4826


def swing_sigma(ms: np.ndarray) -> float:
    """The job's own iteration-to-iteration swing (ms), robust to its sporadic stalls: the
    smaller of two robust sigmas, of the iteration times around their median (a level that drifts
    inflates it) and of their steps (a job whose iterations stall now and then, so that steps are
    mostly a stall coming or going, inflates that one)."""
    if len(ms) < 3:
        return 0.0
    d = np.diff(ms)
    of_steps = _MAD_SIGMA * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2)
    of_values = _MAD_SIGMA * float(np.median(np.abs(ms - np.median(ms))))
    return min(of_steps, of_values)


class JobLevels:
    """The job's last ``keep`` iteration times (ms), and the cost of a stall measured on them."""

    def __init__(self, keep: int):
        self.job_ms: deque[tuple[int, float]] = deque(maxlen=keep)
        self.charged = -1   # the job's time up to this iteration was charged to an incident

    def push(self, iteration: int, job_ms: float) -> None:
        self.job_ms.append((iteration, job_ms))

    def charge(self, end: int) -> None:
        """The job's time before ``end`` was charged to an incident (a stall's cost counts only
        iterations not charged yet)."""
        self.charged = max(self.charged, end - 1)

    def cost(self, onset: int, end: int, min_history: int, world: int,
             last: int | None = None) -> tuple[float, float]:
        """What a stall seen from ``onset`` to ``last`` (default ``end - 1``), over at ``end``,
        cost the job: the excess of its iteration time over the higher of the level before
        ``onset`` (the median of the last three iterations) and ``end``'s (the first without the
        stall: when the whole job stepped up, e.g. a straggler elsewhere began, that step is not
        the stall's cost), summed over the iterations ``[onset, last]`` where it rose beyond 3
        robust sigmas of the job's swing (:func:`swing_sigma`, over the iterations kept before
        ``onset``, at least ``min_history`` of them) and not charged yet; as iterations' worth of
        that level, and in GPU-hours of ``world`` GPUs."""
        last = end - 1 if last is None else min(last, end - 1)
        hist = {it: ms for it, ms in self.job_ms if np.isfinite(ms)}
        before = np.array([ms for it, ms in hist.items() if it < onset])
        during = np.array([ms for it, ms in hist.items() if max(onset, self.charged + 1) <= it <= last])
        if len(before) < max(3, min_history) or not len(during):
            return 0.0, 0.0   # no reference yet: not a cost anybody can state
        base = max(float(np.median(before[-3:])), hist.get(end, 0.0))
        if base <= 0:
            return 0.0, 0.0
        excess = during - base
        lost = float(excess[excess > 3 * swing_sigma(before)].sum())
        return lost / base, lost * world / 3.6e6


def lost_ms(win: Window, ranks: np.ndarray, s: int, onset: int, end: int) -> float:
    """What the stalled cells (``ranks`` in stage ``s``, iterations ``[onset, end)``) lost against
    their iteration's median (the upper bound of a noise stall's cost: the job waits for it in
    full)."""
    v = win.values[win.since(onset, end)][:, :, s]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # an iteration the stage is absent
        lost = np.nanmax(v[:, ranks] - np.nanmedian(v, axis=1)[:, None], axis=1)
    return float(np.nansum(np.maximum(lost, 0.0)))
