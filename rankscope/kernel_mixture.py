"""A kernel's duration distribution as its modes describe it: the record the collector writes and
the log-normal mixture the analyzer rebuilds from it (ARGUS's L3, arXiv 2606.20374).

Each mode is kept as count, p50 and p99 (:class:`Mode`); rebuilt, it is a log-normal with that
median and 99th percentile, weighted by its count. :func:`mixture_quantiles` gives many ranks'
quantiles at once in closed form (arrays ``[rank, mode]``, NaN-padded; the modes taken as apart),
for the analyzer's distances; :func:`mixture_cdf` evaluates the exact mixture on a grid, for
:func:`rebuild_quantiles`, which measures the compression against raw events (where modes may
overlap).

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
        z = (log_grid[None, None, :] - mu[:, :, None]) / sigma[:, :, None]
    cdf = np.einsum("rm,rmx->rx", w, normal_cdf(z))
    return np.where(tot > 0, cdf, np.nan)


# Acklam's rational approximation of the normal quantile function (relative error < 1.2e-9).
_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
      -3.066479806614716e01, 2.506628277459239e00)
_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
      -1.328068155288572e01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
      4.374664141464968e00, 2.938163982698783e00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)


def _poly(coef: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    out = np.full_like(x, coef[0])
    for c in coef[1:]:
        out = out * x + c
    return out


def normal_ppf(p: np.ndarray) -> np.ndarray:
    """The standard normal quantile function (Acklam's approximation), for ``0 < p < 1``; the
    tails' branch is evaluated only where it is needed."""
    p = np.clip(np.asarray(p, dtype=float), 1e-12, 1 - 1e-12)
    r = p - 0.5
    rr = r * r
    z = r * _poly(_A, rr) / (_poly(_B, rr) * rr + 1)
    tail = np.flatnonzero(np.abs(r) > 0.5 - 0.02425)
    if tail.size:
        pt = p.reshape(-1)[tail]
        q = np.sqrt(-2 * np.log(np.minimum(pt, 1 - pt)))
        zt = _poly(_C, q) / (_poly(_D, q) * q + 1)          # the lower tail's quantile
        z.reshape(-1)[tail] = np.where(pt < 0.5, zt, -zt)
    return z


#: Rows :func:`mixture_quantiles` takes at once.
CHUNK_ROWS = 8192


def mixture_quantiles(count: np.ndarray, p50: np.ndarray, p99: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``[R, U]`` (float32): every rank's quantiles ``u`` (``0 < u < 1``) of its modes (``[R, M]``,
    a missing mode NaN or count 0; a rank with none is NaN), the modes taken as apart (the
    compression splits them at deep valleys): quantile u falls in the mode whose share of the
    events holds it, at that mode's own quantile. Closed form, no grid over durations; a rank of
    one mode (most) is ``exp(mu + sigma z_u)``, the others go mode by mode."""
    if len(count) > CHUNK_ROWS:   # in slices that stay in the CPU's caches: 3-7x faster per value
        return np.concatenate([mixture_quantiles(count[i:i + CHUNK_ROWS], p50[i:i + CHUNK_ROWS],
                                                 p99[i:i + CHUNK_ROWS], u)
                               for i in range(0, len(count), CHUNK_ROWS)])
    u = np.asarray(u, dtype=float)
    w = np.where(np.isfinite(count) & (count > 0) & np.isfinite(p50) & np.isfinite(p99), count, 0.0)
    order = np.argsort(np.where(w > 0, p50, np.inf), axis=1, kind="stable")     # shortest mode first
    w, p50, p99 = (np.take_along_axis(a, order, axis=1) for a in (w, p50, p99))
    modes = (w > 0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = w / w.sum(axis=1, keepdims=True)
        mu, sigma = log_normal_params(np.where(w > 0, p50, 1.0), np.where(w > 0, p99, 1.0))
    mu, sigma = mu.astype(np.float32), sigma.astype(np.float32)
    out = np.full((len(w), len(u)), np.nan, dtype=np.float32)
    one = modes == 1                                   # sorted first: the mode is column 0
    out[one] = np.exp(mu[one, :1] + sigma[one, :1] * normal_ppf(u).astype(np.float32)[None, :])
    many = np.flatnonzero(modes > 1)
    if many.size:
        out[many] = _several_modes(share[many], mu[many], sigma[many], modes[many], u)
    return out


def _several_modes(share: np.ndarray, mu: np.ndarray, sigma: np.ndarray, modes: np.ndarray,
                   u: np.ndarray) -> np.ndarray:
    """:func:`mixture_quantiles` of ranks of several modes: each quantile in the mode that holds it."""
    r, k = share.shape
    cum = np.cumsum(share, axis=1)
    before = np.concatenate([np.zeros((r, 1)), cum[:, :-1]], axis=1).ravel()
    m = np.zeros((r, len(u)), dtype=np.int64)
    for j in range(k - 1):                             # past mode j's share (and mode j+1 is there)
        m += (cum[:, j:j + 1] <= u[None, :]) & (modes[:, None] > j + 1)
    flat = m + (np.arange(r) * k)[:, None]             # [R, U] into the [R, M] arrays
    local = (u[None, :] - before.take(flat)) / share.ravel().take(flat)
    z = normal_ppf(np.clip(local, 1e-9, 1 - 1e-9)).astype(np.float32)
    return np.exp(mu.ravel().take(flat) + sigma.ravel().take(flat) * z)


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
