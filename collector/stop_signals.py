"""Stop a polling loop on Ctrl-C or SIGTERM at its next turn, never in the middle of a write.

A ``KeyboardInterrupt`` raised wherever the main thread happens to be can be lost (a finalizer
or library code that swallows it) or can cut a store write in half; a handler that only sets a
flag cannot be lost that way, and the loop ends where it is safe to. ``docker stop`` and systemd
send SIGTERM: the same. Off the main thread (where no handler can be set) the loop runs until
its own end.

Example::

    >>> with StopSignals() as stop:
    ...     while not stop.is_set():
    ...         stop.set()          # a poll, a write; Ctrl-C sets it too
    >>> stop.is_set()
    True
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


class StopSignals:
    """A :class:`threading.Event` set by SIGINT or SIGTERM while the ``with`` block runs."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: dict[int, object] = {}

    def _set(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()

    def __enter__(self) -> threading.Event:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._set) for s in self.SIGNALS}
        return self.event

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
