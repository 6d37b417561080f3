"""Rolling robust reference level of many series at once (median and MAD of the recent past).

Both L1 detectors compare a new value with where each series has been. The
reference keeps the last ``window`` accepted values of every series in a ring
buffer (values an excursion is made of are not accepted, so a fault cannot
drag the reference along), and answers median and a scale from the MAD.
Series are the columns of one array: the job's median iteration time, or one
per rank; all updated together, no Python loop over series.
"""

from __future__ import annotations

import numpy as np

#: Interquartile range to standard deviation for normal data.
IQR_TO_SIGMA = 1.349


class RollingReference:
    """Ring buffers of the last ``window`` accepted values of ``n`` series.

    Example::

        >>> ref = RollingReference(n=2, window=4)
        >>> for x in ([1.0, 10.0], [1.1, 10.0], [0.9, 10.2]):
        ...     ref.accept(np.array(x), np.array([True, True]))
        >>> ref.median().round(2).tolist()
        [1.0, 10.0]
    """

    def __init__(self, n: int, window: int = 20, refresh_every: int = 1):
        if window < 3:
            raise ValueError("window must be at least 3")
        self.refresh_every = max(1, refresh_every)
        self._cache: tuple[np.ndarray, np.ndarray] | None = None
        self._since = 0
        self.n = n
        self.window = window
        self.buf = np.full((window, n), np.nan)
        self.count = np.zeros(n, dtype=np.int64)

    def accept(self, x: np.ndarray, mask: np.ndarray) -> None:
        """Append ``x`` to the series where ``mask`` (and x is finite)."""
        take = mask & np.isfinite(x)
        # each series has its own fill level: write into the slot that series is at
        slots = self.count % self.window
        self.buf[slots[take], np.flatnonzero(take)] = x[take]
        self.count += take
        self._since += 1
        if self._since >= self.refresh_every:
            self._cache = None

    def reset(self, mask: np.ndarray, values: np.ndarray | None = None) -> None:
        """Forget the history of the masked series (a new regime), optionally seeded.

        ``values`` has shape ``[k, n]``: the k most recent values of the new regime.
        """
        self.buf[:, mask] = np.nan
        self.count[mask] = 0
        self._cache = None
        if values is not None:
            for row in values:
                self.accept(row, mask)

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Median and robust standard deviation of each series' history.

        One sort of the buffer gives the median and the quartiles; the scale is the
        interquartile range / 1.349 (the normal sigma, like MAD x 1.4826, at half the
        cost: no second pass). Recomputed after every ``refresh_every`` accepts (1:
        always) or any reset: for thousands of rank series a reference a few
        iterations old is as good and costs a fraction.
        """
        if self._cache is None:
            s = np.sort(self.buf, axis=0)                       # NaN last
            n = np.sum(np.isfinite(self.buf), axis=0)
            with np.errstate(all="ignore"):
                med = _quantile_sorted(s, n, 0.5)
                iqr = _quantile_sorted(s, n, 0.75) - _quantile_sorted(s, n, 0.25)
            self._cache = (med, iqr / IQR_TO_SIGMA)
            self._since = 0
        return self._cache

    def median(self) -> np.ndarray:
        return self.stats()[0]

    def scale(self) -> np.ndarray:
        """Robust standard deviation (MAD x 1.4826) of each series' history."""
        return self.stats()[1]

    def filled(self) -> np.ndarray:
        return np.minimum(self.count, self.window)


def _quantile_sorted(s: np.ndarray, n: np.ndarray, q: float) -> np.ndarray:
    """Quantile ``q`` of each column of a column-sorted array with ``n`` valid (leading) values."""
    pos = q * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    cols = np.arange(s.shape[1])
    v = s[lo, cols] * (1 - (pos - lo)) + s[hi, cols] * (pos - lo)
    return np.where(n > 0, v, np.nan)
