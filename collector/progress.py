"""A one-line progress bar on stderr for long simulations (no dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``label [#####.....] 37/60 iterations, 480k points, 210k points/s, extra``, redrawn at most 4x/s."""

    def __init__(self, total: int, label: str, enabled: bool = True, stream: TextIO | None = None,
                 width: int = 24):
        self.total = max(1, int(total))
        self.label = label
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.width = width
        self.points = 0
        self.done = 0
        self._t0 = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def update(self, done: int, points: int = 0, extra: str = "") -> None:
        self.done = done
        self.points += points
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.25 and done < self.total):
            return
        self._last = now
        rate = self.points / max(now - self._t0, 1e-9)
        filled = int(self.width * done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        text = (f"\r{self.label} [{bar}] {done}/{self.total} iterations, "
                f"{self.points / 1000:.0f}k points, {rate / 1000:.0f}k points/s")
        self.stream.write(text + (f", {extra}" if extra else "") + "\033[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
