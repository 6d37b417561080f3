"""Stop a polling loop on Ctrl-C or SIGTERM at its next turn, never in the middle of a write.

A ``KeyboardInterrupt`` raised wherever the main thread happens to be can be lost (a finalizer
or library code that swallows it) or can cut a store write in half; a handler that only sets a
flag cannot be lost that way, and the loop ends where it is safe to. ``docker stop`` and systemd
send SIGTERM: the same. The handler takes no lock (an ``Event.set`` from a handler can deadlock
with the main thread inside ``Event.wait``): it sets a plain attribute, and :meth:`StopSignals.sleep`
sleeps in short slices. The first signal also gives the previous handlers back, so a second
Ctrl-C interrupts a turn that hangs. Off the main thread (where no handler can be set) the loop
runs until its own end.

Example::

    >>> with StopSignals() as stop:
    ...     while not stop.requested:
    ...         stop.requested = True     # a poll, a write; Ctrl-C sets it too
    ...         stop.sleep(0.01)
    >>> stop.requested
    True
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

#: The longest a stop waits for the sleep it arrived in.
SLICE_S = 0.1


class StopSignals:
    """``requested`` turns True on SIGINT or SIGTERM while the ``with`` block runs."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self._restore()   # a second signal acts as it would without us

    def _restore(self) -> None:
        previous, self._previous = self._previous, {}
        for s, handler in previous.items():
            signal.signal(s, handler)

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or less once a stop is requested."""
        end = time.monotonic() + seconds
        while not self.requested and (left := end - time.monotonic()) > 0:
            time.sleep(min(SLICE_S, left))

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()
