"""One job's ``rollup_host_5m`` and ``rollup_host_1h`` points, from what its cycles hold in memory.

The cycle makes the ``rollup_host`` rows of every iteration it processes
(:func:`~analyzer.write.rollups.rollup_frames`); :class:`WindowRollups` keeps them per
5-minute window and, once a window closes, makes its ``rollup_host_5m`` points from them
(:func:`~analyzer.write.rollups.window_rollup`), and the ``rollup_host_1h`` points of its hour
from the hour's windows, never reading either back from the store. These are the points
a read of the stored rows would give: the same rows in the same (time) order.

A window closes when the newest iteration or the clock is ``settle_ms`` (the reader's late
margin) past its end, so a job that ended or hangs gets its last windows too; a final
cycle also writes the open window, and a later one writes it again whole. A window that
more rows fall into after it closed (an iteration stamped before it ended, read late) is
written again, and its hour. What a window needs is held until it can no longer change:
its rows while it is open or newer than ``settle_ms`` before the newest iteration, its
points while its hour can still be written. Rows that fall into a window forgotten
already (an iteration stamped more than the margin before one analyzed earlier) are
left out with a warning; ``rankscope rollup`` writes that window again from the stored
points.

A restarted analyzer replays only the last iterations. :meth:`WindowRollups.begin` takes
the windows its predecessor stored (read once, from the hour of the first window to write)
and the newest iteration it analyzed: a stored window counts for its hour as stored; one
that starts before the replay's first iteration is that point plus the rows newer than
what the predecessor analyzed (the mean weighted by iterations, as an hour is made); the
others are made from the replayed rows. It returns from when the predecessor's rows are
still wanted: after its latest stored window (the predecessor stored every window closed
by its newest iteration before it stored that iteration's analysis, so only the windows
it had open remain, and only when the replay starts after them).
"""

from __future__ import annotations

import logging

import pandas as pd

from analyzer.write.rollups import closed_windows, window_rollup, window_span
from rankscope import schema

log = logging.getLogger(__name__)

#: Columns of a ``rollup_host`` row that say which series it is (with its time: which point).
_SERIES = ["job", "host", "node", "pp"]


