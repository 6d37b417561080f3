"""Every generated query, with Grafana's macros substituted as Grafana does, runs
against a real InfluxDB holding the IL-0477 incident (with rankscope's retention
policies) and returns rows; none reads raw points older than the raw policy."""

from __future__ import annotations

import re
import time
import urllib.parse
import urllib.request

import numpy as np
import pandas as pd
import pytest

from dashboards import provisioning
from dashboards.alerts import rankscope_alert_groups
from dashboards.panels import HEATMAP_MAX_ROWS
from rankscope import schema
from rankscope.store import StoreError
from rankscope.topology import parse_ranks
from tests.grafana_macros import (
    QueryResult,
    TimeRange,
    answers,
    dashboard_queries,
    influx_query,
    interpolate,
    resolve_variables,
)
from tests.il0477_store import TOPOLOGY, IncidentData

DATASOURCE_MIN_INTERVAL = provisioning.datasource_document()["datasources"][0]["jsonData"]["timeInterval"]


@pytest.fixture(scope="session")
def il0477(il0477_incident) -> IncidentData:
    return il0477_incident


def _dashboard_time_range(data: IncidentData) -> TimeRange:
    """The incident as a wall shows it: a relative range whose "now" is just after its end."""
    return TimeRange(data.start_ms - 60_000, data.end_ms + 60_000, relative=True)


_RAN: dict[tuple[str, str], list[tuple[str, str, QueryResult]]] = {}


def _run_dashboard(data: IncidentData, model: dict) -> list[tuple[str, str, QueryResult]]:
    """Run every variable, panel and annotation query of a dashboard as Grafana would (once per db)."""
    key = (data.db, model["uid"])
    if key not in _RAN:
        _RAN[key] = _run_dashboard_queries(data, model)
    return _RAN[key]


def _run_dashboard_queries(data: IncidentData, model: dict,
                           tr: TimeRange | None = None) -> list[tuple[str, str, QueryResult]]:
    tr = tr or _dashboard_time_range(data)
    run = lambda q: influx_query(data.url, data.db, q)  # noqa: E731
    ran: list[tuple[str, str, QueryResult]] = []
    variables = resolve_variables(model, run, tr, ran)
    for pq in dashboard_queries(model, variables, tr, DATASOURCE_MIN_INTERVAL):
        ran.append((pq.where, pq.query, run(pq.query)))
    return ran


@pytest.mark.parametrize("name", sorted(provisioning.DASHBOARDS))
def test_every_dashboard_query_returns_rows(il0477, name):
    model = provisioning.dashboard_models()[name]
    ran = _run_dashboard(il0477, model)
    # PromQL targets (the drill-down's GPU panels) run against a real Prometheus: tests/test_hardware_prometheus.py
    n_targets = sum(1 for p in model["panels"] for t in p.get("targets", [])
                    if (t.get("datasource") or {}).get("type") != "prometheus")
    n_vars = sum(1 for v in model["templating"]["list"] if v["type"] == "query")
    assert len(ran) == n_targets + n_vars + len(model["annotations"]["list"])
    # IL-0477 never restarted, nothing acted on it and it never recovered: those queries are run
    # on jobs that did (tests/test_job_lifecycle.py, tests/test_action_dashboards.py)
    elsewhere = (schema.JOB_LIFECYCLE, f'"{schema.ACTION}"', "time_to_recover_s")
    empty = [f"{where}: {q}" for where, q, res in ran
             if res.rows == 0 and answers(q) and not any(m in q for m in elsewhere)]
    assert not empty, f"{name}: queries returned no rows ({il0477.source} data):\n" + "\n".join(empty)
    # a target for other column widths returns nothing here; the heatmap test runs it where it answers
    assert all(res.rows == 0 for _, q, res in ran if not answers(q)), name


def _wall(data: IncidentData, hours: int = 6) -> TimeRange:
    """A wall over ``hours`` whose "now" is just after the incident: its columns are an hour wide."""
    return TimeRange(data.end_ms + 60_000 - hours * 3_600_000, data.end_ms + 60_000, relative=True)


