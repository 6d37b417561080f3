"""The stream path against the real InfluxDB 1.x: a subscription forwards every write to the
analyzer's endpoint, and the analysis of what came equals the read path's on the same points,
through the faults of the stream: points refused when the analyzer is behind, the subscription
lost (a server whose meta data is gone), the analyzer killed mid-stream, posts from someone
who is not the server."""

from __future__ import annotations

import base64
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from analyzer.read.line_protocol import LineProtocolError, parse_points
from analyzer.read.stream_feed import StreamEndpoint, StreamFeed
from analyzer.read.subscription import Subscription
from analyzer.service.analyzer_service import AnalyzerService
from rankscope import schema
from rankscope.http_credentials import Credentials
from rankscope.http_intake import make_server
from rankscope.store import InfluxStore
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

SCENARIO = {"topology": {"tp": 1, "pp": 2, "dp": 16, "ep": 4, "gpus_per_node": 8},
            "run": {"job": "stream-job", "iterations": 36, "seed": 11},
            "fault": [{"kind": "compute_slowdown", "node": 2, "factor": 2.0, "start": 16},
                      {"kind": "silent_rank", "ranks": "5-5", "start": 24}]}


class Endpoint:
    """A feed served on a free loopback port, and its subscription on ``store``'s database."""

    def __init__(self, store: InfluxStore, credentials: Credentials | None = None, max_bytes: int = 1 << 28,
                 user: str = ""):
        self.feed = StreamFeed(store.bucket, max_bytes=max_bytes)
        self.http = make_server(("127.0.0.1", 0), StreamEndpoint(self.feed, credentials))
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        dest = self.url.replace("http://", f"http://{user}@") if user else self.url
        self.sub = Subscription(store, self.feed, dest, name="rankscope_test")

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def stores(influx_url):
    made = [InfluxStore(influx_url, bucket=f"stream_{k}_{uuid.uuid4().hex[:8]}", api="v1") for k in ("s", "r")]
    yield made
    for s in made:
        s.drop_database()
        s.close()


def _settle(feed: StreamFeed, lines: int, timeout_s: float = 10.0) -> None:
    """Until the feed has ``lines`` lines, or nothing more came for half a second (refused posts)."""
    deadline, last, seen = time.monotonic() + timeout_s, time.monotonic(), -1
    while feed.counts.lines < lines and time.monotonic() < deadline:
        now = feed.counts.lines + feed.counts.refused
        if now != seen:
            seen, last = now, time.monotonic()
        elif time.monotonic() - last > 0.5:
            return
        time.sleep(0.05)


def _run(stream_store: InfluxStore, read_store: InfluxStore, ep: Endpoint, every: int = 4,
         between=None) -> AnalyzerService:
    """Write the scenario to both databases an iteration at a time; every ``every`` iterations a
    cycle of each service (the stream one fed by ``ep``). ``between(i, ep)`` may break things and
    return a new endpoint (an analyzer started again)."""
    sc = Scenario.from_dict(SCENARIO, name=SCENARIO["run"]["job"])
    sim = ClusterSimulator(sc)
    read_svc = AnalyzerService(read_store, jobs=[sc.job])
    stream_svc = AnalyzerService(stream_store, jobs=[sc.job], stream=ep.feed, subscription=ep.sub)
    ep.sub.ensure()
    written = base = 0
    for i in range(sc.iterations):
        frame = sim.frame(sim.step())
        stream_store.write_stage_latency(frame)
        read_store.write_stage_latency(frame)
        written += len(frame)
        if (i + 1) % every == 0:
            _settle(ep.feed, written - base)
            stream_svc.cycle()
            read_svc.cycle()
            new = between(i, ep) if between is not None else None
            if new is not None:   # a new analyzer: its own feed, from nothing
                ep, base = new, written
                stream_svc = AnalyzerService(stream_store, jobs=[sc.job], stream=ep.feed, subscription=ep.sub)
    _settle(ep.feed, written - base)
    stream_svc.cycle(final=True)
    read_svc.cycle(final=True)
    return stream_svc


def _verdicts(store: InfluxStore) -> list[tuple]:
    inc = store.read(schema.INCIDENT, SCENARIO["run"]["job"])
    last = inc.sort_values("time").groupby("id").tail(1)
    return sorted(zip(last["id"], last["class"], last["ranks"], last["onset_iteration"].astype(int), strict=True))


def _l2(store: InfluxStore):
    df = store.read(schema.L2_KIND, SCENARIO["run"]["job"])
    cols = sorted(c for c in df.columns if c != "time")
    return df.sort_values(["time", *[c for c in ("kind", "stage") if c in cols]])[cols].reset_index(drop=True)


def _same_outputs(stream_store: InfluxStore, read_store: InfluxStore) -> None:
    verdicts = _verdicts(stream_store)
    assert verdicts == _verdicts(read_store)
    classes = {v[1] for v in verdicts}
    assert {"compute_straggler", "silent_rank"} <= classes, verdicts
    a, b = _l2(stream_store), _l2(read_store)
    assert len(a) and a.equals(b)


def test_the_stream_path_equals_the_read_path(stores):
    s, r = stores
    ep = Endpoint(s)
    try:
        stream_svc = _run(s, r, ep)
        assert ep.feed.counts.points > 0 and ep.feed.counts.refused == 0
        # after the first cycle's read the stream served: the reader never read again
        reader = stream_svc.readers[SCENARIO["run"]["job"]]
        assert reader.stream is ep.feed and ep.feed.covers(reader._read_at)
        _same_outputs(s, r)
    finally:
        ep.sub.drop()
        ep.close()
    assert not ep.sub.exists()


