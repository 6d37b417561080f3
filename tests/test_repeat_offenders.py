"""Repeat offenders across jobs, against the real InfluxDB: a culprit host's record read back from
the ``incident_host`` points (count, jobs, days), the verdict's sentence, the judged incident left
out, a host without history, the record attached to new incidents once (one query) and stored with
them, and the NOC wall's table of the hosts with the most incidents over 30 days."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import pytest

from analyzer.read.host_history import annotate_repeat_offenders, read_host_history
from analyzer.read.host_record import HostRecord, culprit_records, record_sentence
from analyzer.write.rollups import incident_host_frame
from dashboards import provisioning
from rankscope import schema
from rankscope.incident import Incident, IncidentClass, incidents_frame, load_incidents
from tests.grafana_macros import TimeRange, influx_query, interpolate

DAY = 86_400_000
NOON = (int(datetime.now(UTC).timestamp() * 1000) - DAY) // DAY * DAY + DAY // 2   # yesterday, 12:00 UTC
HOST = "gpu-node-00017"


def _date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).date().isoformat()


def _incident(job: str, iid: str, onset_ms: int, hosts: list[str], cls=IncidentClass.COMPUTE_STRAGGLER,
              nodes=(17,), **kw) -> Incident:
    return Incident(id=iid, job=job, cls=cls, ranks=[136, 137], nodes=list(nodes), stage="mlp", ratio=4.0,
                    group_type="ep", group_ranks=list(range(128, 160)), onset_iteration=30, onset_ms=onset_ms,
                    hosts=hosts, **kw)


#: The history: HOST culprit in job-a 10 days ago (with gpu-node-00018), in job-b 7 and 4 days ago
#: (job-b's cs-9 left two points: it was rewritten with another class), and 40 days ago (too old).
HISTORY = [
    _incident("job-a", "cs-30-r136", NOON - 10 * DAY, [HOST, "gpu-node-00018"]),
    _incident("job-b", "cs-12-r8", NOON - 7 * DAY, [HOST]),
    _incident("job-b", "cs-90-r8", NOON - 4 * DAY, [HOST]),
    _incident("job-b", "cs-90-r8", NOON - 4 * DAY + 60_000, [HOST], cls=IncidentClass.HOST_STALL),
    _incident("job-z", "cs-5-r0", NOON - 40 * DAY, [HOST]),
    _incident("job-c", "cs-3-r0", NOON - 2 * DAY, ["gpu-node-00018"]),
    _incident("job-c", "pi-3-r0", NOON - 2 * DAY, [], cls=IncidentClass.PIPELINE_IMBALANCE),
]
DAYS = tuple(_date(NOON - d * DAY) for d in (10, 7, 4))


@pytest.fixture
def store(influx_store):
    """A fresh database holding the history's ``incident_host`` points, as the analyzer writes them."""
    influx_store.write_measurement(schema.INCIDENT_HOST, incident_host_frame(HISTORY))
    return influx_store


def test_a_hosts_record_counts_each_incident_once_with_its_jobs_and_days(store):
    records = read_host_history(store, [HOST, "gpu-node-00099"], before_ms=NOON)
    assert list(records) == [HOST]   # no history, no record
    rec = records[HOST]
    assert rec == HostRecord(HOST, incidents=3, jobs=2, days=DAYS, last_ms=NOON - 4 * DAY)
    # the same machine under its FQDN, in another case; a shorter lookback sees the last two only
    fqdn = read_host_history(store, ["GPU-NODE-00017.dc1.example.com"], before_ms=NOON)
    assert fqdn["GPU-NODE-00017.dc1.example.com"].incidents == 3
    assert read_host_history(store, [HOST], before_ms=NOON, lookback_ms=8 * DAY)[HOST].jobs == 1
    # only what came before: from 5 days back, the incident 4 days ago is after
    assert read_host_history(store, [HOST], before_ms=NOON - 5 * DAY)[HOST].incidents == 2
    assert read_host_history(store, [HOST])[HOST].incidents == 3   # before now


