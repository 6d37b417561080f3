"""The last few iterations of a job, kept in memory for evidence and L2 output.

A bounded deque of per-iteration ``[rank, stage]`` arrays with their iteration
numbers and timestamps; old iterations fall off the end.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class Window:
    """The most recent ``size`` iterations."""

    def __init__(self, size: int):
        self.size = size
        self._values: deque[np.ndarray] = deque(maxlen=size)
        self._iters: deque[int] = deque(maxlen=size)
        self._times: deque[int] = deque(maxlen=size)
        self._stack: np.ndarray | None = None

    def push(self, iteration: int, time_ms: int, values: np.ndarray) -> None:
        self._values.append(values)
        self._iters.append(int(iteration))
        self._times.append(int(time_ms))
        self._stack = None

    def __len__(self) -> int:
        return len(self._values)

    @property
    def values(self) -> np.ndarray:
        """``[T, R, S]``, oldest first (built on demand, cached until the next push)."""
        if self._stack is None:
            self._stack = np.stack(list(self._values)) if self._values else np.empty((0, 0, 0))
        return self._stack

    def recent(self, n: int) -> np.ndarray:
        """``[min(n, T), R, S]``: the last ``n`` iterations only (cheaper than ``values``)."""
        if self._stack is not None:
            return self._stack[-n:]
        return np.stack(list(self._values)[-n:]) if self._values else np.empty((0, 0, 0))

    @property
    def iterations(self) -> np.ndarray:
        return np.array(self._iters, dtype=np.int64)

    @property
    def times(self) -> np.ndarray:
        return np.array(self._times, dtype=np.int64)

    def since(self, onset: int, until: int | None = None) -> np.ndarray:
        """Mask of kept iterations from ``onset`` (to ``until``, exclusive); the last one if none."""
        it = self.iterations
        m = it >= onset
        if until is not None and until >= 0:
            m &= it < until
        if not m.any() and len(it):
            m[-1] = True
        return m

    def before(self, onset: int) -> np.ndarray:
        return self.iterations < onset

    def time_of(self, iteration: int, default: int) -> int:
        """Timestamp of a kept iteration (the nearest later one), else ``default``."""
        it = self.iterations
        idx = np.flatnonzero(it >= iteration)
        return int(self.times[idx[0]]) if len(idx) else int(default)
