"""Step detector: persistent level shifts of many series at once.

A robust two-window mean-shift test with minimum persistence: each new value
of a series is compared (in log space, so a shift is a ratio) with the rolling
median of its recent accepted past. A value is *out* when it is further than
``max(threshold * robust sigma, log(1 + min_change))`` from that median. A run
of ``persist`` out values on the same side confirms a step, with its onset at
the first value of the run. The reference then restarts from the new level,
and the detector watches for the return to the old level (recovery).

Runs shorter than ``persist`` that return are not steps (the spike detector
reports those).

Parameters
----------
n: number of series (e.g. 1 for the job, or one per rank).
window: accepted values kept per series for the reference (default 20).
min_history: values a series needs before it can alarm (default 8).
threshold: robust z (MAD-based sigma in log space) a value must exceed (default 6).
min_change: relative change a value must exceed whatever the noise (default 0.10:
    the iteration time of a healthy synchronous job varies by a few percent).
persist: out values in a row that confirm a step (default 2).
refresh_every: recompute the reference median/MAD after this many updates
    (default 1; the per-rank monitor of 12,960 series uses 8: excursions never
    enter the reference, so a reference a few iterations old judges them the same).

The method is the windowed mean-shift test of Basseville and Nikiforov,
"Detection of Abrupt Changes: Theory and Application" (Prentice Hall, 1993),
ch. 2, with a median/MAD reference in place of the sample mean (Hampel's
robust scale) and a minimum-persistence rule in place of a CUSUM threshold,
which keeps false alarms rare on heavy-tailed iteration times.

Example::

    >>> import numpy as np
    >>> d = StepDetector(n=1, min_history=5)
    >>> xs = [30.0, 30.3, 29.8, 30.1, 30.2, 29.9, 30.0, 91.0, 90.0, 90.5]
    >>> ups = [d.update(np.array([x])) for x in xs]
    >>> [int(u.confirmed[0]) for u in ups]
    [0, 0, 0, 0, 0, 0, 0, 0, 1, 0]
    >>> u = ups[8]
    >>> int(u.onset_index[0]), round(float(u.before[0])), round(float(u.after[0]))
    (7, 30, 90)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.detect.fast_median import nanmedian
from analyzer.detect.reference import RollingReference


@dataclass
class StepUpdate:
    """What one ``update`` found, per series (arrays of length n).

    ``confirmed``: a step was confirmed now; its ``onset_index`` (the update
    count at its first value), level ``before`` and ``after`` (medians, in the
    series' units). ``recovered``: a previously confirmed step returned to its
    old level now, ``recovered_index`` being the first value of the return.
    ``out``: this value lies outside the reference band (an excursion in progress).
    """

    confirmed: np.ndarray
    onset_index: np.ndarray
    before: np.ndarray
    after: np.ndarray
    recovered: np.ndarray
    recovered_index: np.ndarray
    out: np.ndarray


class StepDetector:
    """Persistent level shifts in ``n`` series, fed one value per series per ``update``."""

    def __init__(self, n: int, window: int = 20, min_history: int = 8, threshold: float = 6.0,
                 min_change: float = 0.10, persist: int = 2, refresh_every: int = 1):
        if persist < 1:
            raise ValueError("persist must be >= 1")
        if min_history > window:
            raise ValueError("min_history cannot exceed window")
        self.n, self.window, self.min_history = n, window, min_history
        self.threshold, self.min_change, self.persist = threshold, min_change, persist
        self.ref = RollingReference(n, window, refresh_every)
        self.t = 0
        self.run_len = np.zeros(n, dtype=np.int64)
        self.run_sign = np.zeros(n, dtype=np.int8)
        self.run_start = np.zeros(n, dtype=np.int64)
        self.run_vals = np.full((persist, n), np.nan)
        # after a confirmed step: the level it left, to watch for recovery
        self.shifted = np.zeros(n, dtype=bool)
        self.old_level = np.full(n, np.nan)
        self.back_len = np.zeros(n, dtype=np.int64)
        self.back_start = np.zeros(n, dtype=np.int64)
        self.last: StepUpdate | None = None

    def _quiet_update(self) -> StepUpdate:
        """The result of an update in which nothing happened (shared, read-only arrays)."""
        if getattr(self, "_quiet", None) is None:
            no = np.zeros(self.n, dtype=bool)
            minus = np.full(self.n, -1, dtype=np.int64)
            nan = np.full(self.n, np.nan)
            for a in (no, minus, nan):
                a.setflags(write=False)
            self._quiet = StepUpdate(no, minus, nan, nan, no, minus, no)
        return self._quiet

    def band(self) -> tuple[np.ndarray, np.ndarray]:
        """Reference median and half-width of the band, in log units."""
        med, scale = self.ref.stats()
        half = np.maximum(self.threshold * scale, np.log1p(self.min_change))
        return med, half

    def update(self, x: np.ndarray) -> StepUpdate:
        """Feed one value per series (NaN = no value this time; it changes nothing)."""
        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log(np.where(x > 0, x, np.nan))
        valid = np.isfinite(y)
        med, half = self.band()
        armed = valid & (self.ref.filled() >= self.min_history) & np.isfinite(med)
        dev = y - med
        out = armed & (np.abs(dev) > half)
        if not (out.any() or self.run_len.any() or self.back_len.any() or self._near_old(y, valid).any()):
            # the common case, every series inside its band and none on its way back
            # to a level it left: only the reference moves
            self.ref.accept(y, valid)
            self.t += 1
            self.last = self._quiet_update()
            return self.last
        self._extend_runs(y, valid, out, np.sign(np.nan_to_num(dev)).astype(np.int8))
        confirmed, onset, before, after = self._confirm(y, out, med)
        recovered, rec_index = self._track_recovery(y, valid)
        # accept normal values into the reference; restart it at a new regime
        self.ref.accept(y, valid & ~out & ~recovered)
        self._restart(y, confirmed, recovered, med)
        self.t += 1
        self.last = StepUpdate(confirmed, onset, before, after, recovered, rec_index, out)
        return self.last

    def _near_old(self, y: np.ndarray, valid: np.ndarray | bool = True) -> np.ndarray:
        """Series whose value is back within the band of the level a step left."""
        if not self.shifted.any():
            return np.zeros(self.n, dtype=bool)
        with np.errstate(invalid="ignore"):
            return self.shifted & valid & (np.abs(y - self.old_level) <= np.log1p(self.min_change))

    def _extend_runs(self, y: np.ndarray, valid: np.ndarray, out: np.ndarray, sign: np.ndarray) -> None:
        """Runs of out values on one side: extend, start or end them (a missing value keeps a run)."""
        cont = out & (self.run_len > 0) & (sign == self.run_sign)
        new = out & ~cont
        self.run_len = np.where(cont, self.run_len + 1, np.where(new, 1, np.where(valid, 0, self.run_len)))
        self.run_sign = np.where(out, sign, self.run_sign)
        self.run_start = np.where(new, self.t, self.run_start)
        slot = np.clip(self.run_len - 1, 0, self.persist - 1)
        cols = np.flatnonzero(out)
        self.run_vals[slot[cols], cols] = y[cols]
        self.run_vals[:, new] = np.where(np.arange(self.persist)[:, None] == 0, y[new], np.nan)

    def _confirm(self, y: np.ndarray, out: np.ndarray,
                 med: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Runs that reached ``persist`` now: confirmed steps, their onset and the levels before
        and after (going back to the level a step left is its recovery, not a new step)."""
        returning = self._near_old(y)
        confirmed = out & (self.run_len == self.persist) & ~returning
        before = np.where(confirmed, np.exp(med), np.nan)
        with np.errstate(all="ignore"):
            new_level = nanmedian(np.where(confirmed[None, :], self.run_vals, np.nan), axis=0) \
                if confirmed.any() else np.full(self.n, np.nan)
        after = np.where(confirmed, np.exp(new_level), np.nan)
        onset = np.where(confirmed, self.run_start, -1)
        return confirmed, onset, before, after

    def _track_recovery(self, y: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Recovery: ``persist`` values in a row back within the band of the level a step left;
        the recovered series and the first value of each return."""
        near_old = self._near_old(y, valid)
        self.back_start = np.where(near_old & (self.back_len == 0), self.t, self.back_start)
        self.back_len = np.where(near_old, self.back_len + 1, np.where(valid, 0, self.back_len))
        recovered = self.shifted & (self.back_len >= self.persist)
        return recovered, np.where(recovered, self.back_start, -1)

    def _restart(self, y: np.ndarray, confirmed: np.ndarray, recovered: np.ndarray, med: np.ndarray) -> None:
        """Restart the reference of series at a new regime: a confirmed step (remembering the level
        it left) or a recovery."""
        if confirmed.any():
            self.old_level = np.where(confirmed & ~self.shifted, med, self.old_level)
            self.shifted = self.shifted | confirmed
            self.ref.reset(confirmed, self.run_vals)
            self.run_len[confirmed] = 0
            self.back_len[confirmed] = 0
        if recovered.any():
            self.ref.reset(recovered, np.full((1, self.n), np.nan))
            self.ref.accept(np.where(recovered, y, np.nan), recovered)
            self.shifted &= ~recovered
            self.old_level[recovered] = np.nan
            self.back_len[recovered] = 0
            self.run_len[recovered] = 0
