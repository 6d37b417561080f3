"""A background thread that sends a rank's points to the store without ever blocking training.

:meth:`BackgroundWriter.put` appends to a bounded in-memory queue and returns
(a lock held for an append; no I/O, no waiting). The writer thread takes a batch
off the queue and sends it through :meth:`Store.write_stage_latency`; when the
database is slow or down it retries that batch with exponential backoff.

Every point handed to ``put`` is counted once, in exactly one of:

- ``queued``: waiting, never sent;
- ``in_flight``: the batch being sent or retried;
- ``written``: stored (a write, or a retry of it, succeeded);
- ``rejected``: refused by the store (the data's fault: inf, a tag line protocol cannot
  carry, older than the retention policy); not retried;
- ``dropped``: never stored, and surely so: pushed out of the full queue before it was
  ever sent (the OLDEST waiting points go: the newest tell more about a job that is going
  wrong now), handed to a closed writer, or still held at close while every attempt was
  refused before reaching the server;
- ``unconfirmed``: its batch may or may not have been stored: a write timed out (InfluxDB
  may apply it later) and the writer was closed before a retry succeeded.

so that ``sent == queued + in_flight + written + rejected + dropped + unconfirmed`` at
every moment (:attr:`WriterStats.balanced`). A batch whose write timed out is retried
as it is: rewriting a point with the same measurement, tags and timestamp replaces it in
InfluxDB, so a batch applied late and written again is stored once, and counted written
once. Drops are reported once a write succeeds again: a warning in the log and an
``event`` point (:mod:`collector.writer.drop_report`), with ``value`` = real drops only.

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

from collector.writer.drop_report import DROP_EVENT, REPORT_TAGS, DropReport, drop_report
from collector.writer.write_fate import Fate, classify
from rankscope import schema
from rankscope.store import RejectedPointsError, Store, open_store

log = logging.getLogger(__name__)

__all__ = ["DROP_EVENT", "BackgroundWriter", "WriterStats", "open_writer"]


@dataclass(frozen=True)
class WriterStats:
    """Counters of a writer since it started (see the module docstring for each)."""

    queued: int
    written: int
    dropped: int
    dropped_reported: int
    rejected: int
    failures: int
    last_error: str | None
    sent: int = 0
    in_flight: int = 0
    unconfirmed: int = 0

    @property
    def balanced(self) -> bool:
        """Every point handed to ``put`` is in exactly one counter."""
        return self.sent == (self.queued + self.in_flight + self.written + self.rejected
                             + self.dropped + self.unconfirmed)


@dataclass
class _Batch:
    points: list[dict[str, Any]]
    unknown: bool = False       # an attempt ended with the batch's fate unknown
    attempting: bool = False    # the thread is inside a write of it now
    abandoned: bool = False     # close() gave up on it while its fate was open: unconfirmed


class BackgroundWriter:
    """Bounded queue + writer thread in front of a :class:`Store`.

    Parameters
    ----------
    store: where points go (``stage_latency``; drop reports to ``event``).
    capacity: most points waiting to be sent; the batch in flight (at most
        ``batch_size`` points) is held apart until its fate is known.
    batch_size: most points per write.
    flush_interval_s: how long the thread waits for more points before writing.
    backoff_s, backoff_max_s: first and largest wait after a failed write (doubling).
    measurement: what the points are (``stage_latency``; ``kernel_stats`` and ``kernel_name``
        for the kernel channel: :mod:`collector.kernel_channel`).
    """

    def __init__(self, store: Store, capacity: int = 10_000, batch_size: int = 5_000,
                 flush_interval_s: float = 1.0, backoff_s: float = 0.5, backoff_max_s: float = 30.0,
                 name: str = "rankscope-writer", measurement: str = schema.STAGE_LATENCY):
        if measurement not in schema.MEASUREMENTS:
            raise ValueError(f"measurement {measurement!r} is not one of the schema's")
        if capacity < 1 or batch_size < 1:
            raise ValueError(f"capacity ({capacity}) and batch_size ({batch_size}) must be >= 1")
        if flush_interval_s <= 0 or backoff_s <= 0 or backoff_max_s < backoff_s:
            raise ValueError("flush_interval_s and backoff_s must be > 0, backoff_max_s >= backoff_s")
        self.store, self.measurement = store, measurement
        self.capacity = capacity
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._pending: deque[dict[str, Any]] = deque()
        self._batch: _Batch | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        self._counts = dict.fromkeys(("sent", "written", "dropped", "rejected", "unconfirmed",
                                      "dropped_reported", "failures"), 0)
        self._last_error: str | None = None
        self._drop_tags: dict[str, Any] = {}
        self._report: DropReport | None = None
        self._report_second = 0
        self._reporting = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ hot path
    def put(self, point: dict[str, Any]) -> None:
        """Queue one point; never blocks on the store. Drops the oldest waiting point when full."""
        with self._lock:
            self._counts["sent"] += 1
            if self._closed:
                self._counts["dropped"] += 1
                return
            if len(self._pending) >= self.capacity:
                self._pending.popleft()
                self._counts["dropped"] += 1
            self._pending.append(point)
            if not self._drop_tags:
                self._drop_tags = {k: point[k] for k in REPORT_TAGS if k in point}
            full = len(self._pending) >= self.batch_size
        if full:
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
                    break  # nothing to send
                if ok:
                    delay = self.backoff_s
                    continue
                if self._stop.wait(delay):
                    return  # closing while the store is down: close() settles what is left
                delay = min(delay * 2, self.backoff_max_s)
            if stopping:
                return

    def _send_once(self) -> bool | None:
        """Write the batch in flight (or a new one), else a pending drop report; None: idle."""
        batch = self._next_batch()
        if batch is not None:
            return self._attempt(batch)
        with self._lock:
            unreported = self._unreported()
        return self._report_drops() if unreported else None

    def _next_batch(self) -> _Batch | None:
        with self._lock:
            if self._closed:
                return None
            if self._batch is None and self._pending:
                n = min(self.batch_size, len(self._pending))
                self._batch = _Batch([self._pending.popleft() for _ in range(n)])
            if self._batch is not None:
                self._batch.attempting = True
            return self._batch

    def _attempt(self, batch: _Batch) -> bool:
        """One write of ``batch``: True when its fate is settled, False to retry it later."""
        size = len(batch.points)
        try:
            frame = pd.DataFrame(batch.points)
            if self.measurement == schema.STAGE_LATENCY:
                self.store.write_stage_latency(frame)
            else:
                self.store.write_measurement(self.measurement, frame)
            rejected = 0
        except RejectedPointsError as exc:  # the data's fault: the valid points went in
            rejected = len(exc.report.rejected)
            log.warning("rankscope writer: %s", exc)
        except Exception as exc:  # noqa: BLE001 - what it means for the batch is classify()'s
            outcome = classify(exc, size)
            if not outcome.settled:
                self._failed(batch, exc, outcome.fate)
                return False
            rejected = outcome.refused
            log.warning("rankscope writer: the store refused %d of %d point(s): %s", rejected, size, exc)
        self._settle(batch, size - rejected, rejected)
        self._report_drops()
        return True

    def _settle(self, batch: _Batch, written: int, rejected: int) -> None:
        with self._lock:
            if batch.abandoned:  # close() counted it unconfirmed; its fate is now known
                self._counts["unconfirmed"] -= len(batch.points)
            self._counts["written"] += written
            self._counts["rejected"] += rejected
            batch.attempting = False
            if self._batch is batch:
                self._batch = None

    def _failed(self, batch: _Batch, exc: Exception, fate: Fate) -> None:
        with self._lock:
            self._counts["failures"] += 1
            self._last_error = str(exc)
            batch.unknown = batch.unknown or fate is Fate.UNKNOWN
            batch.attempting = False
            queued = len(self._pending)
        log.warning("rankscope writer: store unavailable (%s; batch %s); %d point(s) in flight, "
                    "%d queued, retrying", exc, fate.value, len(batch.points), queued)

    # -------------------------------------------------------- drop reports
    def _unreported(self) -> int:
        """Drops not yet reported (0 once reporting was refused for good); under the lock."""
        return self._counts["dropped"] - self._counts["dropped_reported"] if self._reporting else 0

    def _report_drops(self) -> bool:
        """Write the pending drop report (built once, then retried unchanged); True when done."""
        with self._lock:
            if self._report is None:
                lost = self._unreported()
                if lost <= 0:
                    return True
                self._report = drop_report(self._drop_tags, lost, self.capacity, self._report_second)
                self._report_second = self._report.second
            report = self._report
        try:
            self.store.write_measurement(schema.EVENT, report.frame)
        except Exception as exc:  # noqa: BLE001 - retried after the next good write
            if classify(exc, 1).settled:
                log.error("rankscope writer: the store refuses drop reports (%s); not reporting "
                          "%d dropped point(s)", exc, report.lost)
                with self._lock:
                    self._reporting, self._report = False, None
                return True
            log.warning("rankscope writer: could not report %d dropped point(s): %s", report.lost, exc)
            return False
        with self._lock:
            self._counts["dropped_reported"] += report.lost
            self._report = None
        log.warning("rankscope writer: %s", report.text)
        return True

    # ------------------------------------------------------------- control
    def stats(self) -> WriterStats:
        """A consistent snapshot of the counters (:attr:`WriterStats.balanced` holds)."""
        with self._lock:
            c = self._counts
            in_flight = len(self._batch.points) if self._batch is not None else 0
            return WriterStats(len(self._pending), c["written"], c["dropped"], c["dropped_reported"],
                               c["rejected"], c["failures"], self._last_error, c["sent"], in_flight,
                               c["unconfirmed"])

    def _drained(self) -> bool:
        with self._lock:
            return not self._pending and self._batch is None

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until nothing is queued or in flight and the drops are reported (True), or
        ``timeout_s`` passed (False unless only a drop report is still owed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                done = not self._pending and self._batch is None and not self._unreported()
            if done or self._closed:
                return True
            self._wake.set()
            time.sleep(0.01)
        return self._drained()

    def close(self, timeout_s: float = 30.0) -> WriterStats:
        """Send what is left (up to ``timeout_s``), stop the thread and return the counters.

        What could not be sent by then is settled: points still waiting are dropped, the
        batch in flight is unconfirmed if any attempt of it may have reached the store
        (dropped if every attempt was refused before). Should a write still running then
        succeed, its points move from unconfirmed to written. Closing again returns the counters."""
        if self._closed:
            return self.stats()
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s)
        self._stop.set()
        self._wake.set()
        self._thread.join(max(0.1, deadline - time.monotonic()))
        self._give_up()
        stats = self.stats()
        if stats.dropped - stats.dropped_reported or stats.unconfirmed:
            log.warning("rankscope writer: closed with %d dropped point(s) unreported and %d "
                        "unconfirmed (%s)", stats.dropped - stats.dropped_reported,
                        stats.unconfirmed, stats.last_error)
        return stats

    def _give_up(self) -> None:
        with self._lock:
            self._closed = True
            self._counts["dropped"] += len(self._pending)
            self._pending.clear()
            batch, self._batch = self._batch, None
            if batch is None:
                return
            batch.abandoned = batch.attempting or batch.unknown
            key = "unconfirmed" if batch.abandoned else "dropped"
            self._counts[key] += len(batch.points)

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_writer(store: str | None = None, bucket: str | None = None, timeout_s: float = 10.0,
                **kwargs: Any) -> BackgroundWriter:
    """A writer on the configured store (``--store``/``RANKSCOPE_STORE``, as every command),
    with the store's own retries turned off so the writer's backoff is the only one."""
    return BackgroundWriter(open_store(store, bucket, timeout_s=timeout_s, retries=0), **kwargs)
