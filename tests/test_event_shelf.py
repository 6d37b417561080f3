"""Out-of-band events kept per host by relevance and time, not as the newest N: a flood of
events on machines outside the job never pushes out the one on its own host, memory stays
bounded, and a verdict names who reported each event."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.detect.window import Window
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.event_shelf import EVENTS_PER_HOST, OTHER_EVENTS, EventShelf
from analyzer.diagnosis.event_verdicts import OutOfBandEvent
from rankscope.incident import Incident, IncidentClass

JOB_HOSTS = [f"gpu-node-{n:05d}" for n in range(168, 176)]
CULPRIT = "gpu-node-00172"
T0 = 1_783_500_000_000
PORT_DOWN = OutOfBandEvent(T0, "server port down", host=CULPRIT, source="alertmanager/noc")


def junk(n: int, hosts: int | None = None, t0: int = T0 + 60_000) -> list[OutOfBandEvent]:
    """``n`` events, newer than the real one, on ``hosts`` machines outside the job (each
    on its own machine when None)."""
    return [OutOfBandEvent(t0 + i, "NodeExporterScrapeSlow",
                           host=f"junk-{(i if hosts is None else i % hosts):05d}.example.org",
                           source="events/flood") for i in range(n)]


def test_12000_junk_events_on_other_hosts_keep_the_port_down_line():
    """The issue's flood: each junk alert on its own machine, all newer than the real one."""
    shelf = EventShelf(JOB_HOSTS)
    shelf.add([PORT_DOWN])
    shelf.add(junk(12_000))
    assert PORT_DOWN in shelf.events()
    assert shelf.counts() == (1, OTHER_EVENTS)        # the others share their bound
    shelf.add(junk(12_000, t0=T0 + 10**7))             # the next cycle's read, still more
    assert PORT_DOWN in shelf.events() and len(shelf) == 1 + OTHER_EVENTS


def test_a_noisy_machine_gets_a_fair_share_and_the_job_hosts_unknown_still_hold():
    """Without the job's hosts every event shares the bound per host: 12 noisy machines
    (1,000 junk events each) lose their oldest, not the one event of another host."""
    shelf = EventShelf()
    shelf.add([PORT_DOWN, *junk(12_000, hosts=12)])
    assert PORT_DOWN in shelf.events() and len(shelf) == OTHER_EVENTS
    per_host = {}
    for e in shelf.events():
        per_host[e.host] = per_host.get(e.host, 0) + 1
    assert per_host[CULPRIT] == 1
    assert max(v for h, v in per_host.items() if h != CULPRIT) - min(
        v for h, v in per_host.items() if h != CULPRIT) <= 1     # fair shares
    kept = [e for e in shelf.events() if e.host == "junk-00000.example.org"]
    assert min(e.time_ms for e in kept) > T0 + 60_000 + 12 * 100   # each host kept its newest


def test_a_job_host_keeps_its_newest_events_and_memory_is_bounded():
    shelf = EventShelf(JOB_HOSTS)
    own = [OutOfBandEvent(T0 + i, "GPU Xid 79", host=JOB_HOSTS[i % 8]) for i in range(8 * 1000)]
    shelf.add([*own, *junk(30_000, hosts=3000)])
    assert shelf.counts() == (8 * EVENTS_PER_HOST, OTHER_EVENTS)
    on_culprit = sorted(e.time_ms for e in shelf.events() if e.host == CULPRIT)
    assert on_culprit == sorted(e.time_ms for e in own if e.host == CULPRIT)[-EVENTS_PER_HOST:]


def test_host_names_match_as_dns_does_and_a_new_read_replaces_the_old():
    shelf = EventShelf(JOB_HOSTS, per_host=2, others=5)
    fqdn = OutOfBandEvent(T0, "server port down", host="GPU-NODE-00172.dc1.example.com.")
    shelf.add([fqdn, *junk(100)])
    assert fqdn in shelf.events() and shelf.counts() == (1, 5)
    resolved = OutOfBandEvent(T0, "server port down", host=fqdn.host, status="resolved")
    shelf.add([resolved])
    assert resolved in shelf.events() and fqdn not in shelf.events()
    shelf.forget_before(T0 + 1)
    assert shelf.counts() == (0, 5)
    shelf.set_hosts([])                                  # the job's hosts unknown: one pool
    assert len(shelf) == 5
    with pytest.raises(ValueError, match="positive"):
        EventShelf(per_host=0)


