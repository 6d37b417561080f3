"""The events receiver over HTTP against a real InfluxDB, ``rankscope event add``, and the
IL-0477 lesson end to end: a network alert on a compute straggler's host is contradicted."""

from __future__ import annotations

import http.client
import json
import logging
import time
import uuid

import pytest

from analyzer.service.run_once import run_once
from events.receiver import EventReceiver, ReceiverConfig
from rankscope import schema
from rankscope.cli import main
from rankscope.store import InfluxStore
from rankscope.times import format_time
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.test_event_payloads import (
    GRAFANA_DOCUMENTED,
    am_alert,
    am_payload,
    grafana_with_hosts,
    utc_ms,
)

TOKEN = "s3cret-events-token-for-tests"
STARTS = "2026-07-08T09:30:00.123456789Z"
STARTS_MS = utc_ms(2026, 7, 8, 9, 30, 0, 123)


@pytest.fixture
def start_receiver(influx_store):
    """Start receivers on 127.0.0.1:0 over the test's InfluxDB; all stopped afterwards."""
    started: list[EventReceiver] = []

    def start(**config) -> EventReceiver:
        receiver = EventReceiver(influx_store, ("127.0.0.1", 0), ReceiverConfig(**config)).start()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.shutdown()


def call(receiver: EventReceiver, method: str, path: str, body: object = None,
         headers: dict[str, str] | None = None) -> tuple[int, object, dict[str, str]]:
    """One HTTP request (no proxy in the way); status, JSON body, headers."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn = http.client.HTTPConnection(*receiver.address, timeout=30)
    try:
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null"), dict(resp.getheaders())
    finally:
        conn.close()


def post(receiver: EventReceiver, path: str, body: object, token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, answer, _ = call(receiver, "POST", path, body, headers)
    return status, answer


def network_down(instance: str, status: str = "firing", ends: str = "0001-01-01T00:00:00Z",
                 starts: str = STARTS) -> dict:
    labels = {"instance": instance, "job": "node", "severity": "critical"}
    return am_alert("NodeNetworkDown", labels, starts, status=status, ends=ends,
                    summary="server port down")


def test_firing_alerts_written_then_a_resolved_notice_rewrites_its_point(
        influx_store, start_receiver, caplog):
    receiver = start_receiver()
    caplog.set_level(logging.INFO, logger="events")
    status, answer = post(receiver, "/alertmanager", am_payload(
        [network_down("gpu-node-01294:9100"), network_down("gpu-node-00007:9100")],
        receiver="noc"))
    assert (status, answer) == (200, {"received": 2, "written": 2, "refused": []})
    back = influx_store.read_events()
    assert len(back) == 2 and "job" not in back.columns  # cluster events: no job tag
    assert back["time"].tolist() == [STARTS_MS, STARTS_MS]
    assert sorted(back["host"]) == ["gpu-node-00007", "gpu-node-01294"]
    assert set(back["name"]) == {"NodeNetworkDown"} and set(back["severity"]) == {"critical"}
    assert set(back["source"]) == {"alertmanager/noc"} and set(back["status"]) == {"firing"}
    assert set(back["ends_ms"]) == {-1} and set(back["text"]) == {"server port down"}
    assert any("alertmanager from 127.0.0.1 (anonymous): 2 alert(s), 2 written (cluster events)"
               in r.message for r in caplog.records)

    status, answer = post(receiver, "/alertmanager", am_payload(
        [network_down("gpu-node-01294:9100", status="resolved", ends="2026-07-08T09:41:00Z")],
        receiver="noc"))
    assert status == 200 and answer["written"] == 1
    back = influx_store.read_events().set_index("host")
    assert len(back) == 2                         # rewritten in place, not added
    assert back.loc["gpu-node-01294", "status"] == "resolved"
    assert back.loc["gpu-node-01294", "ends_ms"] == utc_ms(2026, 7, 8, 9, 41, 0)
    assert back.loc["gpu-node-01294", "time"] == STARTS_MS
    assert back.loc["gpu-node-00007", "status"] == "firing"


def test_partly_bad_payload_writes_the_valid_alerts_and_answers_400(influx_store, start_receiver):
    receiver = start_receiver()
    payload = am_payload([
        network_down("gpu-node-01294:9100"),
        am_alert("NodeNetworkDown", {"job": "node", "zone": "eu-1"}, STARTS),
        am_alert("", {"instance": "gpu-node-00001:9100"}, STARTS),
        network_down("gpu-node-00002:9100", starts="2026-13-45T99:00:00Z"),
        network_down("gpu-node-00003:9100"),
    ])
    status, answer = post(receiver, "/alertmanager", payload)
    assert status == 400
    assert answer["received"] == 5 and answer["written"] == 2
    assert [r["index"] for r in answer["refused"]] == [1, 2, 3]
    assert "names no host" in answer["refused"][0]["error"]
    assert "no alert name" in answer["refused"][1]["error"]
    assert "startsAt '2026-13-45T99:00:00Z'" in answer["refused"][2]["error"]
    assert answer["error"] == "3 of 5 alert(s) refused; the other 2 written"
    assert sorted(influx_store.read_events()["host"]) == ["gpu-node-00003", "gpu-node-01294"]


@pytest.mark.parametrize("body,needle", [
    (b'{"version": "4", "alerts": [', "body is not JSON"),
    (b"\xff\xfe not utf-8", "body is not JSON"),
    ([{"labels": {}}], "expected a JSON object"),
    ({"version": "4", "status": "firing"}, "'alerts' must be a list"),
])
def test_unusable_payloads_answer_400_and_write_nothing(influx_store, start_receiver, body, needle):
    receiver = start_receiver()
    status, answer = post(receiver, "/alertmanager", body)
    assert status == 400 and needle in answer["error"]
    assert answer["written"] == 0 and answer["refused"][0]["index"] is None
    assert len(influx_store.read_events()) == 0


def test_bearer_token_required_when_configured(influx_store, start_receiver, caplog):
    receiver = start_receiver(token=TOKEN)
    caplog.set_level(logging.DEBUG, logger="events")
    payload = am_payload([network_down("gpu-node-01294:9100")])
    status, answer, headers = call(receiver, "POST", "/alertmanager", payload)
    assert status == 401 and answer == {"error": "missing or wrong credentials: send "
                                                 "Authorization: Bearer"}
    assert headers["WWW-Authenticate"] == 'Bearer realm="rankscope-events"'
    assert post(receiver, "/alertmanager", payload, token=TOKEN + "x")[0] == 401
    status, _, _ = call(receiver, "POST", "/alertmanager", payload, {"Authorization": TOKEN})
    assert status == 401                          # the scheme is part of it
    assert len(influx_store.read_events()) == 0   # nothing got in without the token
    assert post(receiver, "/alertmanager", payload, token=TOKEN) == (
        200, {"received": 1, "written": 1, "refused": []})
    assert len(influx_store.read_events()) == 1
    assert call(receiver, "GET", "/healthz")[:2] == (200, {"status": "ok"})  # probes need none
    assert TOKEN not in repr(receiver) and TOKEN not in repr(receiver.config)
    assert caplog.records and all(TOKEN not in r.getMessage() for r in caplog.records)


def test_body_limit_methods_and_paths(influx_store, start_receiver):
    receiver = start_receiver(max_body_bytes=1024)
    big = am_payload([network_down(f"gpu-node-{i:05d}:9100") for i in range(20)])
    status, answer = post(receiver, "/alertmanager", big)
    assert status == 413 and "over the limit of 1024 bytes" in answer["error"]
    assert len(influx_store.read_events()) == 0
    status, answer, headers = call(receiver, "GET", "/alertmanager")
    assert status == 405 and headers["Allow"] == "POST"
    assert call(receiver, "POST", "/nowhere", {})[0] == 404
    assert call(receiver, "GET", "/healthz")[:2] == (200, {"status": "ok"})


def test_store_outage_answers_503_and_the_retry_writes_the_alert_once(influx_server):
    """Alertmanager retries a 5xx: nothing is half-written, and the retry is idempotent."""
    store = InfluxStore(influx_server.url, f"events_{uuid.uuid4().hex[:8]}", api="v1",
                        retries=0, timeout_s=2.0)
    receiver = EventReceiver(store, ("127.0.0.1", 0)).start()
    payload = am_payload([network_down("gpu-node-01294:9100")])
    try:
        influx_server.stop()
        try:
            status, answer = post(receiver, "/alertmanager", payload)
        finally:
            influx_server.start()
        assert status == 503 and answer["written"] == 0
        assert answer["error"].startswith("the store refused the write")
        assert post(receiver, "/alertmanager", payload)[0] == 200
        assert post(receiver, "/alertmanager", payload)[0] == 200   # a re-sent notification
        back = store.read_events()
        assert back[["time", "host"]].values.tolist() == [[STARTS_MS, "gpu-node-01294"]]
    finally:
        receiver.shutdown()
        store.drop_database()
        store.close()


def test_grafana_payloads_and_the_job_tag(influx_store, start_receiver):
    receiver = start_receiver(job="train-a")
    status, answer = post(receiver, "/grafana", GRAFANA_DOCUMENTED)
    assert status == 400 and answer["written"] == 0
    assert [r["index"] for r in answer["refused"]] == [0, 1]
    assert all("names no host" in r["error"] for r in answer["refused"])

    status, answer = post(receiver, "/grafana",
                          grafana_with_hosts("gpu-node-01294", "gpu-node-00007"))
    assert (status, answer["written"]) == (200, 2)
    back = influx_store.read_events("train-a", cluster=False)
    assert set(back["job"]) == {"train-a"} and set(back["source"]) == {"grafana/My Super Webhook"}
    assert sorted(back["name"]) == ["High CPU usage", "High memory usage"]
    assert len(influx_store.read_events("other-job")) == 0   # a job's events stay its own


def test_own_json_endpoint(influx_store, start_receiver):
    receiver = start_receiver()
    status, answer = post(receiver, "/events", [
        {"name": "server port down", "host": "gpu-node-01294", "time": "2026-07-08T09:30:00Z",
         "severity": "critical", "source": "noc", "text": "eth2 down"},
        {"name": "server port down", "hots": "gpu-node-01294"},
    ])
    assert status == 400 and answer["written"] == 1
    assert answer["error"] == "1 of 2 event(s) refused; the other 1 written"
    assert answer["refused"] == [{"index": 1, "error": answer["refused"][0]["error"]}]
    assert "unknown key(s) 'hots'" in answer["refused"][0]["error"]
    row = influx_store.read_events().iloc[0]
    assert (row["time"], row["host"], row["source"], row["text"]) == (
        utc_ms(2026, 7, 8, 9, 30, 0), "gpu-node-01294", "events/noc", "eth2 down")


def test_event_add_command_writes_and_resolves(influx_url, influx_store, monkeypatch, capsys):
    monkeypatch.setenv("RANKSCOPE_INFLUX_API", "v1")
    common = ["--store", influx_url, "--bucket", influx_store.bucket, "--name", "server port down",
              "--host", "gpu-node-01294", "--time", "2026-07-08T09:30:00Z", "--source", "runbook"]
    assert main(["event", "add", *common, "--text", "eth2 down", "--job", "il-0477"]) == 0
    assert "written for job il-0477" in capsys.readouterr().out
    assert main(["event", "add", *common, "--job", "il-0477", "--resolved"]) == 0
    back = influx_store.read_events("il-0477")
    assert len(back) == 1                          # the resolved notice rewrote the point
    assert back.iloc[0]["status"] == "resolved"
    assert back.iloc[0]["ends_ms"] > utc_ms(2026, 7, 8, 9, 30, 0)   # ended now
    assert back.iloc[0]["time"] == utc_ms(2026, 7, 8, 9, 30, 0)
    assert back.iloc[0]["source"] == "cli/runbook"     # the command first: traceable
    assert main(["event", "add", *common[:-4], "--time", "1783503000"]) == 1   # seconds, not ms
    assert "looks like epoch seconds" in capsys.readouterr().err


def test_event_add_resolves_the_firing_event_without_its_time(influx_url, influx_store, monkeypatch, capsys):
    """An operator resolves what they added without retyping its start; a person's times work."""
    monkeypatch.setenv("RANKSCOPE_INFLUX_API", "v1")
    where = ["--store", influx_url, "--bucket", influx_store.bucket]
    port = [*where, "--name", "server port down", "--host", "gpu-node-01294"]
    assert main(["event", "add", *port, "--time", "2026-07-08T09:30:00"]) == 0      # no zone: UTC
    assert main(["event", "add", *port, "--name", "xid 79", "--time", "30m"]) == 0
    capsys.readouterr()
    assert main(["event", "add", *port, "--resolved"]) == 0
    back = influx_store.read_events().set_index("name")
    assert len(back) == 2                                  # rewritten in place, not a second event
    assert back.loc["server port down", "status"] == "resolved"
    assert back.loc["server port down", "time"] == utc_ms(2026, 7, 8, 9, 30, 0)
    assert back.loc["xid 79", "status"] == "firing"
    assert abs(back.loc["xid 79", "time"] - (time.time() * 1000 - 1_800_000)) < 60_000
    # nothing firing left to resolve (or another source's event): refused, nothing written
    assert main(["event", "add", *port, "--resolved"]) == 1
    assert "no firing event 'server port down' on gpu-node-01294" in capsys.readouterr().err
    assert main(["event", "add", *port, "--name", "xid 79", "--source", "dcgm", "--resolved"]) == 1
    assert len(influx_store.read_events()) == 2