def _by_panel(ran: list[tuple[str, str, QueryResult]]) -> dict[str, list[tuple[str, QueryResult]]]:
    """Each panel's (query, result) per target, keyed by panel id."""
    out: dict[str, list[tuple[str, QueryResult]]] = {}
    for where, q, res in ran:
        if where.startswith("panel"):
            out.setdefault(where.split(" ", 2)[1], []).append((q, res))
    return out


def _answer(targets: list[tuple[str, QueryResult]]) -> tuple[str, QueryResult]:
    """The one target of a panel that answers at this range (the others hold a false condition)."""
    (one,) = [(q, res) for q, res in targets if answers(q)]
    return one


def test_heatmaps_draw_bounded_rows_and_show_the_culprit_band(il0477):
    model = provisioning.dashboard_models()["heatmap"]
    ran = {pid: _answer(targets)[1] for pid, targets in _by_panel(_run_dashboard(il0477, model)).items()}
    heatmaps = [p for p in model["panels"] if p["type"] == "heatmap"]
    for p in heatmaps:
        res = ran[str(p["id"])]
        assert 0 < len(res.series) <= min(p["rankscope"]["maxRows"], HEATMAP_MAX_ROWS), p["title"]
    # The node overviews (over hours, and the last 30 minutes; all pp stages): one row per node, and
    # node 1294 (ranks 10352-10359) glows in mlp.
    onset_ms = int(il0477.store.read("incident", il0477.job)["time"].min())
    for panel in heatmaps[:2]:
        by_node = ran[str(panel["id"])]
        assert panel["rankscope"]["rowTag"] == "node" and len(by_node.series) == TOPOLOGY.nodes
        late_means = {}
        for s in by_node.series:
            vals = [v[1] for v in s["values"] if v[0] > onset_ms + 120_000 and v[1] is not None]
            late_means[int(s["tags"]["node"])] = sum(vals) / len(vals)
        culprit = late_means.pop(1294)
        others = sorted(late_means.values())
        assert culprit > 3 * others[len(others) // 2], (panel["title"], culprit, others[len(others) // 2])
    # Drill-down: single ranks of the default dp ranges (pp7 dp 224-319) include the 8 culprits.
    drill = ran[str(heatmaps[2]["id"])]
    ranks = {int(s["tags"]["rank"]) for s in drill.series}
    assert set(parse_ranks("10352-10359")) <= ranks and len(ranks) == 96


def _threshold_fires(values: list[float], op: str, threshold: float) -> bool:
    return any(v > threshold if op == "gt" else v < threshold for v in values)


@pytest.mark.parametrize("rule", rankscope_alert_groups()[0].rules, ids=lambda r: r.uid)
def test_alert_rule_query_returns_rows_and_fires_on_il0477(il0477, rule):
    # Grafana evaluates at "now"; here "now" is the end of the incident data.
    now = il0477.end_ms + 30_000
    tr = TimeRange(now - rule.query.from_s * 1000, now - rule.query.to_s * 1000)
    q = interpolate(rule.query.query, {}, tr, 1000)
    res = influx_query(il0477.url, il0477.db, q)
    assert res.rows > 0, f"{rule.uid}: no rows for {q}"
    reducer = {"max": max, "min": min, "last": lambda v: v[-1]}[rule.reduce.reducer]
    reduced = [reducer([r[1] for r in s["values"] if r[1] is not None]) for s in res.series]
    assert _threshold_fires(reduced, rule.threshold.op, rule.threshold.value), (rule.uid, reduced)
    for s in res.series:  # the labels the annotations template on exist in every series
        for label in ("job", "node", "stage", "id", "class", "group_type", "host"):
            if "{{ $labels." + label in rule.summary + rule.description:
                assert label in s["tags"], (rule.uid, label)
    if rule.uid == "rankscope-incident-open":   # one alert per culprit host, labelled with it
        assert {s["tags"]["host"] for s in res.series} == {"gpu-node-01294"}
        assert {s["tags"]["class"] for s in res.series} == {"compute_straggler"}


def test_the_group_alert_reads_the_analyzers_verdict(influx_store):
    """The L2 group rule fires where the analyzer flagged a group (``l2_group.anomalous``), with no
    CV threshold of its own: a group above 0.8 that the analyzer did not flag (its cv_threshold set
    higher) stays quiet, one below 0.8 that it flagged (set lower) fires."""
    (rule,) = [r for r in rankscope_alert_groups()[0].rules if r.uid == "rankscope-l2-group-cv"]
    now = int(time.time() * 1000)
    base = {"time": now - 60_000, "job": "j", "group_type": "ep", "mean": 1.0, "median": 1.0,
            "min": 0.5, "max": 3.0, "std": 1.0, "size": 8}
    influx_store.write_measurement(schema.L2_GROUP, pd.DataFrame([
        {**base, "group_id": 0, "stage": "mlp", "cv": 1.5, "anomalous": 0},
        {**base, "group_id": 1, "stage": "dispatch", "cv": 0.5, "anomalous": 1}]))
    tr = TimeRange(now - rule.query.from_s * 1000, now)
    res = influx_query(influx_store.url, influx_store.bucket, interpolate(rule.query.query, {}, tr, 1000))
    reduced = {s["tags"]["stage"]: max(r[1] for r in s["values"] if r[1] is not None) for s in res.series}
    assert reduced == {"dispatch": 0.5}
    assert _threshold_fires([reduced["dispatch"]], rule.threshold.op, rule.threshold.value)


def test_the_database_keeps_raw_points_7_days_and_the_rest_400_days(il0477):
    policies = il0477.store.retention_policies()
    assert policies == {"raw": (7 * 86400, True), "long": (400 * 86400, False)}
    counts = {m: il0477.store.query_raw(f'SELECT count("iteration"), sum("iterations") FROM "long"."{m}"')
              for m in (schema.ROLLUP_HOST, schema.ROLLUP_JOB, schema.ROLLUP_HOST_WINDOW, schema.ROLLUP_HOST_HOUR)}
    assert int(counts[schema.ROLLUP_JOB]["count"].iloc[0]) == 40
    assert int(counts[schema.ROLLUP_HOST]["count"].iloc[0]) == 40 * TOPOLOGY.nodes
    # every iteration of every host is in exactly one 5-minute window
    w = schema.ROLLUP_WINDOW_MS
    windows = len(set(t // w for t in il0477.store.latest_times(schema.STAGE_LATENCY, il0477.job, 40)))
    assert int(counts[schema.ROLLUP_HOST_WINDOW]["count"].iloc[0]) == windows * TOPOLOGY.nodes
    assert int(counts[schema.ROLLUP_HOST_WINDOW]["sum"].iloc[0]) == 40 * TOPOLOGY.nodes
    # and in exactly one hour
    hours = len(set(t // schema.ROLLUP_HOUR_MS for t in il0477.store.latest_times(schema.STAGE_LATENCY,
                                                                                  il0477.job, 40)))
    assert int(counts[schema.ROLLUP_HOST_HOUR]["count"].iloc[0]) == hours * TOPOLOGY.nodes
    assert int(counts[schema.ROLLUP_HOST_HOUR]["sum"].iloc[0]) == 40 * TOPOLOGY.nodes


def _cells(res) -> dict[tuple[str, int], float]:
    return {(s["tags"]["node"], v[0]): v[1] for s in res.series for v in s["values"]}


def test_the_node_heatmaps_from_rollups_draw_what_the_raw_points_say(il0477):
    """The overview reads the 5-minute windows, the last-30-minutes panel rollup_host; over raw
    stage_latency the same queries give the same cells (every node reports all its ranks)."""
    model = provisioning.dashboard_models()["heatmap"]
    by_node, recent = [p for p in model["panels"] if p.get("rankscope", {}).get("rowTag") == "node"]
    queries = {pid: _answer(targets)[0] for pid, targets in _by_panel(_run_dashboard(il0477, model)).items()}
    q_hours, q_recent = queries[str(by_node["id"])], queries[str(recent["id"])]
    for q, src in ((q_hours, f'"long"."{schema.ROLLUP_HOST_WINDOW}"'), (q_recent, '"long"."rollup_host"')):
        raw_q = q.replace(src, '"stage_latency"')
        assert raw_q != q
        window = schema.ROLLUP_WINDOW_MS if src != '"long"."rollup_host"' else None
        _same_cells(*(_cells(influx_query(il0477.url, il0477.db, x)) for x in (q, raw_q)), window,
                    _dashboard_time_range(il0477).start_ms)
    # a range that begins inside a window (a zoom, a drag-select) draws that window whole: its point
    # is at its start, before the range, where $timeFilter alone would drop it
    tr = TimeRange(il0477.start_ms + 450_000, il0477.end_ms + 60_000)     # never on a 5-minute edge
    window = tr.start_ms // schema.ROLLUP_WINDOW_MS * schema.ROLLUP_WINDOW_MS
    assert il0477.start_ms < window < tr.start_ms
    ran = _by_panel(_run_dashboard_queries(il0477, model, tr))[str(by_node["id"])]
    q_zoom, res = _answer(ran)
    zoom = _cells(res)
    assert sum(t == window for _, t in zoom) == TOPOLOGY.nodes and min(t for _, t in zoom) == window
    whole = _cells(influx_query(il0477.url, il0477.db, re.sub(
        r"time > \d+ms - \d+ms AND time <= \d+ms", f"time >= {window}ms AND time < {window + 300_000}ms",
        q_zoom.replace(f'"long"."{schema.ROLLUP_HOST_WINDOW}"', '"stage_latency"'))))
    assert np.allclose([zoom[(n, window)] for n in ("0", "1294")], [whole[(n, window)] for n in ("0", "1294")])
    # a coarser column (a longer range): the mean of the raw points' 5-minute means inside it
    coarse = re.sub(r"time\(\w+\)", "time(20m)", q_hours)
    fine = _cells(influx_query(il0477.url, il0477.db, re.sub(r"time\(\w+\)", "time(5m)", q_hours).replace(
        f'"long"."{schema.ROLLUP_HOST_WINDOW}"', '"stage_latency"')))
    got = _cells(influx_query(il0477.url, il0477.db, coarse))
    first = min(t for _, t in fine)     # the window the range begins inside: partly outside it
    checked = 0
    for (node, t), v in got.items():
        if t <= first or node not in ("0", "1294", "1619"):
            continue
        inside = [x for (n, u), x in fine.items() if n == node and t <= u < t + 20 * 60_000]
        assert inside and np.isclose(v, np.mean(inside), rtol=1e-9), (node, t)
        checked += 1
    assert checked >= 3


def _same_cells(fast: dict, slow: dict, window_ms: int | None = None, start_ms: int | None = None) -> None:
    """The rollup's cells are the raw points' (every node reports all its ranks). The raw query,
    given a window tier's time filter (which takes the window the range begins inside whole), may
    also draw the raw points before that window (``start_ms`` aligned to ``window_ms``) as one
    more, earlier column; no other differs."""
    edge = start_ms // window_ms * window_ms if window_ms and start_ms is not None else None
    extra = slow.keys() - fast.keys()
    assert fast.keys() <= slow.keys() and all(edge is not None and t < edge for _, t in extra), sorted(extra)[:3]
    keys = sorted(fast)
    assert len(keys) >= TOPOLOGY.nodes and np.allclose([fast[k] for k in keys], [slow[k] for k in keys], rtol=1e-9)


@pytest.mark.parametrize("begins", ["before the data", "inside the data"])
def test_a_wall_over_hours_reads_the_hourly_windows_and_draws_what_the_raw_points_say(il0477, begins):
    """Over 6 h the overview's columns are an hour wide: target B answers from rollup_host_1h (one
    point per node and hour), A from the 5-minute windows stays silent, and the cells are the
    raw points' hourly means. A range that begins inside an hour of data draws that hour whole
    (its point is at the hour's start, before the range: $timeFilter alone would drop it)."""
    model = provisioning.dashboard_models()["heatmap"]
    by_node = next(p for p in model["panels"] if p.get("rankscope", {}).get("rowTag") == "node")
    tr = _wall(il0477)
    if begins == "inside the data":
        start = il0477.start_ms + 10 * 60_000 + 30_000        # never on an hour's edge
        tr = TimeRange(start, start + 6 * 3_600_000, relative=True)
        assert start % schema.ROLLUP_HOUR_MS
    ran = _by_panel(_run_dashboard_queries(il0477, model, tr))[str(by_node["id"])]
    assert [answers(q) for q, _ in ran] == [False, True] and ran[0][1].rows == 0
    q, res = ran[1]
    hourly = f'"long"."{schema.ROLLUP_HOST_HOUR}"'
    assert hourly in q and "GROUP BY time(1h)" in q and len(res.series) == TOPOLOGY.nodes
    fast = _cells(res)
    _same_cells(fast, _cells(influx_query(il0477.url, il0477.db, q.replace(hourly, '"stage_latency"'))),
                schema.ROLLUP_HOUR_MS, tr.start_ms)
    first_hour = tr.start_ms // schema.ROLLUP_HOUR_MS * schema.ROLLUP_HOUR_MS
    if begins == "inside the data":     # the hour the range begins inside is drawn, for every node
        assert sum(t == first_hour for _, t in fast) == TOPOLOGY.nodes
    # the culprit's node glows in the hourly cells too
    last = max(t for _, t in fast)
    late = {node: v for (node, t), v in fast.items() if t == last}
    assert late["1294"] > 1.5 * np.median(list(late.values()))


def _influx_write(url: str, db: str, rp: str, line: str) -> None:
    params = urllib.parse.urlencode({"db": db, "rp": rp, "precision": "ms"})
    urllib.request.urlopen(urllib.request.Request(f"{url}/write?{params}", data=line.encode(), method="POST"),
                           timeout=30).close()


def test_no_query_reads_raw_points_older_than_the_raw_policy(il0477):
    """A raw point 10 days old cannot enter the raw policy (InfluxDB drops it); planted in the long
    policy, where no raw point belongs, no panel, variable, annotation or alert query reads it."""
    now = int(time.time() * 1000)
    old = now - 10 * 86_400_000
    frame = il0477.store.read_stage_latency(il0477.job, last_iterations=1)
    frame = frame[frame["rank"] == 10352].copy()   # in the drill-down's default dp ranges
    frame["time"] = old
    with pytest.raises(StoreError, match="dropped 1 point"):
        il0477.store.write_stage_latency(frame)
    tags = ",".join(f"{t}={frame[t].iloc[0]}" for t in ("job", "rank", "pp", "dp", "tp", "ep_group", "node", "host"))
    _influx_write(il0477.url, il0477.db, "long", f"stage_latency,{tags} mlp=99999.0,iteration_ms=99999.0,"
                                                 f"iteration=-1i {old}")
    horizon = now - 7 * 86_400_000
    tr = TimeRange(old - 3_600_000, now)
    try:
        assert influx_query(il0477.url, il0477.db, 'SELECT count(*) FROM "long"."stage_latency"').rows == 1
        ran = []
        for model in provisioning.dashboard_models().values():
            ran += _run_dashboard_queries(il0477, model, tr)
        for rule in [r for grp in rankscope_alert_groups() for r in grp.rules]:
            q = interpolate(rule.query.query, {}, tr, 1000)
            ran.append((rule.uid, q, influx_query(il0477.url, il0477.db, q)))
        assert len(ran) > 30
        # the control: the drill-down, pointed at the policy the point was planted in, shows it
        drill = next(q for where, q, _ in ran if "by rank, dp ranges" in where)
        control = influx_query(il0477.url, il0477.db, drill.replace('"stage_latency"', '"long"."stage_latency"'))
        assert 99999.0 in [v for se in control.series for row in se["values"] for v in row[1:]]
        for where, q, res in ran:
            for series in res.series:
                values = [v for row in series.get("values", []) for v in row[1:]]
                assert not {99999.0, 99.999} & set(values), (where, q)   # the planted point (ms or s)
                if "GROUP BY time(" in q:   # fill(none): a bucket exists only where a point was read
                    assert all(row[0] >= horizon - 86_400_000 for row in series["values"]), (where, q)
    finally:
        influx_query(il0477.url, il0477.db, f"DELETE FROM \"stage_latency\" WHERE time < {horizon}ms")
    assert influx_query(il0477.url, il0477.db, 'SELECT count(*) FROM "long"."stage_latency"').rows == 0
