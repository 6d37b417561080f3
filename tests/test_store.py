"""The store contract, on the real InfluxDB and on the embedded store."""

import http.server
import json
import threading

import numpy as np
import pandas as pd
import pytest

from rankscope import schema
from rankscope.frames import cube_to_frame, frame_to_cube
from rankscope.lineprotocol import LineProtocolError
from rankscope.store import InfluxStore, RejectedPointsError, influxql, open_store
from rankscope.topology import Topology

IL = Topology(tp=1, pp=9, dp=1440, ep=32, gpus_per_node=8)
STAGES = schema.DEFAULT_STAGES.names


def _iteration_frame(topo, job="il-0477", iteration=5, time_ms=1_700_000_000_000, seed=0, us=False):
    rng = np.random.default_rng(seed)
    values = rng.uniform(0.5, 300.0, size=(topo.world, len(STAGES)))
    if us:  # collectors' 1 us resolution: the encoder's fixed-point path
        values = np.round(values, 3)
    it_ms = values.sum(axis=1) * 100
    return cube_to_frame(job, topo, iteration, time_ms, values, STAGES, it_ms)


@pytest.mark.parametrize("us", [False, True], ids=["full-precision", "us-resolution"])
def test_full_iteration_round_trips_exactly(influx_store, us):
    df = _iteration_frame(IL, us=us)
    report = influx_store.write_stage_latency(df)
    assert report.written == 12960 and not report.rejected
    back = influx_store.read_stage_latency("il-0477")
    assert len(back) == 12960
    back = back.sort_values("rank").reset_index(drop=True)
    for col in ["rank", "pp", "dp", "tp", "ep_group", "node", "iteration", "time"]:
        assert np.array_equal(back[col].to_numpy(), df[col].to_numpy()), col
    for col in STAGES + ["iteration_ms"]:
        assert np.array_equal(back[col].to_numpy(dtype=float), df[col].to_numpy()), col
    assert (back["job"] == "il-0477").all()
    cube = frame_to_cube(back, IL.world, STAGES)
    assert cube.values.shape == (1, 12960, len(STAGES))
    assert np.array_equal(cube.values[0], df[STAGES].to_numpy())


HOSTILE = [
    "job with spaces", "comma,job", "equals=job", "quote'job", 'dq"job', "back\\slash",
    "ünïcødé-作业-🚀", "'; DROP DATABASE x; --", "a' OR job='b", "x\\' OR '1'='1",
]


def test_hostile_job_names_round_trip_without_injection(any_store):
    topo = Topology(tp=1, pp=1, dp=4, gpus_per_node=2)
    for i, job in enumerate(HOSTILE):
        any_store.write_stage_latency(_iteration_frame(topo, job=job, time_ms=1000 + i, seed=i))
    for i, job in enumerate(HOSTILE):
        back = any_store.read_stage_latency(job)
        assert len(back) == 4, job
        assert set(back["job"]) == {job}
        assert back["time"].tolist() == [1000 + i] * 4
    assert sorted(any_store.jobs()) == sorted(HOSTILE)
    # a name that looks like a clause matches nothing and drops nothing
    assert len(any_store.read_stage_latency("a")) == 0
    assert len(any_store.read_stage_latency("x")) == 0


def test_hostile_tag_values_and_strings_round_trip(any_store):
    values = ["sp ace", "co,mma", "eq=ual", "back\\slash", "ü 作", 'q"uote', "tab\there"]
    df = pd.DataFrame({
        "time": np.arange(len(values), dtype=np.int64) + 10,
        "job": "j", "name": values, "node": 3, "severity": "warning", "source": "monitor",
        "rank": -1, "text": [v + ' "text" \\ end\\' for v in values], "value": 1,
    })
    any_store.write_measurement(schema.EVENT, df)
    back = any_store.read_events("j")
    assert back["name"].tolist() == values
    assert back["text"].tolist() == df["text"].tolist()
    assert back["node"].tolist() == [3] * len(values)


def test_newline_in_tag_refused_before_anything_is_written(any_store):
    topo = Topology(tp=1, pp=1, dp=4, gpus_per_node=2)
    df = _iteration_frame(topo, job="ok")
    df.loc[2, "job"] = "bad\njob"
    with pytest.raises(LineProtocolError, match="newline"):
        any_store.write_stage_latency(df)
    assert len(any_store.read_stage_latency("ok")) == 0


