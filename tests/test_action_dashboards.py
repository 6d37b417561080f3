"""The actions and the recovery on the dashboards and in Grafana alerting, on the real InfluxDB: a
job whose culprit node rankscope drained and which then restarted on a new machine. Every query of
the NOC wall, the heatmap and the drill-down that reads the ``action`` points or the time to recover
returns rows here (IL-0477 has neither: tests/test_dashboards_queries.py leaves them to this file),
and the alert on a drained job that has not recovered fires while it waits and stops once it is back."""

from __future__ import annotations

import time
import uuid

import pytest

from actions.records import ActionRecord, write_records
from analyzer.service.analyzer_service import AnalyzerService
from dashboards import provisioning
from dashboards.alerts import drained_not_recovered_rule, rankscope_alert_groups
from rankscope import schema
from rankscope.store import InfluxStore
from tests.grafana_macros import (
    TimeRange,
    dashboard_queries,
    influx_query,
    interpolate,
    resolve_variables,
)
from tests.test_recovery import FAULT, _clock_at, _incident, _sim, _write

JOB = "drained-wall"


@pytest.fixture(scope="module")
def drained(influx_url):
    """The job, analyzed in three steps: before the drain, ten minutes after it with no iteration,
    after its restart on a spare; the alert's answers at the second and third."""
    store = InfluxStore(influx_url, bucket=f"test_{uuid.uuid4().hex[:10]}", api="v1")
    start = int(time.time() * 1000) - 2 * 3_600_000
    sim = _sim(JOB, 80, [FAULT], [{"node": 1, "at": 55, "host": "spare-1"}], start_ms=start)
    times = _write(store, sim, 45)
    svc = AnalyzerService(store, clock=_clock_at(times[-1] + 1_000))
    svc.cycle()
    inc = _incident(store, JOB)
    write_records(store, [ActionRecord(JOB, inc.id, "gpu-node-00001", "drain", "done", "drained: scontrol update",
                                       times[40], host="gpu-node-00001", cls=inc.cls.value, mode="enforce")])
    rule = drained_not_recovered_rule(minutes=5)
    svc.clock = _clock_at(times[-1] + 600_000)
    svc.cycle()
    waiting = _alert(store, rule, times[-1] + 600_000)
    rest = _write(store, sim, 80)
    svc.clock = _clock_at(rest[-1] + 1_000)
    svc.cycle(final=True)
    back = _alert(store, rule, rest[-1] + 60_000)
    try:
        yield store, (start - 60_000, rest[-1] + 60_000), waiting, back
    finally:
        store.drop_database()
        store.close()


def _alert(store, rule, now_ms: int) -> dict[str, float]:
    """The rule's reduced value per incident id, and whether its threshold holds, as Grafana evaluates."""
    tr = TimeRange(now_ms - rule.query.from_s * 1000, now_ms)
    res = influx_query(store.url, store.bucket, interpolate(rule.query.query, {}, tr, 1000))
    return {s["tags"]["id"]: [v[1] for v in s["values"] if v[1] is not None][-1] for s in res.series}


@pytest.mark.parametrize("name", ["noc", "heatmap", "incident"])
def test_the_action_and_recovery_queries_return_rows(drained, name):
    store, (t0, t1), _, _ = drained
    model = provisioning.dashboard_models()[name]
    tr = TimeRange(t0, t1, relative=True)
    run = lambda q: influx_query(store.url, store.bucket, q)  # noqa: E731
    variables = resolve_variables(model, run, tr, [])
    ours = [pq for pq in dashboard_queries(model, variables, tr, "10s")
            if f'"{schema.ACTION}"' in pq.query or "time_to_recover_s" in pq.query]
    assert ours, f"{name}: no query reads the actions or the recovery"
    empty = [pq.where for pq in ours if run(pq.query).rows == 0]
    assert not empty, f"{name}: {empty}"
    if name == "noc":
        (table,) = [pq for pq in ours if "last(\"state\")" in pq.query]
        (series,) = run(table.query).series
        cols = series["columns"]
        row = dict(zip(cols, series["values"][0], strict=True))
        assert (row["state"], row["mode"], series["tags"]["node"]) == ("done", "enforce", "gpu-node-00001")


def test_the_alert_fires_while_the_drained_job_waits_and_stops_once_it_is_back(drained):
    _, _, waiting, back = drained
    (minutes,) = waiting.values()
    assert minutes > 5                                          # ten minutes and more since the drain
    assert list(back.values()) == [-1 / 60]                     # recovered: nothing waits
    rules = {r.uid for grp in rankscope_alert_groups() for r in grp.rules}
    assert "rankscope-drained-not-recovered" in rules
