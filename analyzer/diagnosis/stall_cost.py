"""What a transient stall cost: the job's excess beyond its own jitter, and the stalled cells' loss.

A job that stalls sporadically somewhere every iteration jitters by the largest stall of each;
a stall within that jitter cost nothing the job does not pay anyway. :class:`JobLevels` keeps
the job's recent iteration times and measures a stall's cost against them
(:meth:`JobLevels.cost`); :func:`lost_ms` is the upper bound of a noise stall's cost, counted
in the sporadic-stall tally.
"""

from __future__ import annotations

import warnings
from collections import deque

import numpy as np

from analyzer.detect.window import Window


class JobLevels:
    """The job's last ``keep`` iteration times (ms), and the cost of a stall measured on them."""

    def __init__(self, keep: int):
        self.job_ms: deque[tuple[int, float]] = deque(maxlen=keep)

    def push(self, iteration: int, job_ms: float) -> None:
        self.job_ms.append((iteration, job_ms))

    def cost(self, onset: int, end: int, min_history: int, world: int) -> tuple[float, float]:
        """What iterations ``[onset, end)`` cost the job beyond its own jitter: the largest
        excess of its iteration time over the higher of the level before ``onset`` (the median
        of the last three iterations) and ``end``'s (the first without the stall: when the whole
        job stepped up, e.g. a straggler elsewhere began, that step is not the stall's cost),
        plus 3 robust sigmas of the recent iteration-to-iteration jitter (over at least
        ``min_history`` iterations); as a fraction of that level, and summed in GPU-hours of
        ``world`` GPUs."""
        hist = {it: ms for it, ms in self.job_ms if np.isfinite(ms)}
        n = max(3, min_history)
        before = np.array([ms for it, ms in hist.items() if it < onset][-n:])
        during = np.array([ms for it, ms in hist.items() if onset <= it < end])
        if len(before) < n or not len(during):
            return 0.0, 0.0   # no reference yet: not a cost anybody can state
        base = max(float(np.median(before[-3:])), hist.get(end, 0.0))
        if base <= 0:
            return 0.0, 0.0
        d = np.diff(before)
        sigma = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2)
        excess = np.maximum(during - base - 3 * sigma, 0.0)
        return float(excess.max() / base), float(excess.sum() * world / 3.6e6)


def lost_ms(win: Window, ranks: np.ndarray, s: int, onset: int, end: int) -> float:
    """What the stalled cells (``ranks`` in stage ``s``, iterations ``[onset, end)``) lost against
    their iteration's median (the upper bound of a noise stall's cost: the job waits for it in
    full)."""
    v = win.values[win.since(onset, end)][:, :, s]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # an iteration the stage is absent
        lost = np.nanmax(v[:, ranks] - np.nanmedian(v, axis=1)[:, None], axis=1)
    return float(np.nansum(np.maximum(lost, 0.0)))
