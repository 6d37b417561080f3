"""Group commit: the rows of concurrent posts written to the store together, by one thread.

A post's handler hands its rows to :meth:`WriteBatcher.submit` and waits on the returned
future; the writer thread takes everything waiting, writes it as one batch and settles every
future of the batch with its outcome. So a post is still answered only once its rows are stored
(or the store refused them: the sender retries a 503), while 20 concurrent posts cost one
round trip to the store instead of 20 in a row.

Bounded: at most ``max_rows`` rows wait; beyond that :meth:`submit` refuses at once
(:class:`Busy`, a 503 the sender retries). A batch the store refuses for its content
(``ValueError``) is written again post by post, so one bad post cannot fail the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from events.rows import EventRow

log = logging.getLogger(__name__)

#: Most rows waiting to be written (posts are at most 1 MiB, a few thousand alerts).
MAX_WAITING_ROWS = 200_000
#: Most rows written in one batch.
MAX_BATCH_ROWS = 20_000
#: Seconds the writer collects posts after the first one arrives before it writes them: a
#: store write costs the same few milliseconds for 1 row or 500, so a burst is written in a
#: few writes rather than one per post, and a lone post waits at most this long.
LINGER_S = 0.005


class Busy(RuntimeError):
    """More rows are waiting than the receiver holds: try again later."""


class WriteBatcher:
    """Writes submitted rows through ``write(rows) -> None`` in batches, on one thread (started
    on the first :meth:`submit`)."""

    def __init__(self, write: Callable[[Sequence[EventRow]], object],
                 max_rows: int = MAX_WAITING_ROWS, batch_rows: int = MAX_BATCH_ROWS,
                 linger_s: float = LINGER_S):
        if max_rows < 1 or batch_rows < 1 or not 0 <= linger_s <= 1:
            raise ValueError("the batch limits must be positive (and the linger at most 1 s)")
        self._write = write
        self.max_rows, self.batch_rows, self.linger_s = max_rows, batch_rows, linger_s
        self._waiting: deque[tuple[list[EventRow], Future]] = deque()
        self._rows = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.batches = 0   # batches written (each one store write)

    def submit(self, rows: Sequence[EventRow]) -> Future:
        """Queue ``rows``; the future gives their count once written, or raises the store's error."""
        done: Future = Future()
        with self._cond:
            if self._closed:
                raise Busy("the receiver is shutting down")
            if self._rows + len(rows) > self.max_rows and self._waiting:
                raise Busy(f"{self._rows} event(s) are waiting to be written (at most {self.max_rows})")
            self._waiting.append((list(rows), done))
            self._rows += len(rows)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rankscope-events-writer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return done

    def close(self, timeout_s: float = 60.0) -> None:
        """Write what is waiting, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _take(self) -> list[tuple[list[EventRow], Future]] | None:
        """The next batch (whole posts, up to ``batch_rows`` rows; at least one post), or None
        once closed and drained."""
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if not self._waiting:
                return None
            end = time.monotonic() + self.linger_s
            while self._rows < self.batch_rows and not self._closed:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)   # more posts join the batch: one store write for them all
            batch, rows = [], 0
            while self._waiting and (not batch or rows + len(self._waiting[0][0]) <= self.batch_rows):
                post = self._waiting.popleft()
                batch.append(post)
                rows += len(post[0])
            self._rows -= rows
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            self._commit(batch)

    def _commit(self, batch: list[tuple[list[EventRow], Future]]) -> None:
        rows = [r for post, _ in batch for r in post]
        try:
            self._write(rows)
        except ValueError as exc:   # the content: write each post alone, fail only the bad one
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
                return
            log.warning("a batch of %d posts was refused (%s); writing them one by one", len(batch), exc)
            for post in batch:
                self._commit([post])
            return
        except Exception as exc:  # noqa: BLE001 - the store's failure is every waiting post's answer
            for _, done in batch:
                done.set_exception(exc)
            return
        self.batches += 1
        for post, done in batch:
            done.set_result(len(post))
