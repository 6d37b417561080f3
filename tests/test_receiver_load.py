"""The receiver under the issue's load, bounded: 500 posts from 20 concurrent clients (each on
a new connection) against the real receiver writing to the real InfluxDB. None is refused or
reset, every one is answered 200, and every event is stored exactly once. The latency figures
are the benchmark's (``python -m benchmarks.run receiver``): 2 shared cores make them too noisy
to assert here."""

from __future__ import annotations

import threading

import pytest

from events.receiver import EventReceiver, ReceiverConfig
from events.rows import EventRow
from events.write_batcher import Busy, WriteBatcher
from rankscope.http_intake import LISTEN_BACKLOG
from tests.receiver_load import CLIENTS, POSTS, basic_auth, run_load

USER, PASSWORD = "alertmanager", "load-test-password"


@pytest.mark.faults
def test_500_posts_from_20_clients_none_refused_each_stored_once(influx_store):
    receiver = EventReceiver(influx_store, ("127.0.0.1", 0),
                             ReceiverConfig(user=USER, password=PASSWORD)).start()
    try:
        assert receiver.server.request_queue_size == LISTEN_BACKLOG >= 128
        result = run_load(receiver.url + "/alertmanager", basic_auth(USER, PASSWORD))
    finally:
        receiver.shutdown()
    assert result.failures == [], result.failures[:5]
    assert result.statuses == {200: POSTS}, result.summary()
    assert result.wall_s < 120, result.summary()
    back = influx_store.read_events()
    assert len(back) == POSTS
    assert sorted(back["host"]) == [f"load-host-{i:05d}" for i in range(POSTS)]
    # concurrent posts shared store writes (group commit): fewer writes than posts
    assert receiver.batcher.batches < POSTS
    assert CLIENTS == 20


def test_the_write_batcher_answers_each_post_with_its_own_fate():
    """One store write carries many posts; a batch the store refuses for its content is
    written again post by post, so only the bad post fails; too much waiting: Busy."""
    written: list[int] = []
    gate = threading.Event()

    def write(rows):
        gate.wait(10)
        if any(r.name == "bad" for r in rows):
            raise ValueError("bad row")
        written.append(len(rows))

    batcher = WriteBatcher(write, max_rows=6)
    row = EventRow(1_783_500_000_000, "ok", "h")
    bad = EventRow(1_783_500_000_000, "bad", "h")
    first = batcher.submit([row])                # taken at once, blocked in the store
    queued = [batcher.submit([row, row]), batcher.submit([bad]), batcher.submit([row])]
    try:
        batcher.submit([row] * 4)
        raise AssertionError("over the bound was not refused")
    except Busy as exc:
        assert "waiting to be written" in str(exc)
    gate.set()
    assert first.result(10) == 1
    assert queued[0].result(10) == 2 and queued[2].result(10) == 1
    assert isinstance(queued[1].exception(10), ValueError)
    batcher.close()
    assert sorted(written) == [1, 1, 2]          # the refused batch of 4 rows, then one by one
