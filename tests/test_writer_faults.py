"""The background writer while the real InfluxDB hangs (SIGSTOP): writes time out, InfluxDB may
apply them after SIGCONT, the writer retries them. Each point handed to the writer is counted
once (written, dropped or unconfirmed), stored at most once, and only real drops are reported."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from collector.writer import DROP_EVENT, BackgroundWriter, WriterStats
from rankscope.store import InfluxStore

pytestmark = pytest.mark.faults


def point(it: int) -> dict:
    return {"time": 1_790_000_000_000 + it * 1000, "job": "w", "rank": 5, "pp": 0, "dp": 5,
            "tp": 0, "ep_group": 5, "node": 1, "iteration": it, "iteration_ms": 100.0, "mlp": 1.0 + it}


@pytest.fixture
def hung_store(influx_server) -> Iterator[InfluxStore]:
    """A store on the private influxd with a short timeout and no retries of its own."""
    store = InfluxStore(influx_server.url, f"hang_{uuid.uuid4().hex[:8]}", api="v1",
                        retries=0, timeout_s=0.5)
    try:
        yield store
    finally:
        store.drop_database()
        store.close()


@contextmanager
def stopped(server) -> Iterator[None]:
    """influxd frozen: connections are accepted by the kernel, requests time out."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def stored(store: InfluxStore) -> list[int]:
    df = store.read_stage_latency("w")
    return df["iteration"].astype(int).tolist() if len(df) else []


def test_timed_out_batches_are_retried_and_every_point_is_stored_once(influx_server, hung_store):
    capacity, outage = 300, 1000
    writer = BackgroundWriter(hung_store, capacity=capacity, batch_size=100, flush_interval_s=0.02,
                              backoff_s=0.05, backoff_max_s=0.2)
    snapshots: list[WriterStats] = []
    try:
        for it in range(200):
            writer.put(point(it))
        assert writer.flush(10)
        with stopped(influx_server):
            for it in range(200, 200 + outage):
                writer.put(point(it))
                if it % 50 == 0:
                    snapshots.append(writer.stats())
                    time.sleep(0.005)
            time.sleep(1.3)  # writes time out (and are retried)
            down = writer.stats()
        assert writer.flush(20)
        stats = writer.close()
    finally:
        writer.close(timeout_s=1)
    snapshots += [down, stats]
    assert all(s.balanced for s in snapshots), [s for s in snapshots if not s.balanced]
    assert down.failures >= 1 and "timed out" in (down.last_error or "")
    k = down.in_flight  # the batch that timed out, then was retried
    assert 1 <= k <= 100 and down.queued == capacity
    assert (stats.sent, stats.queued, stats.in_flight, stats.unconfirmed, stats.rejected) == (1200, 0, 0, 0, 0)
    assert stats.dropped == outage - capacity - k and stats.written == 1200 - stats.dropped

    iterations = stored(hung_store)
    assert len(iterations) == len(set(iterations)) == stats.written  # each point once
    assert set(iterations) == set(range(200 + k)) | set(range(1200 - capacity, 1200))
    events = hung_store.read_events("w")
    drops = events[events["name"] == DROP_EVENT]["value"].astype(int)
    assert drops.sum() == stats.dropped == stats.dropped_reported  # only the real drops


def test_closing_while_the_database_hangs_counts_the_batch_in_flight_unconfirmed(influx_server, hung_store):
    writer = BackgroundWriter(hung_store, capacity=50, batch_size=20, flush_interval_s=0.02,
                              backoff_s=0.05, backoff_max_s=0.2)
    try:
        for it in range(10):
            writer.put(point(it))
        assert writer.flush(10)
        with stopped(influx_server):
            for it in range(10, 110):
                writer.put(point(it))
            time.sleep(0.8)  # a write of the first batch timed out
            closed = writer.close(timeout_s=0.3)
        k = 100 - closed.dropped  # the batch in flight at close
        assert closed.balanced and (closed.queued, closed.in_flight, closed.written) == (0, 0, 10)
        assert 1 <= k <= 20 and closed.unconfirmed == k and closed.dropped == 100 - k
        assert closed.dropped_reported == 0  # the store was down: logged, not reported
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(stored(hung_store)) < 10 + k:
            time.sleep(0.1)  # influxd may apply the timed-out write now that it runs again
        later = writer.stats()
    finally:
        writer.close(timeout_s=1)
    iterations = stored(hung_store)
    assert len(iterations) == len(set(iterations)) and len(iterations) in (10, 10 + k)
    assert later.balanced and later.written + later.unconfirmed == 10 + k
    assert later.written <= len(iterations)  # counted written only when a write succeeded


def test_closing_while_the_database_is_down_drops_what_never_reached_it(influx_server, hung_store):
    writer = BackgroundWriter(hung_store, capacity=50, batch_size=20, flush_interval_s=0.02,
                              backoff_s=0.05, backoff_max_s=0.1)
    influx_server.stop()
    try:
        for it in range(30):
            writer.put(point(it))
        time.sleep(0.3)  # connections refused: nothing reached the server
        stats = writer.close(timeout_s=0.3)
    finally:
        writer.close(timeout_s=1)
        influx_server.start()
    assert stats.balanced and stats.written == 0 and stats.failures >= 1
    assert stats.dropped + stats.unconfirmed == 30 and stats.unconfirmed <= 20
    assert stored(hung_store) == []
