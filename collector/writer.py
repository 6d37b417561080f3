"""A background thread that sends a rank's points to the store without ever blocking training.

:meth:`BackgroundWriter.put` appends to a bounded in-memory queue and returns
(a lock held for an append; no I/O, no waiting). The writer thread sends the
queue in batches through :meth:`Store.write_stage_latency`. When the database
is slow or down it keeps the points and retries with exponential backoff; when
the queue is full the OLDEST points are dropped (the newest tell more about a
job that is going wrong now) and counted. Once a write succeeds again the drop
count is itself reported: a warning in the log and an ``event`` point
(``name=collector_dropped_points``, ``value`` = points lost since the last
report), so an operator sees the hole in the data and why.

Give the writer a store without retries of its own (e.g.
``InfluxStore(url, retries=0, timeout_s=5)``): the writer does the retrying.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import pandas as pd

from rankscope import schema
from rankscope.store import RejectedPointsError, Store, open_store

log = logging.getLogger(__name__)

DROP_EVENT = "collector_dropped_points"


@dataclass(frozen=True)
class WriterStats:
    """Counters of a writer since it started."""

    queued: int
    written: int
    dropped: int
    dropped_reported: int
    rejected: int
    failures: int
    last_error: str | None


class BackgroundWriter:
    """Bounded queue + writer thread in front of a :class:`Store`.

    Parameters
    ----------
    store: where points go (``stage_latency``; drop reports to ``event``).
    capacity: most points held while the store is unreachable.
    batch_size: most points per write.
    flush_interval_s: how long the thread waits for more points before writing.
    backoff_s, backoff_max_s: first and largest wait after a failed write (doubling).
    """

    def __init__(
        self,
        store: Store,
        capacity: int = 10_000,
        batch_size: int = 5_000,
        flush_interval_s: float = 1.0,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        name: str = "rankscope-writer",
    ):
        if capacity < 1 or batch_size < 1:
            raise ValueError(f"capacity ({capacity}) and batch_size ({batch_size}) must be >= 1")
        if flush_interval_s <= 0 or backoff_s <= 0 or backoff_max_s < backoff_s:
            raise ValueError("flush_interval_s and backoff_s must be > 0, backoff_max_s >= backoff_s")
        self.store = store
        self.capacity = capacity
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._queue: deque[tuple[int, dict[str, Any]]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._seq = 0
        self._written = 0
        self._dropped = 0
        self._dropped_reported = 0
        self._rejected = 0
        self._failures = 0
        self._last_error: str | None = None
        self._drop_tags: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ hot path
    def put(self, point: dict[str, Any]) -> None:
        """Queue one point; never blocks on the store. Drops the oldest when full."""
        with self._lock:
            if len(self._queue) >= self.capacity:
                self._queue.popleft()
                self._dropped += 1
            self._seq += 1
            self._queue.append((self._seq, point))
            if not self._drop_tags:
                self._drop_tags = {k: point[k] for k in ("job", "rank", "node") if k in point}
        if len(self._queue) >= self.batch_size:
            self._wake.set()

    __call__ = put

    # -------------------------------------------------------------- thread
    def _run(self) -> None:
        delay = self.backoff_s
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            stopping = self._stop.is_set()
            while True:
                ok = self._send_once()
                if ok is None:
                    break  # queue empty
                if ok:
                    delay = self.backoff_s
                    continue
                if self._stop.wait(delay):
                    return  # closing while the store is down: close() reports what is left
                delay = min(delay * 2, self.backoff_max_s)
            if stopping:
                return

    def _send_once(self) -> bool | None:
        """Write one batch; None when there was nothing to write."""
        with self._lock:
            batch = [self._queue[i] for i in range(min(self.batch_size, len(self._queue)))]
        if not batch:
            return None
        try:
            written = self.store.write_stage_latency(pd.DataFrame([p for _, p in batch])).written
        except RejectedPointsError as exc:  # the data's fault: the valid points went in
            self._rejected += len(exc.report.rejected)
            written = exc.report.written
            log.warning("rankscope writer: %s", exc)
        except Exception as exc:  # noqa: BLE001 - any failure of the backend means: retry later
            self._failures += 1
            self._last_error = str(exc)
            log.warning("rankscope writer: store unavailable (%s); %d point(s) queued, retrying",
                        exc, len(self._queue))
            return False
        last = batch[-1][0]
        with self._lock:
            while self._queue and self._queue[0][0] <= last:
                self._queue.popleft()
        self._written += written
        self._report_drops()
        return True

    def _report_drops(self) -> None:
        with self._lock:
            lost = self._dropped - self._dropped_reported
        if lost <= 0:
            return
        tags = self._drop_tags
        text = (f"rank {tags.get('rank', '?')}: the collector dropped {lost} point(s) "
                f"(queue bound {self.capacity}) while the store was unreachable or too slow")
        frame = pd.DataFrame([{
            "time": int(time.time() * 1000), "job": str(tags.get("job", "")), "name": DROP_EVENT,
            "node": str(tags.get("node", "")), "severity": "warning", "source": "rankscope.collector",
            "rank": int(tags.get("rank", -1)), "text": text, "value": int(lost),
        }])
        try:
            self.store.write_measurement(schema.EVENT, frame)
        except Exception as exc:  # noqa: BLE001 - reported again after the next good write
            log.warning("rankscope writer: could not report %d dropped point(s): %s", lost, exc)
            return
        log.warning("rankscope writer: %s", text)
        self._dropped_reported += lost

    # ------------------------------------------------------------- control
    def stats(self) -> WriterStats:
        with self._lock:
            queued = len(self._queue)
        return WriterStats(queued, self._written, self._dropped, self._dropped_reported,
                           self._rejected, self._failures, self._last_error)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until the queue is empty (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._queue and self._dropped == self._dropped_reported:
                return True
            self._wake.set()
            time.sleep(0.01)
        return not self._queue

    def close(self, timeout_s: float = 30.0) -> WriterStats:
        """Send what is queued (up to ``timeout_s``), stop the thread and return the counters."""
        self.flush(timeout_s)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        stats = self.stats()
        if stats.queued:
            log.warning("rankscope writer: closing with %d point(s) unsent (%s)", stats.queued,
                        stats.last_error)
        return stats

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_writer(store: str | None = None, bucket: str | None = None, timeout_s: float = 10.0,
                **kwargs: Any) -> BackgroundWriter:
    """A writer on the configured store (``--store``/``RANKSCOPE_STORE``, as every command),
    with the store's own retries turned off so the writer's backoff is the only one."""
    return BackgroundWriter(open_store(store, bucket, timeout_s=timeout_s, retries=0), **kwargs)