def test_the_verdict_says_how_often_in_how_many_jobs_and_on_which_days(store):
    rec = read_host_history(store, [HOST], before_ms=NOON)[HOST]
    assert rec.sentence == (f"{HOST} was the culprit 3 times before, in 2 jobs, on {DAYS[0]}, {DAYS[1]} and "
                            f"{DAYS[2]}: drain it first.")
    both = read_host_history(store, [HOST, "gpu-node-00018"], before_ms=NOON)
    assert record_sentence(both.values()) == (
        f"{HOST} was the culprit 3 times before, in 2 jobs, on {DAYS[0]}, {DAYS[1]} and {DAYS[2]}; "
        f"gpu-node-00018 was the culprit twice before, in 2 jobs, on {DAYS[0]} and {_date(NOON - 2 * DAY)}: "
        f"drain them first.")
    assert record_sentence([]) == ""
    many = HostRecord("h", incidents=6, jobs=1, days=tuple(f"2026-12-0{d}" for d in range(1, 7)), last_ms=0)
    assert many.sentence == "h was the culprit 6 times before, in 1 job, on 6 days from 2026-12-01 to 2026-12-06: " \
                            "drain it first."


def test_the_incident_being_judged_is_left_out(store):
    judged = read_host_history(store, [HOST], before_ms=NOON, exclude={("job-b", "cs-90-r8")})[HOST]
    assert (judged.incidents, judged.jobs, judged.days) == (2, 2, DAYS[:2])
    # an id is a job's own: the same id in another job is another incident
    assert read_host_history(store, [HOST], before_ms=NOON, exclude={("job-a", "cs-90-r8")})[HOST].incidents == 3
    # its only incident left out, a host has no record
    assert read_host_history(store, ["gpu-node-00018"], before_ms=NOON - 3 * DAY,
                             exclude={("job-a", "cs-30-r136")}) == {}


def test_new_incidents_get_their_record_in_one_read_and_keep_it(store, monkeypatch):
    reads = []
    read = store.read
    monkeypatch.setattr(store, "read", lambda *a, **kw: reads.append(a[0]) or read(*a, **kw))
    new = _incident("job-d", "cs-40-r136", NOON, [HOST])
    fresh = _incident("job-d", "cs-41-r200", NOON + 60_000, ["gpu-node-00099"])
    unnamed = _incident("job-d", "cs-42-r300", NOON, [])          # node numbers only: no machine
    later = _incident("job-e", "cs-7-r0", NOON + 3_600_000, [HOST])   # opened in the same cycle, after `new`
    known = _incident("job-d", "cs-1-r0", NOON + 7_200_000, [HOST], host_record="kept")   # looked up before
    out = annotate_repeat_offenders(store, [new, fresh, unnamed, later, known])
    assert out == [new, fresh, unnamed, later, known] and reads == [schema.INCIDENT_HOST]
    assert new.host_record == (f"{HOST} was the culprit 3 times before, in 2 jobs, on {DAYS[0]}, {DAYS[1]} and "
                               f"{DAYS[2]}: drain it first.")
    assert later.host_record == (f"{HOST} was the culprit 4 times before, in 3 jobs, on {DAYS[0]}, {DAYS[1]}, "
                                 f"{DAYS[2]} and {_date(NOON)}: drain it first.")
    assert fresh.host_record == "" and unnamed.host_record == "" and known.host_record == "kept"
    assert new.host_record in new.text and f"  Record: {new.host_record}" in new.briefing()
    assert new.to_json()["host_record"] == new.host_record
    # the next cycle writes them again: nothing to look up
    annotate_repeat_offenders(store, [new, fresh, unnamed, later, known])
    assert reads == [schema.INCIDENT_HOST]
    host_reads = lambda: reads.count(schema.INCIDENT_HOST)  # noqa: E731
    # the record is stored with the incident and read back; an empty one reads back as not looked
    # up (None), as does an incident from before the record existed: looked up at its next write
    store.write_measurement(schema.INCIDENT, incidents_frame([new, fresh, unnamed]))
    back = {i.id: i for i in load_incidents(store, "job-d")}
    assert back[new.id].host_record == new.host_record and back[fresh.id].host_record is None
    before = incidents_frame([_incident("job-f", "cs-2-r0", NOON, [HOST])]).drop(columns="host_record")
    store.write_measurement(schema.INCIDENT, before)
    (old,) = load_incidents(store, "job-f")
    assert old.host_record is None
    annotate_repeat_offenders(store, [old])
    assert old.host_record.startswith(f"{HOST} was the culprit 3 times before") and host_reads() == 2