def test_the_book_keeps_the_port_down_line_and_its_verdict_names_the_source():
    book = IncidentBook(event_lookback=5, keep_resolved=10, hosts=JOB_HOSTS)
    book.add_events([PORT_DOWN, *junk(12_000)])
    win = Window(10)
    for i in range(10):
        win.push(i, T0 - 5 * 30_000 + i * 30_000, np.zeros((8, 2)))
    inc = Incident(id="cs-5-r1379", job="il-0477", cls=IncidentClass.COMPUTE_STRAGGLER,
                   ranks=[1379], nodes=[172], stage="attention", ratio=3.0, group_type="tp",
                   group_ranks=[1376, 1379], onset_iteration=5, onset_ms=T0, hosts=[CULPRIT],
                   evidence={"stage": "attention", "stage_kind": "compute", "arrived_last": True})
    book.register(inc)
    book.judge_events(inc, win)
    [v] = inc.events
    assert (v.name, v.host, v.verdict, v.source) == (
        "server port down", CULPRIT, "contradicted", "alertmanager/noc")
    assert v.to_json()["source"] == "alertmanager/noc"
    assert v.sentence.startswith("Event 'server port down' on gpu-node-00172: CONTRADICTED - ")
    assert v.sentence.endswith(" Reported by alertmanager/noc.")


@pytest.mark.parametrize("spread", ["12 machines", "a machine each"])
def test_12000_junk_posts_on_other_hosts_leave_the_real_verdict_end_to_end(influx_store, spread):
    """The issue's attack over HTTP on the real InfluxDB: the real port-down alert on the
    straggler's host, then 12,000 junk events on 12 machines outside the job (each noisier than
    the real host), or each on a machine of its own (more machines than the shared pool
    holds); the analyzer still judges the real one, and names who reported it."""
    from analyzer.service.run_once import run_once
    from events.receiver import EventReceiver, ReceiverConfig
    from rankscope import schema
    from rankscope.times import format_time
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate
    from tests.test_event_payloads import am_alert, am_payload, utc_ms
    from tests.test_events_receiver import post

    scenario = load_scenario("compute-slowdown").with_overrides(iterations=35)
    simulate(scenario, influx_store, start_ms=utc_ms(2026, 7, 8, 8, 0, 0), progress=False)
    [culprit] = scenario.topology.hosts_of(scenario.faults[0].ranks)
    times = sorted(influx_store.latest_times(schema.STAGE_LATENCY, scenario.job, 100))
    receiver = EventReceiver(influx_store, ("127.0.0.1", 0), ReceiverConfig(token="t")).start()
    try:
        real = am_payload([am_alert("NodeNetworkDown", {"instance": f"{culprit}:9100", "severity":
                                                        "critical"}, format_time(times[25]),
                                    summary="server port down")], receiver="noc")
        assert post(receiver, "/alertmanager", real, token="t")[0] == 200
        for k in range(12):   # 12 posts of 1,000, newer than the real one
            flood = [{"name": "server port down", "host": f"junk-{k:02d}.example.org"
                      if spread == "12 machines" else f"junk-{k * 1000 + i:05d}.example.org",
                      "time": times[26] + k * 1000 + i} for i in range(1000)]
            assert post(receiver, "/events", flood, token="t")[1]["written"] == 1000
    finally:
        receiver.shutdown()
    assert len(influx_store.read_events()) == 12_001

    [incident] = [i for i in run_once(influx_store, job=scenario.job) if culprit in i["hosts"]]
    assert [(e["name"], e["host"], e["verdict"], e["source"]) for e in incident["events"]] == [
        ("NodeNetworkDown", culprit, "contradicted", "alertmanager/noc")]
