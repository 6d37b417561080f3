"""The interface between the stage timer and its clock, and the finished iteration it resolves."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Iteration:
    """Marks of one finished iteration, waiting to be resolved into milliseconds."""

    iteration: int
    time_ms: int
    begin: Any
    end: Any
    #: (stage index, start mark, end mark) of every interval timed in the iteration.
    intervals: list[tuple[int, Any, Any]]

    def marks(self) -> list[Any]:
        """The iteration's end, then each interval's start and end."""
        marks = [self.end]
        for _, a, b in self.intervals:
            marks.append(a)
            marks.append(b)
        return marks


class Timing(Protocol):
    """Where a stage timer's marks come from, and how a finished iteration's marks become ms.

    A mark is an opaque timestamp (a clock reading, a recorded CUDA event). :meth:`finish`
    hands over an iteration; :meth:`collect` yields those whose marks can be read now (every
    one with ``block``), in order, with their offsets from the iteration's begin in ms: the
    end first, then each interval's start and end (:meth:`Iteration.marks`).
    """

    def mark(self, stream: Any = None) -> Any:
        """A mark now (on ``stream``, for timings that have streams)."""

    def split(self, stream: Any, end: Any) -> tuple[Any, Any]:
        """Marks that close a region open at the boundary ``end`` and reopen it after."""

    def release(self, marks: Iterable[Any]) -> None:
        """Marks that will never be read (a discarded iteration): reusable."""

    def finish(self, iteration: Iteration) -> None:
        """A finished iteration, to resolve once its marks can be read."""

    def collect(self, block: bool = False) -> Iterator[tuple[Iteration, list[float]]]:
        """The finished iterations that can be resolved (all of them with ``block``), oldest first."""

    @property
    def pending(self) -> int:
        """Finished iterations not collected yet."""


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping ``(start, end)`` intervals."""
    if len(intervals) == 1:
        a, b = intervals[0]
        return max(b - a, 0.0)
    total = 0.0
    cur_a, cur_b = None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total
