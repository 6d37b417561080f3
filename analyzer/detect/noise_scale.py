"""A stage's noise scale that half a group going slow at once cannot inflate.

The scores measure how far a rank is out in robust sigmas of its stage, the sigma taken
across the job's ranks each iteration (from the lower tail of the ranks,
:func:`~analyzer.detect.group_scores.lower_sigma`, which half a job going slow cannot widen).
A stall is a change of a few iterations; the noise of a stage is not. So the sigma of an
iteration is held between the median (``quantile``) of the sigmas of the last ``memory``
iterations and ``ceiling`` times it: below, because an estimate from a few ranks that reads one
iteration too narrow must not make a rank stand out by chance; above, because a stall of up to
half that memory (a transient one lasts at most ``transient_max``, 3) must not raise the scale,
while noise that grows for real, the whole job's, is followed once it has lasted that long (in
the meantime the tail of the wider noise stands out by at most ``ceiling`` times its z).

Parameters
----------
stages: number of stages (columns) tracked.
memory: iterations of past sigmas kept (default 8).
quantile: the quantile of the past taken as its level (default 0.5, the median).
ceiling: how far above that level an iteration's sigma may go (default 2); it goes no lower than the level.
least: past sigmas needed before the cap applies (default 4).

Example::

    >>> import numpy as np
    >>> ns = NoiseScale(1)
    >>> for _ in range(8):
    ...     _ = ns.update(np.array([0.05]))
    >>> ns.update(np.array([1.9])).round(2).tolist()   # half the ranks stalled at once
    [0.1]
"""

from __future__ import annotations

import warnings

import numpy as np


class NoiseScale:
    """Each stage's recent sigmas; ``update`` with this iteration's, returns the one to use."""

    def __init__(self, stages: int, memory: int = 8, quantile: float = 0.5, ceiling: float = 2.0,
                 least: int = 4):
        if memory < least or least < 1 or ceiling < 1 or not 0 <= quantile <= 1:
            raise ValueError("NoiseScale needs memory >= least >= 1, ceiling >= 1, quantile in [0, 1]")
        self.past = np.full((memory, stages), np.nan)
        self.quantile, self.ceiling, self.least = quantile, ceiling, least
        self.n = 0

    def update(self, sigma: np.ndarray) -> np.ndarray:
        """This iteration's ``sigma`` ``[S]``, capped at ``ceiling`` times the past's level;
        the raw value is remembered (the cap is not fed back, so real growth is followed)."""
        out = np.asarray(sigma, dtype=float)
        seen = np.sum(~np.isnan(self.past), axis=0)
        if (seen >= self.least).any():
            with warnings.catch_warnings():   # a stage never seen: its level is NaN, no cap
                warnings.simplefilter("ignore", RuntimeWarning)
                level = np.nanquantile(self.past, self.quantile, axis=0)
            cap = np.where(seen >= self.least, self.ceiling * level, np.inf)
            floor = np.where(seen >= self.least, level, 0.0)
            out = np.clip(out, floor, cap)   # NaN stays NaN (no value this iteration)
        self.past[self.n % len(self.past)] = sigma
        self.n += 1
        return out