class WindowRollups:
    """The windows and hours of one job's ``rollup_host`` rows."""

    def __init__(self, settle_ms: int, window_ms: int = schema.ROLLUP_WINDOW_MS,
                 hour_ms: int = schema.ROLLUP_HOUR_MS):
        self.settle_ms, self.window_ms, self.hour_ms = settle_ms, window_ms, hour_ms
        self.done: int | None = None            # end (ms) of the windows written as closed
        self._rows: dict[int, list[pd.DataFrame]] = {}   # window start -> rollup_host rows
        self._written: dict[int, pd.DataFrame] = {}      # window start -> its stored rollup_host_5m points
        self._first: int | None = None          # the oldest row added since the last close
        self._kept_from: int | None = None      # windows before this are forgotten
        self._base: dict[int, pd.DataFrame] = {}   # window start -> a predecessor's point, its rows up to
        self._analyzed: int | None = None       # ... the newest iteration it analyzed
        self._left_out = 0

    def begin(self, first_ms: int, stored: pd.DataFrame | None = None, analyzed_ms: int | None = None) -> int | None:
        """Start with the first iteration processed and, after a restart, the ``rollup_host_5m``
        points its predecessor ``stored`` (from the hour of the first window to write on) and
        the newest iteration it analyzed; returns the end of the latest stored window (None:
        none), after which the predecessor's rows are wanted."""
        latest = None
        if stored is not None and len(stored):
            for start, points in stored.groupby("time", sort=True):
                window = points.reset_index(drop=True)
                self._written[int(start)] = window
                if start < first_ms:   # the replay holds only part of its rows
                    self._base[int(start)] = window
            latest = int(stored["time"].max())
        self.done = first_ms if latest is None else min(first_ms, latest)
        self._analyzed = analyzed_ms
        return None if latest is None else latest + self.window_ms

    def add(self, host: pd.DataFrame) -> None:
        """``rollup_host`` rows of processed iterations (any windows, any order)."""
        if host is None or not len(host):
            return
        starts = host["time"].to_numpy() // self.window_ms * self.window_ms
        if self._kept_from is not None and (starts < self._kept_from).any():
            self._left_out += int((starts < self._kept_from).sum())
            log.warning("job %s: %d rollup_host row(s) of windows before %d closed long ago left out of "
                        "rollup_host_5m (rankscope rollup --since writes them again)",
                        host["job"].iloc[0], self._left_out, self._kept_from)
            host, starts = host[starts >= self._kept_from], starts[starts >= self._kept_from]
        for start in sorted(set(starts.tolist())):
            self._rows.setdefault(start, []).append(host[starts == start])
        if len(host):
            oldest = int(host["time"].min())
            self._first = oldest if self._first is None else min(self._first, oldest)

    def close(self, last_ms: int, now_ms: int | None = None, final: bool = False) -> dict[str, pd.DataFrame]:
        """The ``rollup_host_5m`` points of every window that closed since the last call and of
        every closed one rows fell into since, and the ``rollup_host_1h`` points of their
        hours, by measurement. ``last_ms``: the newest iteration processed; ``now_ms``: the
        wall clock (None: the data alone closes windows); ``final`` writes the open window."""
        if self.done is None:
            if self._first is None:
                return {}
            self.begin(self._first)
        w = self.window_ms
        since = self.done if self._first is None else min(self.done, self._first)
        last_end = window_span(last_ms, last_ms, w)[1]   # no window after the newest iteration's
        newest = min(last_ms if now_ms is None else max(last_ms, now_ms), last_end + self.settle_ms)
        start, closed = closed_windows(since, newest, self.settle_ms, w)
        out = self._write(start, last_end if final else closed)
        self.done, self._first = max(self.done // w * w, closed), None
        self._forget(min(self.done, last_ms - self.settle_ms))
        return out

    def _write(self, start: int, end: int) -> dict[str, pd.DataFrame]:
        """The points of the windows in ``[start, end)`` that have rows, and of their hours."""
        if end <= start:
            return {}
        windows = [s for s in sorted(self._rows) if start <= s < end]
        for s in windows:
            self._written[s] = self._window(s)
        out = {schema.ROLLUP_HOST_WINDOW: _concat([self._written[s] for s in windows])}
        lo, hi = window_span(start, end - 1, self.hour_ms)
        held = [self._written[s] for s in sorted(self._written) if lo <= s < hi]
        out[schema.ROLLUP_HOST_HOUR] = window_rollup(_concat(held), self.hour_ms) if held else pd.DataFrame()
        return out

    def _window(self, start: int) -> pd.DataFrame:
        """A window's ``rollup_host_5m`` points from its rows, as a read of them would give them:
        by time, a point written twice (same time and series) once, the later; with a
        predecessor's point of it, that point and the rows newer than what it analyzed."""
        rows = pd.concat(self._rows[start], ignore_index=True).sort_values("time", kind="stable")
        base = self._base.get(start)
        if base is not None and self._analyzed is not None:
            rows = rows[rows["time"].to_numpy() > self._analyzed]
        keys = ["time", *[k for k in _SERIES if k in rows.columns]]
        window = window_rollup(rows.drop_duplicates(keys, keep="last").reset_index(drop=True), self.window_ms)
        if base is None or not len(window):
            return window if base is None else base
        return window_rollup(pd.concat([base, window], ignore_index=True), self.window_ms)

    def _forget(self, horizon_ms: int) -> None:
        """Drop the rows of windows closed and ending by ``horizon_ms``, and the points of the
        hours before the oldest window still held."""
        w = self.window_ms
        self._kept_from = max(self._kept_from or horizon_ms // w * w, horizon_ms // w * w)
        for s in [s for s in self._rows if s < self._kept_from]:
            del self._rows[s]
        for s in [s for s in self._base if s < self._kept_from]:
            del self._base[s]
        hour = self._kept_from // self.hour_ms * self.hour_ms
        for s in [s for s in self._written if s < hour]:
            del self._written[s]


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