def test_invalid_values_named_and_valid_points_still_written(any_store):
    topo = Topology(tp=1, pp=1, dp=8, gpus_per_node=4)
    df = _iteration_frame(topo, job="v")
    df.loc[3, "mlp"] = np.inf
    df.loc[5, "dispatch"] = -2.0
    with pytest.raises(RejectedPointsError) as err:
        any_store.write_stage_latency(df)
    msg = str(err.value)
    assert "rank 3, mlp=inf" in msg and "rank 5, dispatch=-2.0" in msg
    assert err.value.report.written == 6
    back = any_store.read_stage_latency("v")
    assert sorted(back["rank"].tolist()) == [0, 1, 2, 4, 6, 7]


def test_rewrite_is_idempotent_and_last_iterations(any_store):
    topo = Topology(tp=1, pp=1, dp=4, gpus_per_node=2)
    for it in range(6):
        any_store.write_stage_latency(_iteration_frame(topo, job="w", iteration=it, time_ms=1000 * (it + 1)))
    any_store.write_stage_latency(_iteration_frame(topo, job="w", iteration=5, time_ms=6000, seed=9))
    df = any_store.read_stage_latency("w")
    assert len(df) == 24
    last = any_store.read_stage_latency("w", last_iterations=2)
    assert sorted(set(last["iteration"])) == [4, 5]
    rng = any_store.read_stage_latency("w", start_ms=2000, end_ms=3000)
    assert sorted(set(rng["iteration"])) == [1, 2]
    assert any_store.latest_times(schema.STAGE_LATENCY, "w", 2) == [6000, 5000]
    assert any_store.latest_times(schema.STAGE_LATENCY, "w", 2, before_ms=4000) == [4000, 3000]
    late = _iteration_frame(Topology(tp=1, pp=1, dp=6, gpus_per_node=2), job="w", iteration=6, time_ms=7000)
    any_store.write_stage_latency(late[late["rank"] == 4])          # a rank that joined later
    assert any_store.latest_times(schema.STAGE_LATENCY, "w", 2, before_ms=4000) == [4000, 3000]
    again = _iteration_frame(topo, job="w", iteration=5, time_ms=6000, seed=9)
    got = last[last.iteration == 5].sort_values("rank")["mlp"].to_numpy()
    assert np.array_equal(got, again["mlp"].to_numpy())


