"""A NaN-aware median that stays fast on large arrays.

``numpy.nanmedian`` falls back to masked arrays along short axes and is
~20x slower than ``numpy.median``; the analyzer takes medians over
``[groups, members, stages]`` every iteration. Without NaNs this is
``numpy.median`` (a partition); with NaNs, NaN sorts last, and the middle of
each slice's valid values is picked by index.

Example::

    >>> import numpy as np
    >>> nanmedian(np.array([[1.0, np.nan], [3.0, 4.0], [2.0, np.nan]]), axis=0).tolist()
    [2.0, 4.0]
    >>> bool(np.isnan(nanmedian(np.array([np.nan, np.nan]), axis=0)))
    True
"""

from __future__ import annotations

import numpy as np

#: Axes up to this long take the sort path (measured: 12,960 x 20 sorts in 1.4 ms,
#: ``np.median`` takes 5.7 ms).
SHORT_AXIS = 64


def nanmedian(a: np.ndarray, axis: int = 0, keepdims: bool = False) -> np.ndarray:
    """Median along ``axis`` ignoring NaN; NaN where a slice has no value."""
    a = np.asarray(a, dtype=float)
    nan = np.isnan(a)
    if not nan.any() and a.shape[axis] > SHORT_AXIS:
        return np.median(a, axis=axis, keepdims=keepdims)
    # short axes (a 20-iteration history, a 32-rank EP group): sorting is ~4x faster than
    # numpy's partition-based median; NaN sorts last either way
    s = np.sort(a, axis=axis)
    n = (~nan).sum(axis=axis, keepdims=True)
    lo = np.clip((n - 1) // 2, 0, None)
    hi = np.clip(n // 2, 0, None)
    lo = np.minimum(lo, a.shape[axis] - 1)
    hi = np.minimum(hi, a.shape[axis] - 1)
    m = 0.5 * (np.take_along_axis(s, lo, axis=axis) + np.take_along_axis(s, hi, axis=axis))
    m = np.where(n > 0, m, np.nan)
    return m if keepdims else np.squeeze(m, axis=axis)


def median3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Element-wise median of three arrays (NaN-aware: the median of the values present).

    The analyzer smooths every (rank, stage) cell over three iterations; this is
    a few element-wise min/max instead of a partition along a length-3 axis.
    """
    if not (np.isnan(a).any() or np.isnan(b).any() or np.isnan(c).any()):
        return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
    return nanmedian(np.stack([a, b, c]), axis=0)


def nanquantile(a: np.ndarray, q: float, axis: int = 0) -> np.ndarray:
    """Quantile ``q`` (linear interpolation) along ``axis`` ignoring NaN; NaN where a slice has no value."""
    a = np.asarray(a, dtype=float)
    nan = np.isnan(a)
    if not nan.any():
        return np.quantile(a, q, axis=axis)
    s = np.sort(a, axis=axis)
    n = (~nan).sum(axis=axis, keepdims=True)
    pos = q * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    frac = pos - lo
    v = (np.take_along_axis(s, lo, axis=axis) * (1 - frac) + np.take_along_axis(s, hi, axis=axis) * frac)
    v = np.where(n > 0, v, np.nan)
    return np.squeeze(v, axis=axis)
