"""Stalls that keep coming back, or come wide or long: the Poisson tests that tell a fault from chance.

A job that stalls sporadically on random ranks sees some rank stall twice or three times
close together by chance alone: at 0.2% of rank-iterations, 3 stalls of one of 12,960 ranks
within 20 iterations happen in most 150-iteration runs. A rank's stalls are a repeat only when
they come more often than the job's own stall rate makes likely on *some* rank
(:func:`repeats_needed`). The same chance tells a stall of several GPUs side by side, or of one
GPU for several iterations in a row, from sporadic stalls that happened to meet
(:func:`wide_or_long`): a 12,960-rank job sees two neighbours stall together every few
iterations, an 8-rank job almost never. :class:`StallRepeats` counts each rank's recent stalls
and the job's rate, leaving out the ranks being judged (a GPU that stalls often must not raise
its own bar). Every test asks the same of a job of any size: that chance explains the stall on
no rank (or place) of the whole job with probability ``stall_repeat_alpha``.
"""

from __future__ import annotations

import math

import numpy as np


def poisson_tail(k: int, lam: float) -> float:
    """P(X >= k) for X ~ Poisson(lam).

        >>> round(poisson_tail(1, 1.0), 4)
        0.6321
    """
    term, cdf = math.exp(-lam), 0.0
    for i in range(k):
        cdf += term
        term *= lam / (i + 1)
    return max(0.0, 1.0 - cdf)


def repeats_needed(rate: float, window: int, world: int, least: int, alpha: float) -> int:
    """Stalls of one rank, each within ``window`` iterations of the last, that chance explains
    on no rank of ``world`` (probability below ``alpha``, the ``stall_repeat_alpha`` setting)
    when a rank-iteration stalls at ``rate``; at least ``least``.

        >>> repeats_needed(0.0, 20, 12_960, 3, 0.01), repeats_needed(0.002, 20, 12_960, 3, 0.01)
        (3, 7)
    """
    k = max(1, int(least))
    while k < 100:
        lam = rate * window * (k - 1)   # the span k stalls chained by gaps of ``window`` may cover
        if world * poisson_tail(k - 1, lam) <= alpha:
            return k
        k += 1
    return k


def wide_or_long(units: int, iterations: int, rate: float, place: int, places: int, alpha: float,
                 span: int = 1) -> bool:
    """Whether a stall of ``units`` TP groups side by side (one place of ``place`` TP groups, of
    ``places`` in the job), seen for ``iterations`` iterations in a row, is more than sporadic
    stalls at ``rate`` per TP group and iteration explain: that many stalling together (their
    onsets within ``span`` iterations, as the stall was gathered), or one of them again in each
    next iteration, has probability at most ``alpha`` on any place of the job.

        >>> wide_or_long(2, 1, 0.0, 16, 64, 0.01), wide_or_long(2, 1, 0.002, 16, 12_960, 0.01)
        (True, False)
        >>> wide_or_long(1, 2, 0.002, 16, 8, 0.01), wide_or_long(1, 3, 0.002, 16, 8, 0.01)
        (False, True)
        >>> wide_or_long(2, 1, 0.0001, 16, 6, 0.01), wide_or_long(2, 1, 0.0001, 16, 6, 0.01, span=7)
        (True, False)
    """
    wide = units >= 2 and places * poisson_tail(units - 1, rate * max(place - 1, 0) * max(span, 1)) <= alpha
    long = iterations >= 2 and places * rate ** (iterations - 1) <= alpha
    return bool(wide or long)


class StallRepeats:
    """Each rank's stalls in a row (at most ``window`` iterations apart) and the job's stall
    rate so far: ``stalled_cells`` rank-stalls seen in ``iterations`` iterations."""

    def __init__(self, world: int):
        self.world = world
        self.count = np.zeros(world, dtype=np.int64)
        self.last = np.full(world, -(10**9), dtype=np.int64)
        self.stalled_cells = 0   # rank-stalls seen (every part, incident or not)
        self.iterations = 0

    def tick(self) -> None:
        """One more iteration seen."""
        self.iterations += 1

    def rate(self, ranks: np.ndarray, iteration: int, window: int) -> float:
        """The job's stalls per rank and iteration, without ``ranks``' own stalls of the last
        ``window`` iterations (a GPU that stalls often must not raise its own bar)."""
        near = iteration - self.last[ranks] <= window
        own = int(np.where(near, self.count[ranks], 0).sum())
        others = max(1, (self.world - len(ranks)) * self.iterations)
        return max(0, self.stalled_cells - own) / others

    def repeats(self, ranks: np.ndarray, iteration: int, window: int, least: int, alpha: float) -> bool:
        """Count a stall of ``ranks``; whether one of them stalled, with at most ``window``
        iterations between stalls, as often as :func:`repeats_needed` asks at the other ranks'
        stall rate (at least ``least`` times)."""
        rate = self.rate(ranks, iteration, window)
        near = iteration - self.last[ranks] <= window
        self.count[ranks] = np.where(near, self.count[ranks] + 1, 1)
        self.last[ranks] = iteration
        self.stalled_cells += len(ranks)
        need = repeats_needed(rate, window, self.world, least, alpha)
        return bool((self.count[ranks] >= need).any())
