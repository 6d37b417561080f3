"""Per kernel, each rank's Wasserstein-1 distance to its own parallel group's reference (L3).

ARGUS (arXiv 2606.20374) scores a rank by its mean W1 distance to all the other ranks: O(ranks^2),
minutes at 10,000 ranks. Here each rank's distribution of one kernel (the log-normal mixture its
modes describe: :mod:`rankscope.kernel_mixture`) is compared with its group's reference, the
pointwise median of the group's CDFs on a common grid: O(ranks x grid). On durations,

    W1(r) = integral |F_r(x) - F_ref(x)| dx,   shift(r) = integral (F_ref(x) - F_r(x)) dx

(``shift`` > 0: the rank is slower than its group by that many us on average). Distances are
compared relative to the reference's median (``w1 / ref_median``), so groups and kernels of
different scales share one fence. Outliers are the ranks beyond the job's upper fence of these
relative distances, ``median + fence * sigma`` with ``sigma`` the scaled MAD (at least
``min_sigma``), that are slower than their group by at least ``min_shift`` of its median.
ARGUS uses Tukey's IQR fence; for many ranks ``median + 5 sigma`` is about as far as Tukey's
"far out" ``q3 + 3 IQR`` (4.7 sigma on normal data), but it stays defined for a job of 4 ranks,
whose ``q3`` is the outlier's own distance.

Parameters
----------
points: grid points (log-spaced over every rank's range) the CDFs are compared on (default 64).
fence: how many robust sigmas above the median distance a rank is an outlier (default 5).
min_sigma: the smallest sigma of the relative distances (default 0.02).
min_shift: how much slower than its group's median an outlier is at least (default 0.1).
trim: the distances are over the quantiles up to this one (default 0.9: ``min(F, trim)`` in the
    integrals, divided by ``trim``: means over the body's quantiles): a degraded kernel moves its
    whole distribution, while a few events stretched by the host (a preempted thread, a JIT
    compile) move only its tail, and are another finding.

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
                     group_ids: np.ndarray, points: int = 64, fence: float = 5.0,
                     min_shift: float = 0.1, min_sigma: float = 0.02, trim: float = 0.9) -> KernelDistances:
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
    ref_med = x[np.clip((ref < 0.5).sum(axis=1), 0, points - 1)]
    diff = np.minimum(ref, trim) - np.minimum(cdf, trim)         # the body: quantiles up to trim
    mid = 0.5 * (diff[:, 1:] + diff[:, :-1])
    w1 = (np.abs(mid) * dx).sum(axis=1) / trim      # means over the body's quantiles
    shift = (mid * dx).sum(axis=1) / trim
    missing = np.isnan(cdf).all(axis=1)
    w1[missing], shift[missing] = np.nan, np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = w1 / ref_med
        center = np.nanmedian(rel)
        sigma = max(1.4826 * float(np.nanmedian(np.abs(rel - center))), min_sigma)
        outlier = (rel > center + fence * sigma) & (shift >= min_shift * ref_med)
    return KernelDistances(w1, shift, ref_med, outlier)
