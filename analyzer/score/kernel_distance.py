"""Per kernel, each rank's Wasserstein-1 distance to its own parallel group's reference (L3).

ARGUS (arXiv 2606.20374) scores a rank by its mean W1 distance to all the other ranks: O(ranks^2),
minutes at 10,000 ranks. Here each rank's distribution of one kernel (the log-normal mixture its
modes describe: :mod:`rankscope.kernel_mixture`) is compared with its group's reference, the
pointwise median of the group's CDFs on a common grid: O(ranks x grid). On durations,

    W1(r) = integral |F_r(x) - F_ref(x)| dx,   shift(r) = integral (F_ref(x) - F_r(x)) dx

(``shift`` > 0: the rank is slower than its group by that many us on average). Outliers are the
ranks beyond Tukey's upper fence of the job's distances (``q3 + fence * IQR``) that are slower
than their group, and by at least ``min_shift`` of its median.

Parameters
----------
points: grid points (log-spaced over every rank's range) the CDFs are compared on (default 64).
fence: the IQR multiple of the upper fence (default 3: "far out").

Example::

    >>> import numpy as np
    >>> count = np.full((8, 1), 100.0)
    >>> p50, p99 = np.full((8, 1), 100.0), np.full((8, 1), 110.0)
    >>> p50[5], p99[5] = 150.0, 165.0                       # rank 5's kernel is 1.5x slow
    >>> d = kernel_distances(count, p50, p99, np.arange(8).reshape(1, 8), np.zeros(8, dtype=int))
    >>> np.flatnonzero(d.outlier).tolist(), round(float(d.shift_us[5]))
    ([5], 50)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.detect.group_scores import group_medians
from rankscope.kernel_mixture import log_normal_params, mixture_cdf


@dataclass
class KernelDistances:
    """One kernel's scores over the ranks, arrays ``[R]`` (NaN: the rank has no event of it)."""

    w1_us: np.ndarray        # W1 to the group's reference (us)
    shift_us: np.ndarray     # how much slower than the reference on average (us; < 0: faster)
    ref_median_us: np.ndarray  # the group reference's median (us)
    outlier: np.ndarray      # bool: beyond the fence and slower


def kernel_distances(count: np.ndarray, p50: np.ndarray, p99: np.ndarray, members: np.ndarray,
                     group_ids: np.ndarray, points: int = 64, fence: float = 3.0,
                     min_shift: float = 0.1) -> KernelDistances:
    """Distances of every rank's kernel distribution (modes ``[R, M]``, NaN-padded) to its
    group's (``members`` ``[G, k]``, ``group_ids`` ``[R]``), and the outliers."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mu, sigma = log_normal_params(p50, p99)
    seen = np.isfinite(mu) & np.isfinite(sigma) & np.isfinite(count) & (count > 0)
    if not seen.any():
        raise ValueError("no rank has a mode of this kernel")
    lo, hi = (mu - 5 * sigma)[seen].min(), (mu + 5 * sigma)[seen].max()
    grid = np.linspace(lo, hi, points)
    cdf = mixture_cdf(count, p50, p99, grid)                     # [R, X]
    ref = group_medians(cdf, members)[group_ids]                 # [R, X]
    x = np.exp(grid)
    dx = np.diff(x)
    diff = ref - cdf
    mid = 0.5 * (diff[:, 1:] + diff[:, :-1])
    w1 = (np.abs(mid) * dx).sum(axis=1)
    shift = (mid * dx).sum(axis=1)
    ref_med = x[np.clip((ref < 0.5).sum(axis=1), 0, points - 1)]
    missing = np.isnan(cdf).all(axis=1)
    w1[missing], shift[missing] = np.nan, np.nan
    q1, q3 = np.nanquantile(w1, [0.25, 0.75])
    with np.errstate(invalid="ignore"):
        outlier = (w1 > q3 + fence * (q3 - q1)) & (shift >= min_shift * ref_med)
    return KernelDistances(w1, shift, ref_med, outlier)