def test_nothing_opened_nothing_read(store, monkeypatch):
    monkeypatch.setattr(store, "read", lambda *a, **kw: pytest.fail("no read expected"))
    assert annotate_repeat_offenders(store, []) == []
    done = _incident("job-d", "cs-40-r136", NOON, [HOST], host_record="")
    assert annotate_repeat_offenders(store, [done]) == [done]


def test_records_from_rows_without_a_store():
    rows = pd.DataFrame({"time": [NOON - DAY, NOON - DAY], "job": ["a", "a"], "id": ["x", "x"],
                         "host": [HOST, HOST]})
    assert culprit_records(rows, [HOST], NOON)[HOST].incidents == 1
    assert culprit_records(rows.iloc[:0], [HOST], NOON) == {}
    assert record_sentence(culprit_records(rows, [HOST], NOON).values()).startswith(f"{HOST} was the culprit once")


def _top_hosts_query() -> str:
    model = provisioning.dashboard_models()["noc"]
    (panel,) = [p for p in model["panels"] if p["title"] == "Hosts with the most incidents, 30 days"]
    assert panel["type"] == "table" and panel["options"]["sortBy"][0]["displayName"] == "incidents"
    (t,) = panel["targets"]
    now = NOON + DAY
    return interpolate(t["query"], {}, TimeRange(now - 6 * 3_600_000, now, relative=True), 1000)


def test_the_noc_wall_lists_the_hosts_with_the_most_incidents_over_30_days(store):
    store.write_measurement(schema.INCIDENT_HOST, incident_host_frame(
        [_incident("job-c", f"cs-{k}-r0", NOON - k * DAY, ["gpu-node-00033"]) for k in (1, 2, 3, 5, 6)]
        + [_incident("job-x", "cs-1-r0", NOON, [], nodes=[4])]))   # "node 4": not a machine
    res = influx_query(store.url, store.bucket, _top_hosts_query())
    (series,) = res.series
    rows = [dict(zip(series["columns"], v, strict=True)) for v in series["values"]]
    # most first; each incident once (job-b's cs-90-r8 left two points); the one 40 days back, the
    # pipeline imbalance's "all" and node numbers are not counted
    assert [(r["host"], r["incidents"]) for r in rows] == [("gpu-node-00033", 5), (HOST, 3), ("gpu-node-00018", 2)]


def test_the_noc_wall_keeps_the_top_20(influx_store):
    hosts = [f"gpu-node-{n:05d}" for n in range(25)]
    influx_store.write_measurement(schema.INCIDENT_HOST, incident_host_frame(
        [_incident("job", f"cs-{n}-{k}", NOON - k * 60_000, [h]) for n, h in enumerate(hosts) for k in range(n + 1)]))
    (series,) = influx_query(influx_store.url, influx_store.bucket, _top_hosts_query()).series
    got = [(v[series["columns"].index("host")], v[series["columns"].index("incidents")]) for v in series["values"]]
    assert got == [(hosts[n], n + 1) for n in range(24, 4, -1)]
