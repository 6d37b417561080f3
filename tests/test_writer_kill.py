"""The background writer while the real InfluxDB is killed (SIGKILL) in the middle of its writes
and restarted on its own data (issue 29, item 6): what was put meanwhile waits in the queue,
the batch whose write the kill cut (applied or not) is retried as it is, and every point is
stored exactly once and counted written once."""

from __future__ import annotations

import time
import uuid

import pytest

from collector.writer import BackgroundWriter
from rankscope.store import InfluxStore

pytestmark = pytest.mark.faults


def point(it: int) -> dict:
    return {"time": 1_791_000_000_000 + it * 1000, "job": "k", "rank": 3, "pp": 0, "dp": 3,
            "tp": 0, "ep_group": 3, "node": 0, "iteration": it, "iteration_ms": 100.0, "mlp": 1.0 + it}


def test_points_put_across_a_kill_and_restart_of_influxdb_are_stored_once(influx_server):
    store = InfluxStore(influx_server.url, f"kill_{uuid.uuid4().hex[:8]}", api="v1", retries=0, timeout_s=1)
    writer = BackgroundWriter(store, capacity=5_000, batch_size=50, flush_interval_s=0.01,
                              backoff_s=0.05, backoff_max_s=0.3)
    try:
        for it in range(2_000):
            writer.put(point(it))
            if it % 50 == 0:
                time.sleep(0.002)          # batches go out while points keep coming
            if it == 600:                  # killed while it writes
                influx_server.proc.kill()
                influx_server.proc.wait()
        down = writer.stats()
        influx_server.proc = None
        influx_server.log.close()
        influx_server.start()              # on its own data
        assert writer.flush(30)
        stats = writer.close()
    finally:
        writer.close(timeout_s=1)
        if influx_server.proc is None:
            influx_server.start()
    try:
        assert down.balanced and down.failures >= 1
        assert stats.balanced and (stats.sent, stats.written) == (2_000, 2_000)
        assert (stats.dropped, stats.unconfirmed, stats.rejected, stats.queued, stats.in_flight) == (0, 0, 0, 0, 0)
        stored = store.read_stage_latency("k")["iteration"].tolist()
        assert sorted(stored) == list(range(2_000))     # each once: a retried batch rewrote its points
    finally:
        store.drop_database()
        store.close()
