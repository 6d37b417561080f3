"""Per kernel, each rank's time per step against its group's (L3, beside the distribution distance).

A kernel's time per step is the median over a window's steps of the sum of its events in each
(``<id>_step_us``, written by the kernel channel where the steps are known). When one of several
calls of an operator of the same name (the same ``aten::mm`` on other shapes) turns slower, its
distribution turns bimodal with a part of its mass moved, which the distance over the body
(:mod:`analyzer.score.kernel_distance`) reads as a share of that move; the step's total carries
it whole, every step. A call a busy host preempted stretches one step's total only, which a low quantile over the steps drops. Both are scored; a rank is a finding when either stands out.

The test: each rank's time per step over its group's median (``ratio``), in logs; outliers are
the ranks beyond the job's ``median + fence * sigma`` of those logs (scaled MAD, at least
``min_sigma``) that are at least ``min_shift`` slower than their group.

Example (rank 5 calls it three times a step, one call now 3x slower)::

    >>> import numpy as np
    >>> step = np.full((1, 8), 600.0); step[0, 5] = 1000.0
    >>> s = step_outliers(step, np.arange(8).reshape(1, 8), np.zeros(8, dtype=int))
    >>> np.flatnonzero(s.outlier[0]).tolist(), round(float(s.ratio[0, 5]), 2)
    ([5], 1.67)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from analyzer.detect.fast_median import nanmedian


@dataclass
class StepScores:
    """``[K, R]``: each rank's time per step over its group's median, that median (us), outliers."""

    ratio: np.ndarray
    ref_us: np.ndarray
    outlier: np.ndarray


def step_outliers(step_us: np.ndarray, members: np.ndarray, group_ids: np.ndarray, fence: float = 5.0,
                  min_shift: float = 0.1, min_sigma: float = 0.02) -> StepScores:
    """The outliers of ``step_us`` ``[K, R]`` (NaN: no time per step) against each rank's group
    (``members`` ``[G, k]``, ``group_ids`` ``[R]``)."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        v = np.where(step_us > 0, step_us, np.nan)
        ref = nanmedian(v[:, members], axis=2)[:, group_ids]          # [K, R]
        ratio = v / ref
        lr = np.log(ratio)
        center = nanmedian(lr, axis=1, keepdims=True)
        sigma = np.maximum(1.4826 * nanmedian(np.abs(lr - center), axis=1, keepdims=True), min_sigma)
        outlier = (lr > center + fence * sigma) & (ratio >= 1.0 + min_shift)
    return StepScores(ratio, ref, outlier)