def test_embedded_store_is_the_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANKSCOPE_STORE", raising=False)
    store = open_store()
    assert "store.db" in repr(store) and (tmp_path / ".rankscope").is_dir()
    store.close()
    monkeypatch.setenv("RANKSCOPE_STORE", "http://127.0.0.1:1")
    monkeypatch.setenv("INFLUXDB_V2_TOKEN", "s3cret-token")
    s = open_store()
    assert isinstance(s, InfluxStore) and "s3cret" not in repr(s)


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Stands in for an InfluxDB 2.x server (none can run here): records requests."""

    requests: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(204)
        self.send_header("X-Influxdb-Version", "v2.9.1")
        self.end_headers()

    def do_HEAD(self):
        self.do_GET()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            import gzip
            body = gzip.decompress(body)
        type(self).requests.append((self.path, dict(self.headers), body.decode()))
        self.send_response(204)
        self.end_headers()


def test_v2_path_sends_token_org_bucket_to_api_v2_write(monkeypatch):
    _Recorder.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setenv("INFLUXDB_V2_TOKEN", "tok-123")
        monkeypatch.setenv("INFLUXDB_V2_ORG", "my org")
        store = open_store(url, "rankscope")
        assert store.api == "v2"
        topo = Topology(tp=1, pp=1, dp=4, gpus_per_node=2)
        store.write_stage_latency(_iteration_frame(topo, job="v2job", time_ms=1234))
        store.close()
    finally:
        server.shutdown()
    path, headers, body = _Recorder.requests[-1]
    assert path.startswith("/api/v2/write?")
    assert "bucket=rankscope" in path and "org=my+org" in path or "org=my%20org" in path
    assert "precision=ms" in path
    assert headers["Authorization"] == "Token tok-123"
    lines = body.strip().split("\n")
    assert len(lines) == 4
    assert lines[0].startswith("stage_latency,dp=0,ep_group=0,gpu=0,job=v2job,node=0,pp=0,rank=0,tp=0 ")
    assert lines[0].endswith(" 1234")


def test_v1_write_fails_cleanly_when_server_down():
    from rankscope.store import StoreError
    store = InfluxStore("http://127.0.0.1:9", "x", api="v1", retries=0, timeout_s=1)
    topo = Topology(tp=1, pp=1, dp=2, gpus_per_node=2)
    with pytest.raises(StoreError, match="unreachable"):
        store.write_stage_latency(_iteration_frame(topo))
    json.dumps({})  # keep json import used for future debugging helpers


def _writer_process(path, job, rank):
    import numpy as np

    from rankscope.frames import cube_to_frame
    from rankscope.store import EmbeddedStore
    from rankscope.topology import Topology

    topo = Topology(tp=1, pp=1, dp=4, gpus_per_node=2)
    store = EmbeddedStore(path)
    for it in range(20):
        v = np.full((1, len(STAGES)), float(rank + 1))
        store.write_stage_latency(cube_to_frame(job, topo, it, 1000 + it, v, STAGES, v.sum(1), ranks=[rank]))
    store.close()


def test_embedded_store_takes_writes_from_several_processes(tmp_path):
    """The ranks of one job may share an embedded store file: first opens and first writes race."""
    import multiprocessing as mp

    from rankscope.store import EmbeddedStore

    path = str(tmp_path / "shared.db")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer_process, args=(path, "mp", r)) for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    df = EmbeddedStore(path).read_stage_latency("mp")
    assert len(df) == 80
    assert sorted(df.groupby("rank")["mlp"].first().tolist()) == [1.0, 2.0, 3.0, 4.0]


# ------------------------------------------------------------------ retention
def _incident_frame(time_ms: int, job: str = "r") -> pd.DataFrame:
    return pd.DataFrame({"time": [time_ms], "job": job, "id": "cs-1-r0", "class": "compute_straggler",
                         "status": "open", "ratio": [4.0]})


def _count(store: InfluxStore, source: str) -> int:
    df = store.query_raw(f"SELECT * FROM {source}")
    return len(df)


def test_store_setup_creates_the_raw_and_long_policies_and_routes_each_measurement(influx_url):
    import time
    import uuid

    from rankscope.config import Retention

    now = int(time.time() * 1000)
    topo = Topology(tp=1, pp=1, dp=4, gpus_per_node=2)
    store = InfluxStore(influx_url, f"ret_{uuid.uuid4().hex[:8]}", api="v1", retention=Retention())
    try:
        store.write_stage_latency(_iteration_frame(topo, job="r", time_ms=now))
        store.write_measurement(schema.INCIDENT, _incident_frame(now))
        policies = store.query_raw(f'SHOW RETENTION POLICIES ON "{store.bucket}"').set_index("name")
        assert policies.loc["raw", "duration"] == "168h0m0s" and bool(policies.loc["raw", "default"])
        assert policies.loc["long", "duration"] == "9600h0m0s" and not bool(policies.loc["long", "default"])
        assert _count(store, '"raw"."stage_latency"') == 4 and _count(store, '"long"."stage_latency"') == 0
        assert _count(store, '"long"."incident"') == 1 and _count(store, '"raw"."incident"') == 0
        assert store.source(schema.INCIDENT) == '"long"."incident"' and store.source(schema.STAGE_LATENCY) == (
            '"stage_latency"')
        assert len(store.read(schema.INCIDENT, "r")) == 1 and len(store.read_stage_latency("r")) == 4
        # new durations in the configuration are applied to the existing policies
        shorter = InfluxStore(influx_url, store.bucket, api="v1", retention=Retention("2d", "30d"))
        shorter.write_measurement(schema.INCIDENT, _incident_frame(now))
        assert shorter.retention_policies() == {"raw": (2 * 86400, True), "long": (30 * 86400, False)}
        # a store without a retention of its own leaves them alone, and reads through them
        plain = InfluxStore(influx_url, store.bucket, api="v1")
        plain.write_measurement(schema.INCIDENT, _incident_frame(now + 1))
        assert plain.retention_policies() == {"raw": (2 * 86400, True), "long": (30 * 86400, False)}
        assert len(plain.read(schema.INCIDENT, "r")) == 2
    finally:
        store.drop_database()
        store.close()


def test_points_older_than_the_raw_policy_are_dropped_and_reported(influx_url):
    import time
    import uuid

    from rankscope.config import Retention
    from rankscope.store import StoreError

    now = int(time.time() * 1000)
    topo = Topology(tp=1, pp=1, dp=2, gpus_per_node=2)
    store = InfluxStore(influx_url, f"ret_{uuid.uuid4().hex[:8]}", api="v1", retention=Retention())
    try:
        old = _iteration_frame(topo, job="old", time_ms=now - 8 * 86_400_000)
        new = _iteration_frame(topo, job="old", iteration=6, time_ms=now)
        with pytest.raises(StoreError, match=r"dropped 2 point\(s\) older than the retention of the default policy"):
            store.write_stage_latency(pd.concat([old, new], ignore_index=True))
        assert store.read_stage_latency("old")["time"].tolist() == [now, now]   # the rest was written
        store.write_measurement(schema.INCIDENT, _incident_frame(now - 8 * 86_400_000, job="old"))   # 400d: kept
        assert len(store.read(schema.INCIDENT, "old")) == 1
    finally:
        store.drop_database()
        store.close()


def test_without_a_retention_the_policies_exist_and_nothing_expires(influx_store):
    influx_store.write_measurement(schema.INCIDENT, _incident_frame(1000))   # 1970: kept
    influx_store.write_stage_latency(_iteration_frame(Topology(tp=1, pp=1, dp=2, gpus_per_node=2), time_ms=2000))
    assert influx_store.retention_policies() == {"raw": (0, True), "long": (0, False)}
    assert _count(influx_store, '"long"."incident"') == 1
    # the FROM the dashboards read too (rankscope.store.influxql)
    assert all(influx_store.source(m) == influxql.source(m) for m in schema.MEASUREMENTS)
    assert influx_store.read(schema.INCIDENT, "r")["time"].tolist() == [1000]
    assert len(influx_store.read_stage_latency("il-0477")) == 2


def test_a_database_made_before_the_policies_keeps_its_history(influx_url):
    """Without retention settings an old database is read and written as before (no ``long``);
    turning retention on adds ``long`` and copies the history there, where reads look."""
    import time
    import uuid

    from rankscope.config import Retention
    db = f"old_{uuid.uuid4().hex[:8]}"
    old = InfluxStore(influx_url, db, api="v1", retention_policy="autogen")   # as rankscope wrote before
    old.execute(f'CREATE DATABASE "{db}"')
    old.write_stage_latency(_iteration_frame(Topology(tp=1, pp=1, dp=2, gpus_per_node=2), job="j", time_ms=5000))
    try:
        store = InfluxStore(influx_url, db, api="v1")
        day_ago = int(time.time() * 1000) - 86_400_000
        store.write_measurement(schema.INCIDENT, _incident_frame(day_ago, job="j"))
        assert store.retention_policies() == {"autogen": (0, True)}      # untouched
        assert old.source(schema.INCIDENT) == influxql.source(schema.INCIDENT, "autogen") == '"autogen"."incident"'
        assert len(store.read_stage_latency("j")) == 2 and len(store.read(schema.INCIDENT, "j")) == 1
        # turning retention on makes raw the default policy and moves the history into long
        managed = InfluxStore(influx_url, db, api="v1", retention=Retention())
        managed.write_measurement(schema.INCIDENT, _incident_frame(int(time.time() * 1000), job="j"))
        assert managed.retention_policies() == {"autogen": (0, False), "long": (400 * 86400, False),
                                                "raw": (7 * 86400, True)}
        assert _count(managed, '"long"."incident"') == 2
        assert sorted(managed.read(schema.INCIDENT, "j")["time"])[0] == day_ago   # the old one is still seen
    finally:
        old.drop_database()
        old.close()


def test_retention_from_the_environment(monkeypatch):
    from rankscope.config import Retention

    for key in ("RANKSCOPE_RETENTION", "RANKSCOPE_RAW_RETENTION", "RANKSCOPE_LONG_RETENTION"):
        monkeypatch.delenv(key, raising=False)
    assert open_store("http://127.0.0.1:1", "x").retention is None
    monkeypatch.setenv("RANKSCOPE_RETENTION", "on")
    assert open_store("http://127.0.0.1:1", "x").retention == Retention("7d", "400d")
    monkeypatch.setenv("RANKSCOPE_RAW_RETENTION", "3d")
    assert open_store("http://127.0.0.1:1", "x").retention == Retention("3d", "400d")
    monkeypatch.setenv("RANKSCOPE_RETENTION", "off")
    assert open_store("http://127.0.0.1:1", "x").retention is None
    monkeypatch.delenv("RANKSCOPE_RETENTION")
    assert open_store("http://127.0.0.1:1", "x").retention == Retention("3d", "400d")   # a duration turns it on
    monkeypatch.setenv("RANKSCOPE_LONG_RETENTION", "1d")
    with pytest.raises(ValueError, match="shorter than the raw one"):
        open_store("http://127.0.0.1:1", "x")
    monkeypatch.setenv("RANKSCOPE_LONG_RETENTION", "400 days")
    with pytest.raises(ValueError, match="expected a duration"):
        open_store("http://127.0.0.1:1", "x")


def test_embedded_store_keeps_every_point(embedded_store):
    embedded_store.write_stage_latency(_iteration_frame(Topology(tp=1, pp=1, dp=2, gpus_per_node=2), time_ms=1))
    embedded_store.write_measurement(schema.INCIDENT, _incident_frame(2))
    assert len(embedded_store.read_stage_latency("il-0477")) == 2 and len(embedded_store.read(schema.INCIDENT)) == 1


@pytest.mark.parametrize("retention,bucket", [("on", "rankscope%2Flong"), ("off", "rankscope&")])
def test_v2_writes_what_is_kept_long_to_the_long_bucket(monkeypatch, retention, bucket):
    _Recorder.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("INFLUXDB_V2_TOKEN", "tok-123")
        monkeypatch.setenv("RANKSCOPE_RETENTION", retention)
        store = open_store(f"http://127.0.0.1:{server.server_address[1]}", "rankscope")
        store.write_measurement(schema.INCIDENT, _incident_frame(1234))
        store.write_stage_latency(_iteration_frame(Topology(tp=1, pp=1, dp=2, gpus_per_node=2), time_ms=1234))
        store.close()
    finally:
        server.shutdown()
    writes = [(path, body) for path, _, body in _Recorder.requests if path.startswith("/api/v2/write")]
    (incident_path, incident_body), (raw_path, _) = writes
    assert incident_body.startswith("incident,") and f"bucket={bucket}" in incident_path + "&"
    assert "bucket=rankscope&" in raw_path + "&"   # raw points: the bucket itself


def test_next_times_reuses_its_probe_over_a_backlog_and_finds_another_when_its_rank_stops(influx_store,
                                                                                          monkeypatch):
    sch = schema

    def points(ranks, times, first=0):
        return pd.DataFrame([{"time": t + r, "job": "p", "rank": r, sch.ITERATION_FIELD: first + i,
                              "attention": 1.0} for i, t in enumerate(times) for r in ranks])

    t0 = 1_770_000_000_000
    influx_store.write_stage_latency(points([0, 1, 2, 3], [t0 + 1000 * i for i in range(10)]))
    probes = []
    find = influx_store._probe
    monkeypatch.setattr(influx_store, "_probe", lambda m, j: probes.append(j) or find(m, j))
    first = influx_store.next_times(sch.STAGE_LATENCY, "p", None, 3)
    second = influx_store.next_times(sch.STAGE_LATENCY, "p", first[-1], 3)
    assert first == [t0 + 3, t0 + 1003, t0 + 2003] and second == [t0 + 3003, t0 + 4003, t0 + 5003]
    assert len(probes) == 1                        # the backlog's second chunk reused it
    # rank 3 stops; ranks 0-2 go on: the probe is looked for again, and the times go on
    later = [t0 + 1000 * i for i in range(10, 14)]
    influx_store.write_stage_latency(points([0, 1, 2], later, first=10))
    nxt = influx_store.next_times(sch.STAGE_LATENCY, "p", t0 + 9003, 3)
    assert nxt == [t0 + 10_002, t0 + 11_002, t0 + 12_002] and len(probes) == 2
