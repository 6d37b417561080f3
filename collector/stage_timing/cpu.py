"""CPU timing: marks from a monotonic clock; a finished iteration is resolved at once."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from collector.stage_timing.timing import Iteration


class CpuTiming:
    """:class:`~collector.stage_timing.timing.Timing` on a clock in seconds (default
    ``time.perf_counter``; injectable, so that tests drive a fake clock). Streams are ignored."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self._finished: deque[Iteration] = deque()

    def mark(self, stream: Any = None) -> float:
        return self.clock()

    def split(self, stream: Any, end: float) -> tuple[float, float]:
        return end, end

    def release(self, marks: Iterable[Any]) -> None:
        return None   # clock readings need no reuse

    def finish(self, iteration: Iteration) -> None:
        self._finished.append(iteration)

    def collect(self, block: bool = False) -> Iterator[tuple[Iteration, list[float]]]:
        while self._finished:
            it = self._finished.popleft()
            begin = it.begin
            yield it, [(m - begin) * 1000.0 for m in it.marks()]

    @property
    def pending(self) -> int:
        return len(self._finished)
