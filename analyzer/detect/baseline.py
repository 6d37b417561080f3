"""Temporal baseline: where each cell (rank x stage, or group x stage) normally sits.

An exponentially weighted mean of a log quantity (e.g. a rank's log ratio to
its group median) that learns only from cells marked normal, so a fault does
not become the new normal while it lasts. A GPU that has always been 5% slow
has a baseline of log(1.05) and is not a new straggler; one that just became
20% slower stands 0.18 above its baseline.

Parameters
----------
shape: shape of the tracked array.
alpha: weight of a new value (default 0.1: about 10 iterations of memory).
warmup: values a cell needs before its baseline is trusted (default 5);
    until then :meth:`deviation` is measured against 0 (the group norm).

Example::

    >>> import numpy as np
    >>> b = Baseline((2,), alpha=0.5, warmup=2)
    >>> for _ in range(4):
    ...     b.update(np.log([1.05, 1.0]), learn=np.array([True, True]))
    >>> np.exp(b.deviation(np.log([1.05, 1.2]))).round(2).tolist()
    [1.0, 1.2]
"""

from __future__ import annotations

import numpy as np


class Baseline:
    """EWMA of a log quantity per cell, frozen where a cell is anomalous."""

    def __init__(self, shape: tuple[int, ...], alpha: float = 0.1, warmup: int = 5):
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha, self.warmup = alpha, warmup
        self.mean = np.zeros(shape)
        self.var = np.zeros(shape)
        self.count = np.zeros(shape, dtype=np.int64)

    def update(self, x: np.ndarray, learn: np.ndarray) -> None:
        """Learn ``x`` where ``learn`` (and x finite); the first value seeds the cell."""
        take = learn & np.isfinite(x)
        first = take & (self.count == 0)
        # a faster start: the weight of a new value is at least 1/count
        w = np.maximum(self.alpha, 1.0 / np.maximum(self.count + 1, 1))
        d = np.nan_to_num(x) - self.mean
        self.mean = np.where(first, x, np.where(take, self.mean + w * d, self.mean))
        # exponentially weighted variance (West 1979 / Finch 2009 incremental form)
        self.var = np.where(first, 0.0, np.where(take, (1 - w) * (self.var + w * d * d), self.var))
        self.count = self.count + take

    def forget(self, cells: np.ndarray | None = None) -> None:
        """Start ``cells`` (a mask or index over the first axis; None: all) afresh: what they
        learned no longer holds (another GPU under a rank after a node swap)."""
        sel = slice(None) if cells is None else cells
        self.mean[sel], self.var[sel], self.count[sel] = 0.0, 0.0, 0

    def sigma(self) -> np.ndarray:
        """Exponentially weighted standard deviation of the learned values."""
        return np.sqrt(self.var)

    def trusted(self) -> np.ndarray:
        return self.count >= self.warmup

    def deviation(self, x: np.ndarray) -> np.ndarray:
        """``x`` minus the baseline where trusted, else minus 0."""
        return x - np.where(self.trusted(), self.mean, 0.0)
