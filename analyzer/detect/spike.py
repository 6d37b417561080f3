"""Spike detector: short excursions of many series at once (a Hampel filter with a memory).

A value is *out* when its robust z against the rolling median/MAD of the
series' accepted past exceeds ``threshold`` (and the relative change exceeds
``min_change``). An excursion of at most ``max_len`` out values that returns
inside the band is a spike, reported at the first in-band value after it,
with its onset, length and peak. Longer excursions are left to the step
detector. Out values never enter the reference.

Parameters
----------
n: number of series.
window: accepted values kept per series (default 20).
min_history: values a series needs before it can alarm (default 8).
threshold: robust z to exceed (default 6).
min_change: relative change to exceed whatever the noise (default 0.10).
max_len: longest excursion that is still a spike (default 1).

From Hampel, "The influence curve and its role in robust estimation", JASA
69 (1974), as the moving-window outlier identifier of Pearson, "Outliers in
process modeling and identification", IEEE Trans. Control Systems Technology
10 (2002).

Example::

    >>> import numpy as np
    >>> d = SpikeDetector(n=1, min_history=5)
    >>> xs = [30.0, 30.3, 29.8, 30.1, 30.2, 29.9, 75.0, 30.1, 30.0]
    >>> [int(d.update(np.array([x])).spike[0]) for x in xs]
    [0, 0, 0, 0, 0, 0, 0, 1, 0]
    >>> int(d.last_spike_onset[0]), round(float(d.last_spike_peak[0]))
    (6, 75)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.detect.reference import RollingReference


@dataclass
class SpikeUpdate:
    """Per series: ``spike`` ended now (onset index, length, peak and level around it)."""

    spike: np.ndarray
    onset_index: np.ndarray
    length: np.ndarray
    peak: np.ndarray
    level: np.ndarray
    out: np.ndarray


class SpikeDetector:
    """Short excursions in ``n`` series, fed one value per series per ``update``."""

    def __init__(self, n: int, window: int = 20, min_history: int = 8, threshold: float = 6.0,
                 min_change: float = 0.10, max_len: int = 1):
        self.n, self.min_history, self.threshold = n, min_history, threshold
        self.min_change, self.max_len = min_change, max_len
        self.ref = RollingReference(n, window)
        self.t = 0
        self.run_len = np.zeros(n, dtype=np.int64)
        self.run_start = np.zeros(n, dtype=np.int64)
        self.run_peak = np.full(n, np.nan)
        self.last_spike_onset = np.full(n, -1, dtype=np.int64)
        self.last_spike_peak = np.full(n, np.nan)

    def update(self, x: np.ndarray) -> SpikeUpdate:
        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log(np.where(x > 0, x, np.nan))
        valid = np.isfinite(y)
        med = self.ref.median()
        half = np.maximum(self.threshold * self.ref.scale(), np.log1p(self.min_change))
        armed = valid & (self.ref.filled() >= self.min_history) & np.isfinite(med)
        dev = np.abs(y - med)
        out = armed & (dev > half)
        back = armed & ~out & (self.run_len > 0)
        spike = back & (self.run_len <= self.max_len)
        onset = np.where(spike, self.run_start, -1)
        length = np.where(spike, self.run_len, 0)
        peak = np.where(spike, np.exp(self.run_peak), np.nan)
        self.last_spike_onset = np.where(spike, onset, self.last_spike_onset)
        self.last_spike_peak = np.where(spike, peak, self.last_spike_peak)

        new = out & (self.run_len == 0)
        self.run_start = np.where(new, self.t, self.run_start)
        with np.errstate(invalid="ignore"):
            self.run_peak = np.where(new, y, np.where(out, np.fmax(self.run_peak, y), self.run_peak))
        self.run_len = np.where(out, self.run_len + 1, np.where(valid, 0, self.run_len))
        # a long excursion is a new level: let the reference follow it (the step detector reports it)
        long_run = self.run_len > 3 * self.max_len + 2
        if long_run.any():
            self.ref.reset(long_run)
            self.run_len[long_run] = 0
        self.ref.accept(y, valid & ~out)
        self.t += 1
        return SpikeUpdate(spike, onset, length, peak, np.where(spike, np.exp(med), np.nan), out)
