"""The background writer on the real InfluxDB: delivery, outage buffering, drops, rejections."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from collector.coordinates import RankCoordinates
from collector.stage_timer import StageTimer
from collector.writer import DROP_EVENT, BackgroundWriter, open_writer
from rankscope.store import InfluxStore
from rankscope.topology import Topology


def point(it: int, rank: int = 3, mlp: float = 30.0) -> dict:
    return {"time": 1_790_000_000_000 + it * 1000, "job": "w", "rank": rank, "pp": 0, "dp": rank,
            "tp": 0, "ep_group": rank, "node": 0, "iteration": it, "iteration_ms": 100.0 + it,
            "mlp": mlp + it}


def test_points_arrive_in_the_store(influx_store):
    writer = BackgroundWriter(influx_store, flush_interval_s=0.05, batch_size=7)
    for it in range(25):
        writer.put(point(it))
    stats = writer.close()
    assert (stats.written, stats.dropped, stats.queued, stats.failures) == (25, 0, 0, 0)
    df = influx_store.read_stage_latency("w")
    assert df["iteration"].tolist() == list(range(25))
    assert np.allclose(df["mlp"], 30.0 + np.arange(25))
    assert set(df["rank"]) == {3}


def test_the_writer_stores_what_a_direct_frame_write_stores(influx_store, influx_url):
    """The writer goes through Store.write_stage_latency (one write path): the same rows as a
    frame written directly, missing values left out, tags escaped."""
    import pandas as pd

    points = [point(it, rank=r, mlp=0.001 * it + 1e-7 * r) for it in range(5) for r in (0, 7)]
    points[3]["attention"] = float("nan")  # missing, left out
    points[4]["job"] = "w with, comma=x"  # tag escaping
    writer = BackgroundWriter(influx_store, flush_interval_s=0.05, batch_size=3)
    for p in points:
        writer.put(p)
    assert writer.close().written == len(points)
    other = InfluxStore(influx_url, f"test_{uuid.uuid4().hex[:10]}", api="v1")
    try:
        other.write_stage_latency(pd.DataFrame(points))
        for job in ("w", "w with, comma=x"):
            a, b = influx_store.read_stage_latency(job), other.read_stage_latency(job)
            assert len(a) == len(b) > 0
            pd.testing.assert_frame_equal(a[sorted(a.columns)], b[sorted(b.columns)])
    finally:
        other.drop_database()
        other.close()


class BlockingStore:
    """A store whose writes wait until the test releases them (a database that hangs)."""

    def __init__(self, inner):
        self.inner = inner
        self.release = threading.Event()
        self.entered = threading.Event()

    def write_stage_latency(self, frame):
        self.entered.set()
        assert self.release.wait(60), "the test never released the store"
        return self.inner.write_stage_latency(frame)

    def write_measurement(self, measurement, frame):
        return self.inner.write_measurement(measurement, frame)


def test_put_never_waits_for_a_hanging_store(influx_store):
    """While the writer thread is stuck inside a write, put() keeps returning: every put below
    completes before the store is released (a put that waited would never get there)."""
    store = BlockingStore(influx_store)
    writer = BackgroundWriter(store, capacity=20, flush_interval_s=0.01, batch_size=5)
    writer.put(point(0))
    assert store.entered.wait(30)            # the writer thread is now inside the hung write
    for it in range(1, 101):
        writer.put(point(it))
    assert not store.release.is_set()        # all 100 puts returned while the store hung
    held = writer.stats()
    # the bound held, the oldest waiting points went; point 0 is in flight, not dropped
    assert (held.queued, held.in_flight, held.dropped, held.sent) == (20, 1, 80, 101)
    assert held.balanced
    store.release.set()
    stats = writer.close()
    assert (stats.queued, stats.in_flight, stats.written, stats.dropped) == (0, 0, 21, 80)
    assert stats.balanced and stats.unconfirmed == 0
    assert influx_store.read_stage_latency("w")["iteration"].tolist() == [0, *range(81, 101)]


def test_a_write_that_succeeds_after_close_gave_up_on_it_is_counted_written(influx_store):
    """close() cannot wait for a hung write: its batch is unconfirmed (it may land). When the
    write then succeeds its points move to written, still counted once."""
    store = BlockingStore(influx_store)
    writer = BackgroundWriter(store, capacity=20, flush_interval_s=0.01, batch_size=5)
    writer.put(point(0))
    assert store.entered.wait(30)            # point 0 is inside the hung write
    writer.put(point(1))                     # point 1 waits, never sent
    closed = writer.close(timeout_s=0.2)
    assert (closed.unconfirmed, closed.dropped, closed.written) == (1, 1, 0) and closed.balanced
    store.release.set()
    deadline = time.monotonic() + 10
    while writer.stats().unconfirmed and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.put(point(2))                     # a closed writer takes nothing: dropped
    after = writer.stats()
    assert (after.unconfirmed, after.written, after.dropped, after.sent) == (0, 1, 2, 3)
    assert after.balanced
    assert influx_store.read_stage_latency("w")["iteration"].tolist() == [0]


def test_invalid_values_are_counted_and_the_rest_written(influx_store):
    writer = BackgroundWriter(influx_store, flush_interval_s=0.05)
    writer.put(point(0))
    writer.put(point(1, mlp=float("inf")))
    writer.put(point(2))
    stats = writer.close()
    assert (stats.rejected, stats.written, stats.queued) == (1, 2, 0)  # not retried forever
    assert stats.balanced
    df = influx_store.read_stage_latency("w")
    assert sorted(df["iteration"]) == [0, 2]


def test_a_batch_the_store_can_never_take_is_rejected_not_retried_forever(influx_store):
    """A tag value line protocol cannot carry refuses its whole batch before anything is sent:
    counted rejected once, and the batches after it still go in."""
    writer = BackgroundWriter(influx_store, flush_interval_s=0.02, batch_size=1)
    writer.put(point(0))
    writer.put({**point(1), "job": "w\nx"})
    writer.put(point(2))
    assert writer.flush(10)
    stats = writer.close()
    assert (stats.written, stats.rejected, stats.failures, stats.sent) == (2, 1, 0, 3)
    assert stats.balanced
    assert sorted(influx_store.read_stage_latency("w")["iteration"]) == [0, 2]


def test_bad_settings_are_refused(influx_store):
    with pytest.raises(ValueError, match="capacity"):
        BackgroundWriter(influx_store, capacity=0)
    with pytest.raises(ValueError, match="backoff"):
        BackgroundWriter(influx_store, backoff_s=1.0, backoff_max_s=0.5)


def test_open_writer_uses_the_configured_store_without_store_retries(influx_url):
    bucket = f"test_{uuid.uuid4().hex[:10]}"
    writer = open_writer(influx_url, bucket, flush_interval_s=0.05)
    try:
        assert isinstance(writer.store, InfluxStore) and writer.store.retries == 0
        writer.put(point(0))
        assert writer.close().written == 1
        assert len(writer.store.read_stage_latency("w")) == 1
    finally:
        writer.store.drop_database()


def test_outage_buffers_within_the_bound_drops_the_oldest_and_reports_it(influx_server):
    """influxd is stopped while the training loop runs (connections refused): the batch in
    flight and the newest ``capacity`` points arrive after the restart, the rest are counted
    as dropped and reported, each point once."""
    capacity = 30
    store = InfluxStore(influx_server.url, f"outage_{uuid.uuid4().hex[:8]}", api="v1",
                        retries=0, timeout_s=2.0)
    writer = BackgroundWriter(store, capacity=capacity, batch_size=10, flush_interval_s=0.05,
                              backoff_s=0.05, backoff_max_s=0.2)
    coords = RankCoordinates.from_topology(Topology(dp=8, gpus_per_node=4), 6, "outage-job")
    timer = StageTimer(coords, sink=writer.put)

    def train(n: int) -> list[float]:
        step_s = []
        for _ in range(n):
            t0 = time.perf_counter()
            with timer.stage("mlp"):
                time.sleep(0.002)  # stands for the step's compute
            timer.step()
            step_s.append(time.perf_counter() - t0)
        return step_s

    try:
        train(10)
        assert writer.flush(10)
        influx_server.stop()
        outage = train(80)
        down = writer.stats()
        influx_server.start()
        assert writer.flush(20)  # the buffered points go in once the server is back
        train(10)
        assert writer.flush(20)
        stats = writer.close()

        k = down.in_flight  # the first points of the outage, sent and retried
        assert down.failures >= 1 and down.queued == capacity and 1 <= k <= 10 and down.balanced
        assert len(outage) == 80  # (that put never waits is test_put_never_waits_for_a_hanging_store)
        assert stats.dropped == 80 - capacity - k and stats.dropped_reported == stats.dropped
        assert stats.written == 10 + k + capacity + 10 and stats.queued == stats.unconfirmed == 0
        assert stats.balanced and stats.sent == 100

        df = store.read_stage_latency("outage-job")
        # before the outage, the batch in flight, the newest `capacity` of the outage, after
        expected = [*range(10 + k), *range(90 - capacity, 90), *range(90, 100)]
        assert df["iteration"].tolist() == expected
        assert (df["mlp"] >= 2.0).all()
        events = store.read_events("outage-job")
        drop = events[events["name"] == DROP_EVENT]
        assert drop["value"].astype(int).tolist() == [stats.dropped]
        assert drop["rank"].astype(int).tolist() == [6]
        assert f"dropped {stats.dropped} point(s)" in drop["text"].iloc[0]
    finally:
        writer.close(timeout_s=1)
        if influx_server.proc is None:
            influx_server.start()
        store.drop_database()
        store.close()
