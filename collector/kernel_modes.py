"""One kernel's durations on one rank over a window, compressed to its modes (count, p50, p99).

The compression ARGUS publishes (arXiv 2606.20374, section on L3): take the log of the
durations, fit a Gaussian kernel density estimate with Scott's bandwidth, split the modes at the
density's valleys, and keep only count, p50 and p99 of each mode. A GPU emits 10^4-10^5 kernel
events a minute; a kernel is usually one or two modes (a matmul on two shapes, a collective that
waits or not), so a window of one kernel becomes a few 12-byte modes.

The density is evaluated on a grid of ``GRID`` points by binning the log durations and
convolving the bins with the Gaussian kernel (a "binned KDE", Silverman 1982): O(n + GRID x
kernel width) instead of O(n x GRID) for an exact KDE (``scipy.stats.gaussian_kde``): at 10^5
events a window the binned one is what a collector can afford, and its error (a bin is 1/256 of
the range) is far below the bandwidth. numpy alone: scipy is not needed.

A local maximum of the density below ``MIN_PEAK_SHARE`` of the highest is noise, not a mode, and
two maxima are split only where the valley between them falls below ``VALLEY_DEPTH`` of the
lower one (a bumpy single mode stays one).

:func:`rankscope.kernel_mixture.rebuild_quantiles` turns the modes back into a distribution,
a log-normal per mode weighted by its count, as the analyzer does to compare ranks.

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> d = np.r_[rng.lognormal(np.log(1200), 0.05, 900), rng.lognormal(np.log(3000), 0.05, 100)]
    >>> [(m.count, round(m.p50_us, -2)) for m in compress(d)]
    [(900, 1200.0), (100, 3000.0)]
"""

from __future__ import annotations

import math

import numpy as np

from rankscope.kernel_mixture import Mode

#: Grid points the density is evaluated on.
GRID = 256
#: A local maximum below this share of the highest is not a mode.
MIN_PEAK_SHARE = 0.05
#: Two modes are split only where the valley is below this share of the lower peak.
VALLEY_DEPTH = 0.5


def _checked(durations_us: np.ndarray) -> np.ndarray:
    d = np.asarray(durations_us, dtype=float).ravel()
    if d.size == 0:
        raise ValueError("no kernel durations to compress (the window holds no event of this kernel)")
    bad = ~np.isfinite(d) | (d <= 0)
    if bad.any():
        raise ValueError(f"kernel durations must be finite and > 0 us: {int(bad.sum())} of {d.size} are not "
                         f"(first: {d[bad][0]!r})")
    return d


def density(log_d: np.ndarray, grid: int = GRID) -> tuple[np.ndarray, np.ndarray]:
    """The Gaussian KDE of ``log_d`` with Scott's bandwidth on ``grid`` points (binned, convolved):
    ``(x, f)``. A sample with no spread is one point: its density is one spike."""
    n = log_d.size
    sd = float(np.std(log_d, ddof=1)) if n > 1 else 0.0
    h = max(sd * n ** (-1 / 5), 1e-6)                       # Scott's rule in one dimension
    lo, hi = float(log_d.min()) - 3 * h, float(log_d.max()) + 3 * h
    x = np.linspace(lo, hi, grid)
    counts, _ = np.histogram(log_d, bins=grid, range=(lo - (hi - lo) / (2 * (grid - 1)), hi + (hi - lo) / (2 * (grid - 1))))
    step = (hi - lo) / (grid - 1)
    half = int(min((grid - 1) // 2, math.ceil(4 * h / step)))   # "same" keeps ``grid`` points
    k = np.exp(-0.5 * (np.arange(-half, half + 1) * step / h) ** 2)
    return x, np.convolve(counts, k / k.sum(), mode="same")


def valleys(f: np.ndarray) -> np.ndarray:
    """Grid indices where the density ``f`` splits into modes (its deep valleys between peaks)."""
    inner = (f[1:-1] > f[:-2]) & (f[1:-1] >= f[2:])
    peaks = np.flatnonzero(inner) + 1
    peaks = peaks[f[peaks] >= MIN_PEAK_SHARE * f.max()]
    cuts = []
    left = peaks[0] if len(peaks) else 0
    for right in peaks[1:]:
        v = left + int(np.argmin(f[left:right + 1]))
        if f[v] < VALLEY_DEPTH * min(f[left], f[right]):
            cuts.append(v)
            left = right
        elif f[right] > f[left]:
            left = right                                    # the higher peak leads the merged mode
    return np.asarray(cuts, dtype=np.int64)


def compress(durations_us: np.ndarray) -> list[Mode]:
    """The modes of one kernel's durations (us) in a window, shortest first."""
    d = _checked(durations_us)
    log_d = np.log(d)
    x, f = density(log_d)
    edges = x[valleys(f)]
    which = np.searchsorted(edges, log_d)
    out = []
    for m in range(len(edges) + 1):
        part = d[which == m]
        if part.size:
            p50, p99 = np.quantile(part, [0.5, 0.99])
            out.append(Mode(int(part.size), float(p50), float(p99)))
    return out