def test_points_refused_when_behind_are_read_back(stores):
    s, r = stores
    ep = Endpoint(s, max_bytes=20_000)   # about one iteration's points: most posts refused
    try:
        _run(s, r, ep)
        assert ep.feed.counts.refused > 0
        _same_outputs(s, r)
    finally:
        ep.sub.drop()
        ep.close()


def test_a_lost_subscription_is_made_again_and_the_gap_read_back(stores):
    s, r = stores
    ep = Endpoint(s)

    def drop_at_12(i, ep):
        if i == 11:
            ep.sub.drop()   # the server forgot it (meta data lost): writes stop coming

    try:
        _run(s, r, ep, between=drop_at_12)
        assert ep.sub.exists()
        _same_outputs(s, r)
    finally:
        ep.sub.drop()
        ep.close()


def test_an_analyzer_killed_mid_stream_starts_again_from_the_database(stores):
    s, r = stores
    first = Endpoint(s)
    second: list[Endpoint] = []

    def kill_at_16(i, ep):
        if i != 15:
            return None
        ep.close()   # killed: no clean exit, the subscription stays, to a dead endpoint
        second.append(Endpoint(s))
        return second[-1]

    try:
        _run(s, r, first, between=kill_at_16)
        assert second and second[0].sub.exists()
        _same_outputs(s, r)
    finally:
        for e in second:
            e.sub.drop()
            e.close()


def test_posts_from_someone_not_the_server_are_refused(stores):
    s, _ = stores
    creds = Credentials(user="influx", password="s3cret")
    ep = Endpoint(s, creds, user="influx:s3cret")
    try:
        body = b"stage_latency,job=x,rank=0 iteration=1i,mlp=1.0 1765000000000000000"
        req = urllib.request.Request(ep.url + "/write?db=" + s.bucket, data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 401 and ep.feed.counts.posts == 0
        req.add_header("Authorization", "Basic " + base64.b64encode(b"influx:wrong").decode())
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(req, timeout=5)
        # the server itself, with the credentials in its subscription's URL, gets in
        ep.sub.ensure()
        s.write_lines(["stage_latency,job=y,rank=0 iteration=1i,mlp=1.0 1765000000000"])
        _settle(ep.feed, 1)
        assert ep.feed.counts.posts >= 1
        other = urllib.request.Request(ep.url + "/write?db=elsewhere", data=body, method="POST",
                                       headers={"Authorization": "Basic " + base64.b64encode(b"influx:s3cret").decode()})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(other, timeout=5)
        assert err.value.code == 400
    finally:
        ep.sub.drop()
        ep.close()


def test_line_protocol_with_escapes_quotes_precisions_and_junk():
    body = (b'stage_latency,host=a\\ b,job=j,rank=1 iteration=2i,mlp=1.5,gpu_uuid="GPU-1, x" 1765000000001\n'
            b"stage_latency,host=c,job=j,rank=0 iteration=2i,mlp=2.5 1765000000000\n"
            b"other,job=j x=1 1765000000000\n")
    df = parse_points(body, schema.STAGE_LATENCY, precision="ms")
    assert df["rank"].tolist() == [0, 1] and df["time"].tolist() == [1765000000000, 1765000000001]
    assert df["host"].tolist() == ["c", "a b"] and df["gpu_uuid"].tolist()[1] == "GPU-1, x"
    assert df["mlp"].tolist() == [2.5, 1.5] and df["iteration"].tolist() == [2.0, 2.0]
    assert parse_points(b"other,job=j x=1 1", schema.STAGE_LATENCY).empty
    seven = parse_points(b"stage_latency,host=7,job=7,rank=3 iteration=1i 5\nstage_latency,host=7,job=7,rank=4 "
                         b"iteration=1i 6", schema.STAGE_LATENCY)
    assert seven["job"].tolist() == ["7", "7"] and seven["rank"].tolist() == [3, 4]   # as a read types them
    with pytest.raises(LineProtocolError):
        parse_points(b"stage_latency,job=j,rank=0 junk 1 2 3", schema.STAGE_LATENCY)
    with pytest.raises(LineProtocolError):
        parse_points(body, schema.STAGE_LATENCY, precision="h")


def test_influxdb_restarted_mid_stream_goes_on_with_nothing_lost_or_doubled():
    from tests.influx_server import InfluxServer

    server = InfluxServer().start()
    made = [InfluxStore(server.url, bucket=f"restart_{k}", api="v1") for k in ("s", "r")]
    ep = Endpoint(made[0])

    def restart_at_12(i, ep):
        if i == 11:
            server.stop()
            server.start()   # the same data and meta: the subscription is still there

    try:
        svc = _run(*made, ep, between=restart_at_12)
        assert ep.sub.exists() and ep.feed.counts.refused == 0
        _same_outputs(*made)
        # every point used once: the rows the analyzer took are the points written
        stored = made[0].read_stage_latency(SCENARIO["run"]["job"])
        counts = svc.readers[SCENARIO["run"]["job"]].counts
        assert counts.rows == len(stored) and counts.late_rows == 0
    finally:
        ep.close()
        for s in made:
            s.close()
        server.cleanup()
