"""A kernel's duration distribution as its modes describe it: the record the collector writes and
the log-normal mixture the analyzer rebuilds from it (ARGUS's L3, arXiv 2606.20374).

Each mode is kept as count, p50 and p99 (:class:`Mode`); rebuilt, it is a log-normal with that
median and 99th percentile, weighted by its count. :func:`mixture_cdf` evaluates many ranks'
mixtures on one grid at once (arrays ``[rank, mode]``, NaN-padded), for the analyzer's distances.

Example::

    >>> import numpy as np
    >>> rebuild_quantiles([Mode(90, 100.0, 110.0), Mode(10, 300.0, 330.0)], [0.5, 0.95]).round(-1).tolist()
    [100.0, 300.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Bytes one mode takes when written: count (uint32), p50 and p99 (float32 each).
MODE_BYTES = 12
#: z of the 99th percentile of a normal distribution.
Z99 = 2.3263478740408408


@dataclass(frozen=True)
class Mode:
    """One mode of a kernel's durations in a window: how many events, their median and p99 (us)."""

    count: int
    p50_us: float
    p99_us: float


def normal_cdf(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF (numpy has no erf): Abramowitz and Stegun 26.2.17, error < 7.5e-8."""
    z = np.asarray(z, dtype=float)
    t = 1.0 / (1.0 + 0.2316419 * np.abs(z))
    poly = t * (0.319381530 + t * (-0.356563782 + t * (1.781477937 + t * (-1.821255978 + t * 1.330274429))))
    upper = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) * poly
    return np.where(z >= 0, 1.0 - upper, upper)


#: The normal CDF tabulated over [-8, 8] (step 1/256), read by linear interpolation in float32:
#: 15x faster than evaluating it for every rank x mode x grid point, within 1e-5 of it.
_TABLE_Z = 8.0
_TABLE_STEP = 1 / 256
_TABLE = normal_cdf(np.arange(-_TABLE_Z, _TABLE_Z + _TABLE_STEP, _TABLE_STEP)).astype(np.float32)


def fast_normal_cdf(z: np.ndarray) -> np.ndarray:
    """:func:`normal_cdf` from its table (float32, linear interpolation; 0 and 1 beyond +-8; NaN
    stays NaN)."""
    z = np.asarray(z, dtype=np.float32)
    nan = np.isnan(z)
    pos = (np.clip(np.where(nan, 0, z), -_TABLE_Z, _TABLE_Z) + np.float32(_TABLE_Z)) * np.float32(1 / _TABLE_STEP)
    i = np.minimum(pos.astype(np.int32), len(_TABLE) - 2)
    out = _TABLE[i] + (pos - i) * (_TABLE[i + 1] - _TABLE[i])
    return np.where(nan, np.float32(np.nan), out) if nan.any() else out


def log_normal_params(p50: np.ndarray, p99: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` of log-normals with median ``p50`` and 99th percentile ``p99``."""
    mu = np.log(p50)
    return mu, np.maximum((np.log(p99) - mu) / Z99, 1e-6)


def mixture_cdf(count: np.ndarray, p50: np.ndarray, p99: np.ndarray, log_grid: np.ndarray) -> np.ndarray:
    """``[R, X]``: every rank's mixture CDF at ``exp(log_grid)``; ``count``/``p50``/``p99`` are
    ``[R, M]`` (a rank's missing modes NaN or count 0; a rank with none is NaN)."""
    w = np.where(np.isfinite(count) & (count > 0), count, 0.0)
    tot = w.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = w / tot
        mu, sigma = log_normal_params(np.where(w > 0, p50, 1.0), np.where(w > 0, p99, 1.0))
        z = (log_grid.astype(np.float32)[None, None, :] - mu.astype(np.float32)[:, :, None]) \
            / sigma.astype(np.float32)[:, :, None]
    cdf = np.einsum("rm,rmx->rx", w.astype(np.float32), fast_normal_cdf(z))
    return np.where(tot > 0, cdf, np.nan)


def rebuild_quantiles(modes: list[Mode], q, points: int = 4096) -> np.ndarray:
    """Quantiles ``q`` of the distribution ``modes`` describe."""
    if not modes:
        raise ValueError("no modes to rebuild a distribution from")
    count = np.asarray([[m.count for m in modes]], dtype=float)
    p50 = np.asarray([[m.p50_us for m in modes]])
    p99 = np.asarray([[m.p99_us for m in modes]])
    mu, sigma = log_normal_params(p50, p99)
    grid = np.linspace((mu - 6 * sigma).min(), (mu + 6 * sigma).max(), points)
    cdf = mixture_cdf(count, p50, p99, grid)[0]
    return np.exp(np.interp(np.asarray(q, dtype=float), cdf, grid))
