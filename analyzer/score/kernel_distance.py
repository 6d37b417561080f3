"""Per kernel, each rank's Wasserstein-1 distance to its own parallel group's reference (L3).

ARGUS (arXiv 2606.20374) scores a rank by its mean W1 distance to all the other ranks: O(ranks^2),
minutes at 10,000 ranks. Here each rank's distribution of one kernel (the log-normal mixture its
modes describe: :mod:`rankscope.kernel_mixture`) is compared with its group's reference, the
pointwise median of the group's quantile functions: O(ranks x quantiles), in closed form (no
grid over durations, so a narrow mode is as sharp as a wide one). On the body's quantiles,

    W1(r) = mean over u <= trim of |Q_r(u) - Q_ref(u)|,   shift(r) = mean of (Q_r(u) - Q_ref(u))

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
points: quantiles (evenly spaced up to ``trim``) the distributions are compared at (default 16).
fence: how many robust sigmas above the median distance a rank is an outlier (default 5).
min_sigma: the smallest sigma of the relative distances (default 0.02).
min_shift: how much slower than its group's median an outlier is at least (default 0.1).
trim: the distances are over the quantiles up to this one (default 0.9): a degraded kernel moves
    its whole distribution, while a few events stretched by the host (a preempted thread, a JIT
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

import warnings
from dataclasses import dataclass

import numpy as np

from analyzer.detect.fast_median import nanmedian
from rankscope.kernel_mixture import mixture_quantiles


@dataclass
class KernelDistances:
    """Scores over the ranks, arrays ``[R]`` for one kernel or ``[K, R]`` for several (NaN: the
    rank has no event of it)."""

    w1_us: np.ndarray        # W1 to the group's reference (us)
    shift_us: np.ndarray     # how much slower than the reference on average (us; < 0: faster)
    ref_median_us: np.ndarray  # the group reference's median (us)
    outlier: np.ndarray      # bool: beyond the fence and slower


#: Kernels scored in one pass: their quantiles (ranks x kernels x quantiles) stay a few MB.
CHUNK_KERNELS = 16
#: Members of a group its reference is the median of, at most (evenly spread over the group);
#: a kernel fewer than ``MIN_SAMPLED`` of them ran takes all the group's members.
REF_MEMBERS = 255
MIN_SAMPLED = 64


def kernel_distances(count: np.ndarray, p50: np.ndarray, p99: np.ndarray, members: np.ndarray,
                     group_ids: np.ndarray, points: int = 16, fence: float = 5.0,
                     min_shift: float = 0.1, min_sigma: float = 0.02, trim: float = 0.9) -> KernelDistances:
    """Distances of every rank's kernel distribution (modes ``[R, M]``, NaN-padded; or ``[K, R, M]``
    for K kernels: a kernel no rank ran has NaN scores) to its group's (``members`` ``[G, k]``,
    ``group_ids`` ``[R]``: each rank's group), and the outliers."""
    one = count.ndim == 2
    if one:
        count, p50, p99 = count[None], p50[None], p99[None]
        if not (np.isfinite(count) & (count > 0) & np.isfinite(p50) & np.isfinite(p99)).any():
            raise ValueError("no rank has a mode of this kernel")
    u = np.r_[(np.arange(points) + 0.5) / points * trim, 0.5]   # the body's quantiles, and the median
    parts = [_distances(count[i:i + CHUNK_KERNELS], p50[i:i + CHUNK_KERNELS], p99[i:i + CHUNK_KERNELS],
                        members, group_ids, u) for i in range(0, len(count), CHUNK_KERNELS)]
    w1, shift, ref_med = (np.concatenate([p[j] for p in parts]) for j in range(3))   # [K, R]
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rel = w1 / ref_med
        center = nanmedian(rel, axis=1, keepdims=True)
        sigma = np.maximum(1.4826 * nanmedian(np.abs(rel - center), axis=1, keepdims=True), min_sigma)
        outlier = (rel > center + fence * sigma) & (shift >= min_shift * ref_med)
    out = (w1, shift, ref_med, outlier)
    return KernelDistances(*(a[0] for a in out)) if one else KernelDistances(*out)


def _distances(count: np.ndarray, p50: np.ndarray, p99: np.ndarray, members: np.ndarray, group_ids: np.ndarray,
               u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W1, shift and the reference's median ``[K, R]`` of a few kernels (``[K, R, M]``), laid out
    rank-major so that a group's members are contiguous blocks. The reference of a group of more
    than ``REF_MEMBERS`` is the median of that many of its members, evenly spread over it: the
    median of 255 of 1,440 ranks is within a tenth of a sigma of all of theirs, at a sixth of the
    cost."""
    k, r, m = count.shape
    rk = lambda a: np.ascontiguousarray(a.transpose(1, 0, 2)).reshape(r * k, m)   # noqa: E731
    q = mixture_quantiles(rk(count), rk(p50), rk(p99), u).reshape(r, k, len(u))
    size = members.shape[1]
    if size <= REF_MEMBERS:
        ref = nanmedian(q[members], axis=1)                      # [G, K, U + 1]
    else:
        picked = q[members[:, np.linspace(0, size - 1, REF_MEMBERS).astype(int)]]
        ref = nanmedian(picked, axis=1)
        # a kernel few of the sampled members ran: its reference from all the group's members
        for g, j in zip(*np.nonzero(np.isfinite(picked[..., 0]).sum(axis=1) < MIN_SAMPLED), strict=True):
            ref[g, j] = nanmedian(q[members[g], j], axis=0)
    ref = ref[group_ids]                                         # [R, K, U + 1]
    diff = q[..., :-1] - ref[..., :-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        w1, shift = np.abs(diff).mean(axis=2), diff.mean(axis=2)
    return w1.T, shift.T, ref[..., -1].T
