"""The intervals of the iteration being timed, and the regions that add to them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from collector.stage_timing.timing import Timing


class Recorder:
    """The iteration being timed: its begin mark and its intervals ``(stage index, start, end)``.

    ``epoch`` advances when an iteration is discarded, so that an interval closed late (by a
    hook or a completion callback) that began before is dropped; while ``paused`` nothing is
    recorded.
    """

    __slots__ = ("timing", "begin", "intervals", "epoch", "paused")

    def __init__(self, timing: Timing):
        self.timing = timing
        self.intervals: list[tuple[int, Any, Any]] = []
        self.epoch = 0
        self.paused = False
        self.begin = timing.mark(None)

    def late(self, index: int, start: Any, epoch: int) -> None:
        """An interval closed by a hook or a completion callback: dropped when the
        iteration it began in was discarded (pause/reset) or the timer is paused."""
        if self.paused or epoch != self.epoch:
            return
        self.intervals.append((index, start, self.timing.mark(None)))

    def take(self, end: Any) -> tuple[Any, list[tuple[int, Any, Any]]]:
        """The iteration's begin and intervals; the next iteration begins at ``end``."""
        begin, intervals = self.begin, self.intervals
        self.begin, self.intervals = end, []
        return begin, intervals

    def discard(self, regions: Iterable[Region]) -> None:
        """Forget the iteration's intervals and the open entries of ``regions`` (dropped when
        they close), and completions still in flight (by the epoch)."""
        self.epoch += 1
        for region in regions:
            region.discard()
        self.timing.release(m for _, a, b in self.intervals for m in (a, b))
        self.intervals = []

    def restart(self) -> None:
        """The iteration begins now."""
        self.begin = self.timing.mark(None)


class Region:
    """Reusable context manager for one stage (no allocation on the hot path).

    ``open`` holds the marks of entries not yet closed (nested entries stack);
    ``dropped`` counts entries whose interval is discarded when they close: made
    while paused, or opened before the iteration was discarded (pause, reset).
    """

    __slots__ = ("_rec", "_mark", "index", "stream", "open", "dropped")

    def __init__(self, recorder: Recorder, index: int, stream: Any = None):
        self._rec = recorder
        self._mark = recorder.timing.mark
        self.index = index
        self.stream = stream
        self.open: list[Any] = []
        self.dropped = 0

    def __enter__(self) -> Region:
        if self._rec.paused:
            self.dropped += 1
        else:
            self.open.append(self._mark(self.stream))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.open:  # never while paused: discard() moves the open entries to dropped
            self._rec.intervals.append((self.index, self.open.pop(), self._mark(self.stream)))
        elif self.dropped:
            self.dropped -= 1

    @property
    def entered(self) -> bool:
        """An entry is open or dropped: closing the region is expected."""
        return bool(self.open) or self.dropped > 0

    def split(self, end: Any) -> None:
        """Entries open at the iteration boundary ``end``: their part up to it counts in the
        iteration that ends, the rest in the next."""
        rec = self._rec
        for k, a in enumerate(self.open):
            close, reopen = rec.timing.split(self.stream, end)
            rec.intervals.append((self.index, a, close))
            self.open[k] = reopen

    def discard(self) -> None:
        """Forget the open entries: their intervals are dropped when they close."""
        if self.open:
            self.dropped += len(self.open)
            self._rec.timing.release(self.open)
            self.open.clear()


class NullRegion:
    """What the stage timer's ``stage()`` returns while paused."""

    __slots__ = ()

    def __enter__(self) -> NullRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NULL_REGION = NullRegion()
