"""Every generated query, with Grafana's macros substituted as Grafana does, runs
against a real InfluxDB holding the IL-0477 incident and returns rows."""

from __future__ import annotations

import pytest

from dashboards import provisioning
from dashboards.alerts import rankscope_alert_groups
from dashboards.panels import HEATMAP_MAX_ROWS
from rankscope.topology import parse_ranks
from tests.grafana_macros import (
    QueryResult,
    TimeRange,
    influx_query,
    interpolate,
    panel_interval_ms,
    resolve_variables,
)
from tests.il0477_store import TOPOLOGY, IncidentData, shared_incident

DATASOURCE_MIN_INTERVAL = provisioning.datasource_document()["datasources"][0]["jsonData"]["timeInterval"]


@pytest.fixture(scope="session")
def il0477(influx_url, request) -> IncidentData:
    return shared_incident(influx_url, request.addfinalizer)


def _dashboard_time_range(data: IncidentData) -> TimeRange:
    return TimeRange(data.start_ms - 60_000, data.end_ms + 60_000)


_RAN: dict[tuple[str, str], list[tuple[str, str, QueryResult]]] = {}


def _run_dashboard(data: IncidentData, model: dict) -> list[tuple[str, str, QueryResult]]:
    """Run every variable, panel and annotation query of a dashboard as Grafana would (once per db)."""
    key = (data.db, model["uid"])
    if key not in _RAN:
        _RAN[key] = _run_dashboard_queries(data, model)
    return _RAN[key]


def _run_dashboard_queries(data: IncidentData, model: dict) -> list[tuple[str, str, QueryResult]]:
    tr = _dashboard_time_range(data)
    run = lambda q: influx_query(data.url, data.db, q)  # noqa: E731
    ran: list[tuple[str, str, QueryResult]] = []
    variables = resolve_variables(model, run, tr, ran)
    for panel in model["panels"]:
        interval = panel_interval_ms(tr, panel.get("maxDataPoints"), panel.get("interval") or DATASOURCE_MIN_INTERVAL)
        for t in panel.get("targets", []):
            q = interpolate(t["query"], variables, tr, interval)
            ran.append((f"panel {panel['id']} {panel['title']!r} {t['refId']}", q, run(q)))
    for ann in model["annotations"]["list"]:
        q = interpolate(ann["query"], variables, tr, 1000)
        ran.append((f"annotation {ann['name']!r}", q, run(q)))
    return ran


@pytest.mark.parametrize("name", sorted(provisioning.DASHBOARDS))
def test_every_dashboard_query_returns_rows(il0477, name):
    model = provisioning.dashboard_models()[name]
    ran = _run_dashboard(il0477, model)
    n_targets = sum(len(p.get("targets", [])) for p in model["panels"])
    n_vars = sum(1 for v in model["templating"]["list"] if v["type"] == "query")
    assert len(ran) == n_targets + n_vars + len(model["annotations"]["list"])
    empty = [f"{where}: {q}" for where, q, res in ran if res.rows == 0]
    assert not empty, f"{name}: queries returned no rows ({il0477.source} data):\n" + "\n".join(empty)


def test_heatmaps_draw_bounded_rows_and_show_the_culprit_band(il0477):
    model = provisioning.dashboard_models()["heatmap"]
    ran = {where.split(" ", 2)[1]: res for where, _, res in _run_dashboard(il0477, model) if where.startswith("panel")}
    heatmaps = [p for p in model["panels"] if p["type"] == "heatmap"]
    for p in heatmaps:
        res = ran[str(p["id"])]
        assert 0 < len(res.series) <= min(p["rankscope"]["maxRows"], HEATMAP_MAX_ROWS), p["title"]
    # The node overview (all pp stages): one row per node, and node 1294 (ranks 10352-10359) glows in mlp.
    by_node = ran[str(heatmaps[0]["id"])]
    assert len(by_node.series) == TOPOLOGY.nodes
    onset_ms = int(il0477.store.read("incident", il0477.job)["time"].min())
    late_means = {}
    for s in by_node.series:
        vals = [v[1] for v in s["values"] if v[0] > onset_ms + 120_000 and v[1] is not None]
        late_means[int(s["tags"]["node"])] = sum(vals) / len(vals)
    culprit = late_means.pop(1294)
    others = sorted(late_means.values())
    assert culprit > 3 * others[len(others) // 2], (culprit, others[len(others) // 2])
    # Drill-down: single ranks of the default dp ranges (pp7 dp 224-319) include the 8 culprits.
    drill = ran[str(heatmaps[1]["id"])]
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
        for label in ("job", "node", "stage", "id", "class", "group_type"):
            if "{{ $labels." + label in rule.summary + rule.description:
                assert label in s["tags"], (rule.uid, label)
