"""CUDA timing: marks are CUDA events, resolved once complete without waiting for the device."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from collector.stage_timing.timing import Iteration


class CudaTiming:
    """:class:`~collector.stage_timing.timing.Timing` on CUDA events.

    A mark is an event recorded on the stream the work runs on (default the current one). A
    finished iteration is resolved at a later boundary once every one of its events has
    completed (``Event.query()``, never a synchronisation), so the hot path never waits for
    the device; ``collect(block=True)`` synchronises. Events are reused from a pool: an
    iteration's end is the next one's begin and is kept; the others return once read.

    ``event_factory`` makes a timing event (default ``torch.cuda.Event(enable_timing=True)``).
    """

    def __init__(self, event_factory: Callable[[], Any] | None = None):
        if event_factory is None:
            import torch

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)

        self._new_event = event_factory
        self._pool: list[Any] = []
        self._finished: deque[Iteration] = deque()

    def mark(self, stream: Any = None) -> Any:
        ev = self._pool.pop() if self._pool else self._new_event()
        ev.record(stream)
        return ev

    def split(self, stream: Any, end: Any) -> tuple[Any, Any]:
        # each event is used once: a new one closes the region, another reopens it
        return self.mark(stream), self.mark(stream)

    def release(self, marks: Iterable[Any]) -> None:
        self._pool.extend(marks)   # re-recorded on reuse

    def finish(self, iteration: Iteration) -> None:
        self._finished.append(iteration)

    def collect(self, block: bool = False) -> Iterator[tuple[Iteration, list[float]]]:
        while self._finished:
            it = self._finished[0]
            # every mark must be complete: some were recorded on other (communication) streams
            if not block and not (it.end.query() and all(a.query() and b.query() for _, a, b in it.intervals)):
                return
            if block:
                it.end.synchronize()
                for _, _a, b in it.intervals:
                    b.synchronize()
            self._finished.popleft()
            yield it, self._offsets(it)

    def _offsets(self, it: Iteration) -> list[float]:
        marks = it.marks()
        out = [it.begin.elapsed_time(m) for m in marks]
        # marks[0] is this iteration's end = the next iteration's begin: keep it
        self._pool.append(it.begin)
        self._pool.extend(marks[1:])
        return out

    @property
    def pending(self) -> int:
        return len(self._finished)
