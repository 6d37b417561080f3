"""L2 statistics inside parallel groups, for every group and stage at once.

Pure functions over a per-rank matrix ``values[rank, stage]`` and a group
member matrix ``members[group, size]`` (from :meth:`Topology.members`): all
groups of one kind have the same size, so every statistic is a reduction
along axis 1 of ``values[members]`` — no loop over groups or ranks.

Example::

    >>> import numpy as np
    >>> from rankscope.topology import Topology
    >>> t = Topology(tp=1, pp=1, dp=8, ep=4, gpus_per_node=4)
    >>> v = np.full((8, 1), 40.0); v[5] = 228.0
    >>> s = group_stats(v, t.members("ep"))
    >>> s.median[:, 0].tolist(), s.cv[:, 0].round(2).tolist()
    ([40.0, 40.0], [0.0, 0.94])
    >>> float(ratio_to_group(v, t.members("ep"), t.group_ids("ep"))[5, 0])
    5.7
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from analyzer.detect.fast_median import nanmedian, nanquantile

MAD_TO_SIGMA = 1.4826


@dataclass
class GroupStats:
    """Per group and stage (arrays ``[n_groups, n_stages]``)."""

    mean: np.ndarray
    median: np.ndarray
    std: np.ndarray
    cv: np.ndarray
    min: np.ndarray
    max: np.ndarray
    count: np.ndarray


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)


def group_stats(values: np.ndarray, members: np.ndarray) -> GroupStats:
    """Mean, median, std, coefficient of variation, min, max of every group (NaN-aware)."""
    g = values[members]  # [G, size, S]
    mean = _quiet(np.nanmean, g, axis=1)
    std = _quiet(np.nanstd, g, axis=1)
    return GroupStats(
        mean=mean,
        median=_quiet(nanmedian, g, axis=1),
        std=std,
        cv=_quiet(np.divide, std, mean),
        min=_quiet(np.nanmin, g, axis=1),
        max=_quiet(np.nanmax, g, axis=1),
        count=np.sum(np.isfinite(g), axis=1),
    )


def group_medians(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Median of every group and stage, ``[G, S]``."""
    return _quiet(nanmedian, values[members], axis=1)


#: Groups up to this size get each member's exact leave-one-out median (a k x k mask per group);
#: in larger ones a member moves its group's median by a rank at most, and the median is taken.
EXACT_MATES = 16


def mates_medians(values: np.ndarray, members: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """For every rank and column, the median of the *other* members of its group, ``[R, S]``:
    in a group of two a member's partner (where the group's median, their mean, says little)."""
    k = members.shape[1]
    if k > EXACT_MATES:
        return group_medians(values, members)[group_ids]
    g = values[members]                                              # [G, k, S]
    others = np.where(np.eye(k, dtype=bool)[None, :, :, None], np.nan, g[:, None, :, :])   # [G, k, k, S]
    med = _quiet(np.nanmedian, others, axis=2)                       # [G, k, S]
    out = np.full(values.shape, np.nan)
    out[members.reshape(-1)] = med.reshape(-1, values.shape[1])
    return out


def group_quantiles(values: np.ndarray, members: np.ndarray, q: float) -> np.ndarray:
    """Quantile ``q`` of every group and stage, ``[G, S]``."""
    return _quiet(nanquantile, values[members], q, axis=1)


def ratio_to_group(values: np.ndarray, members: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """Each rank's value over its group's median, ``[R, S]`` (NaN where undefined)."""
    med = group_medians(values, members)
    return _quiet(np.divide, values, med[group_ids])


def robust_sigma(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """1.4826 * MAD along ``axis`` (NaN-aware)."""
    med = _quiet(nanmedian, x, axis=axis, keepdims=True)
    return MAD_TO_SIGMA * _quiet(nanmedian, np.abs(x - med), axis=axis)


#: Rows used to estimate a noise scale across ranks: a fixed, evenly spread
#: sample of 1,024 estimates a MAD within a few percent and costs a twelfth of 12,960.
SIGMA_SAMPLE = 1024


def sampled_sigma(x: np.ndarray) -> np.ndarray:
    """:func:`robust_sigma` along axis 0 on an evenly spread sample of at most SIGMA_SAMPLE rows."""
    if x.shape[0] > SIGMA_SAMPLE:
        x = x[np.linspace(0, x.shape[0] - 1, SIGMA_SAMPLE).astype(np.int64)]
    return robust_sigma(x, axis=0)


#: The lower tail :func:`lower_sigma` reads: the ranks at these shares of a column, sorted.
LOWER_QUANTILES = (0.05, 0.30)


def _blom(i: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The expected standard normal value of the ``i``-th smallest (1-based) of ``n`` (Blom 1958)."""
    inv = np.vectorize(lambda p: NormalDist().inv_cdf(float(p)), otypes=[float])
    return inv((i - 0.375) / (n + 0.25))


def lower_sigma(x: np.ndarray) -> np.ndarray:
    """The noise scale of each column of ``x`` ``[R, S]`` from the lower tail of its ranks: the
    distance between the ranks at its 5th and 30th percentiles, over the distance the same
    order statistics of as many standard normal values have (Blom's scores, so a column of 8
    ranks is read as fairly as one of 10,000; fewer than 4: the MAD).

    Slowness moves ranks one way only (up), so ranks that went slow, up to 70% of them, leave
    these order statistics to the others: half a small job (one node of two) slowing at once
    cannot widen it, where the MAD becomes the gap between the two halves (50% is its breakdown
    point: Rousseeuw and Croux, JASA 1993). With half of the ranks out it reads the rest's
    spread somewhat too wide (a conservative error); noise that grows for the whole job widens
    the lower tail too and is followed at once. An evenly spread sample of at most SIGMA_SAMPLE rows."""
    if x.shape[0] > SIGMA_SAMPLE:
        x = x[np.linspace(0, x.shape[0] - 1, SIGMA_SAMPLE).astype(np.int64)]
    n = np.sum(np.isfinite(x), axis=0)
    srt = np.sort(x, axis=0)                                     # NaN last
    lo = np.clip(np.rint(LOWER_QUANTILES[0] * (n + 0.25) + 0.375), 1, np.maximum(n, 1)).astype(np.int64)
    hi = np.clip(np.rint(LOWER_QUANTILES[1] * (n + 0.25) + 0.375), 1, np.maximum(n, 1)).astype(np.int64)
    cols = np.arange(x.shape[1])
    span = _blom(hi, np.maximum(n, 1)) - _blom(lo, np.maximum(n, 1))
    with np.errstate(all="ignore"):
        out = (srt[hi - 1, cols] - srt[lo - 1, cols]) / span
    return np.where(n >= 4, out, robust_sigma(x, axis=0))
