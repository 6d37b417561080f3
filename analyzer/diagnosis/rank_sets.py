"""Comparisons of rank sets the rules share: overlap, Jaccard index, distance in rank numbers.

Example::

    >>> import numpy as np
    >>> overlap(np.array([1, 2, 3]), np.array([3, 4])), jaccard(np.array([1, 2]), np.array([2, 3]))
    (0.5, 0.3333333333333333)
"""

from __future__ import annotations

import numpy as np


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Share of the smaller set that the two have in common (the overlap coefficient)."""
    if not len(a) or not len(b):
        return 0.0
    return len(np.intersect1d(a, b)) / min(len(a), len(b))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Shared over united."""
    if not len(a) and not len(b):
        return 1.0
    inter = len(np.intersect1d(a, b))
    return inter / (len(a) + len(b) - inter)


def distance(ranks: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Per rank, the distance to the nearest of ``others`` (sorted or not)."""
    if not len(others):
        return np.full(len(ranks), np.iinfo(np.int64).max)
    o = np.sort(others)
    i = np.clip(np.searchsorted(o, ranks), 1, len(o) - 1) if len(o) > 1 else np.zeros(len(ranks), np.int64)
    lo = np.abs(ranks - o[np.maximum(i - 1, 0)])
    hi = np.abs(ranks - o[i])
    return np.minimum(lo, hi)