def test_network_alert_on_the_straggler_is_contradicted_and_one_elsewhere_is_not_attached(
        influx_store, start_receiver):
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=35)
    simulate(scenario, influx_store, start_ms=utc_ms(2026, 7, 8, 8, 0, 0), progress=False)
    topo = scenario.topology
    culprit = scenario.faults[0]
    [culprit_host] = topo.hosts_of(culprit.ranks)
    other_host = topo.host_names([0])[0]
    assert culprit_host == "gpu-node-00172" and other_host != culprit_host
    times = sorted(influx_store.latest_times(schema.STAGE_LATENCY, scenario.job, 100))
    starts = format_time(times[25])                 # after the onset (iteration 20), inside the run

    # node_exporter's instance often holds the FQDN, in any case: it is the same machine
    fqdn = f"{culprit_host.upper()}.dc1.example.com"
    receiver = start_receiver()
    status, answer = post(receiver, "/alertmanager", am_payload([
        network_down(f"{culprit_host}:9100", starts=starts),
        network_down(f"{other_host}:9100", starts=starts),
        network_down(f"{fqdn}:9100", starts=starts),
    ]))
    assert (status, answer["written"]) == (200, 3)

    incidents = run_once(influx_store, job=scenario.job)
    [incident] = [i for i in incidents if culprit_host in i["hosts"]]
    assert incident["class"] == "compute_straggler"
    assert sorted((e["name"], e["host"], e["verdict"]) for e in incident["events"]) == sorted([
        ("NodeNetworkDown", culprit_host, "contradicted"), ("NodeNetworkDown", fqdn, "contradicted")])
    assert all(other_host not in [e["host"] for e in i["events"]] for i in incidents)


def test_a_deeply_nested_body_gets_a_400_not_a_dropped_connection(embedded_store):
    receiver = EventReceiver(embedded_store, ("127.0.0.1", 0))
    try:
        reply = receiver.handle("/events", b"[" * 100_000 + b"]" * 100_000)
    finally:
        receiver.server.server_close()
    assert reply.status == 400 and "nested too deeply" in json.dumps(reply.body)
