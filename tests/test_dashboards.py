"""Structure of the generated dashboards and provisioning files (no Grafana needed)."""

from __future__ import annotations

import itertools
import re

import pytest
import yaml

from dashboards import provisioning
from dashboards.alerts import AlertRule, InfluxQuery, Reduce, Threshold, rankscope_alert_groups
from dashboards.panels import (
    GRID_COLUMNS,
    HEATMAP_MAX_CELLS,
    HEATMAP_MAX_ROWS,
    HEATMAP_RECENT_MAX_CELLS,
    Layout,
    rows_heatmap,
    source,
)
from dashboards.provisioning import dump_yaml
from dashboards.routing import Route
from dashboards.variables import IL0477_TOPOLOGY
from rankscope import schema
from rankscope.cli import main
from rankscope.config import LONG_POLICY, RAW_MEASUREMENTS, Retention, policy_of
from rankscope.store import InfluxStore
from tests.grafana_macros import TimeRange, answers, panel_interval_ms, round_interval

MODELS = provisioning.dashboard_models()
FILES = provisioning.render_all()


def _provisioned(rel: str) -> dict:
    return yaml.safe_load(FILES[f"{provisioning.PROVISIONING}/{rel}"])


DATASOURCE_UIDS = {d["uid"] for d in _provisioned("datasources/rankscope.yaml")["datasources"]}


def _datasource_refs(model: dict):
    for p in model["panels"]:
        yield f"panel {p['title']}", p.get("datasource")
        for t in p.get("targets", []):
            yield f"panel {p['title']} target {t['refId']}", t.get("datasource")
    for v in model["templating"]["list"]:
        if v["type"] == "query":
            yield f"variable {v['name']}", v.get("datasource")
    for a in model["annotations"]["list"]:
        yield f"annotation {a['name']}", a.get("datasource")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_panel_ids_unique_and_grid_inside_24_columns_without_overlap(name):
    panels = MODELS[name]["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    boxes = []
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["y"] >= 0 and g["w"] >= 1 and g["h"] >= 1, p["title"]
        assert g["x"] + g["w"] <= GRID_COLUMNS, p["title"]
        boxes.append((p["title"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for a, b in itertools.combinations(boxes, 2):
        overlap = a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
        assert not overlap, f"{name}: panels {a[0]!r} and {b[0]!r} overlap"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_datasource_reference_is_provisioned(name):
    refs = list(_datasource_refs(MODELS[name]))
    assert refs
    for where, ref in refs:
        assert isinstance(ref, dict) and ref.get("uid") in DATASOURCE_UIDS, f"{name} {where}: {ref!r}"
        assert ref.get("type") == ("prometheus" if ref["uid"] == "rankscope-prometheus" else "influxdb")


def _is_promql(t: dict) -> bool:
    return (t.get("datasource") or {}).get("type") == "prometheus"


def test_only_the_drill_down_asks_prometheus_for_the_culprit_hosts_gpus():
    prom = {name: [(p["title"], t["expr"]) for p in m["panels"] for t in p.get("targets", []) if _is_promql(t)]
            for name, m in MODELS.items()}
    assert {n for n, ts in prom.items() if ts} == {"incident"}
    assert len(prom["incident"]) == 3
    for title, expr in prom["incident"]:
        assert "$culprit_host" in title and 'Hostname=~"(?i)$culprit_host' in expr and "DCGM_FI_DEV_" in expr


def test_alert_rules_use_the_provisioned_datasource_or_expressions():
    doc = _provisioned("alerting/rankscope.yaml")
    uids = [step["datasourceUid"] for grp in doc["groups"] for rule in grp["rules"] for step in rule["data"]]
    assert set(uids) <= DATASOURCE_UIDS | {"__expr__"} and DATASOURCE_UIDS & set(uids)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_queries_are_raw_influxql_with_grafana_macros(name):
    for p in MODELS[name]["panels"]:
        for t in (t for t in p.get("targets", []) if not _is_promql(t)):
            q = t["query"]
            assert t["rawQuery"] is True and q.startswith("SELECT "), (p["title"], q)
            # the dashboard's range: $timeFilter, or a window tier's filter that takes the window the
            # range begins inside whole (dashboards.panels.by_interval)
            ranged = "$timeFilter" in q or re.search(r"time > \$\{__from\}ms - \d+ms AND time <= \$\{__to\}ms", q)
            if "GROUP BY time(" in q:
                assert "GROUP BY time($__interval)" in q and ranged, q
            assert "now()" in q or ranged or "\"id\" = '$incident'" in q, q


def test_exactly_one_target_of_a_tiered_panel_answers_every_column_width_grafana_can_pick():
    """Grafana rounds a panel's interval to a fixed ladder (at least the panel's minimum); for every
    rung from the minimum up to a year, one target of a panel with several answers, never none
    and never two (two would draw each row twice)."""
    tiered = [p for m in MODELS.values() for p in m["panels"]
              if any("$__interval_ms" in t["query"] for t in p.get("targets", []))]
    assert tiered
    # their time filter reads ${__from}/${__to}: the dashboard's range, which a panel's own time
    # override or shift would not move in every Grafana version, so a tiered panel has neither
    assert not [p["title"] for p in tiered if p.get("timeFrom") or p.get("timeShift")]
    ladder = sorted({round_interval(1.02 ** k) for k in range(1300)})      # 1 ms .. ~150 years
    for p in tiered:
        floor_ms = panel_interval_ms(TimeRange(0, 1), None, p["interval"])
        rungs = [ms for ms in ladder if ms >= floor_ms]
        assert rungs[0] == floor_ms == 300_000 and rungs[-1] == 31_536_000_000
        for ms in rungs:
            on = [t["refId"] for t in p["targets"] if answers(t["query"].replace("$__interval_ms", str(ms)))]
            assert len(on) == 1, (p["title"], ms, on)
        assert {t["refId"] for ms in rungs for t in p["targets"]
                if answers(t["query"].replace("$__interval_ms", str(ms)))} == {"A", "B"}


def test_heatmaps_use_the_current_model_with_bounded_numeric_rows():
    heatmaps = [p for m in MODELS.values() for p in m["panels"] if p["type"] == "heatmap"]
    assert len(heatmaps) >= 3
    for p in heatmaps:
        opts = p["options"]
        assert opts["calculate"] is False
        for key in ("rowsFrame", "yAxis", "color", "filterValues"):
            assert key in opts, (p["title"], key)
        assert opts["filterValues"]["le"] < 0  # zero-latency cells are drawn, not hidden
        assert p["maxDataPoints"] not in (None, 100)
        tag = p["rankscope"]["rowTag"]
        assert p["rankscope"]["maxRows"] <= HEATMAP_MAX_ROWS
        # several targets only where each answers other column widths, all drawing the same rows
        assert len(p["targets"]) == 1 or all("$__interval_ms" in t["query"] for t in p["targets"])
        assert [t["refId"] for t in p["targets"]] == ["A", "B"][:len(p["targets"])]
        for target in p["targets"]:
            assert tag in ("rank", "node") and target["alias"] == f"$tag_{tag}"
            assert re.search(rf'GROUP BY time\(\$__interval\), "{tag}"', target["query"])
            if tag == "rank" and "stage_latency" in target["query"]:
                # single ranks only for the chosen dp ranges (EP groups), never the whole job
                assert '"ep_group" =~ /^$dp$/' in target["query"]
    node_rows = [p for p in heatmaps if p["rankscope"]["rowTag"] == "node"]
    assert node_rows and all(p["rankscope"]["maxRows"] == IL0477_TOPOLOGY.nodes == 1620 for p in node_rows)


def test_a_heatmap_over_the_row_budget_is_refused():
    with pytest.raises(ValueError, match="12960 rows"):
        rows_heatmap("all ranks", "SELECT 1", Layout().place(24, 8), row_tag="rank", max_rows=12960)


def test_dp_range_variable_names_ranges_and_selects_ep_groups():
    var = next(v for v in MODELS["heatmap"]["templating"]["list"] if v["name"] == "dp")
    options = {o["text"]: o["value"] for o in var["options"]}
    assert len(options) == IL0477_TOPOLOGY.group_count("ep") == 405
    assert options["pp7 dp 256-287"] == "323"  # the IL-0477 culprits' EP group
    assert IL0477_TOPOLOGY.group_ids("ep")[10352] == 323
    assert var["multi"] and "323" in var["current"]["value"]


def test_datasource_provisioning_influxql_with_max_series_and_env_secrets():
    ds, prom = _provisioned("datasources/rankscope.yaml")["datasources"]
    assert ds["type"] == "influxdb" and ds["uid"] == "rankscope-influxdb" and ds["isDefault"]
    assert (prom["type"], prom["uid"], prom["url"], prom["isDefault"]) == \
        ("prometheus", "rankscope-prometheus", "${PROMETHEUS_URL}", False)
    assert ds["jsonData"]["version"] == "InfluxQL" and ds["jsonData"]["dbName"]
    assert ds["jsonData"]["maxSeries"] >= 5000 > 1000
    assert ds["secureJsonData"]["httpHeaderValue1"] == "Token ${INFLUXDB_V2_TOKEN}"
    assert ds["secureJsonData"]["password"] == "${INFLUXDB_V1_PASSWORD}"
    assert not re.search(r"[A-Za-z0-9_-]{40,}", FILES[f"{provisioning.PROVISIONING}/datasources/rankscope.yaml"])


def test_dashboard_provider_points_at_the_committed_json_and_refuses_ui_edits():
    (prov,) = _provisioned("dashboards/rankscope.yaml")["providers"]
    assert prov["allowUiUpdates"] is False and prov["type"] == "file"
    assert prov["options"]["path"] == provisioning.GRAFANA_DASHBOARD_PATH


def test_alert_file_has_grafana_file_provisioning_shape():
    doc = _provisioned("alerting/rankscope.yaml")
    assert doc["apiVersion"] == 1
    rules = []
    for grp in doc["groups"]:
        assert {"orgId", "name", "folder", "interval", "rules"} <= set(grp)
        rules += grp["rules"]
    assert {r["uid"] for r in rules} == {"rankscope-l1-step", "rankscope-l2-group-cv",
                                         "rankscope-l2-culprit-node", "rankscope-incident-open",
                                         "rankscope-l3-kernel", "rankscope-drained-not-recovered"}
    assert {r["uid"]: r["labels"]["severity"] for r in rules}["rankscope-l3-kernel"] == "warning"   # never a page
    assert set(FILES) >= {f"{provisioning.PROVISIONING}/alerting/{f}.yaml" for f in ("rankscope", "notifications")}
    for r in rules:
        assert "grafana_alert" not in r
        for key in ("uid", "title", "condition", "for", "noDataState", "execErrState", "labels",
                    "annotations", "data"):
            assert key in r, (r.get("uid"), key)
        query, reduce, threshold = r["data"]
        assert query["datasourceUid"] == "rankscope-influxdb" and query["relativeTimeRange"]["from"] > 0
        assert query["model"]["rawQuery"] is True and "$timeFilter" in query["model"]["query"]
        assert reduce["model"]["type"] == "reduce" and reduce["model"]["expression"] == query["refId"]
        assert threshold["model"]["type"] == "threshold" and threshold["model"]["expression"] == reduce["refId"]
        assert r["condition"] == threshold["refId"]
        assert r["annotations"]["summary"] and len(r["annotations"]["description"]) > 80
        assert not any("$" in str(v) for v in r["labels"].values())  # labels are env-interpolated
    node_rule = next(r for r in rules if r["uid"] == "rankscope-l2-culprit-node")
    for word in ("$labels.node", "$labels.stage", "$values.B.Value"):
        assert word in node_rule["annotations"]["summary"]


def test_alert_rule_refuses_steps_that_do_not_chain():
    with pytest.raises(ValueError, match="chain"):
        AlertRule("x", "x", InfluxQuery("A", "SELECT 1", 60), Reduce("B", "Z"), Threshold("C", "B", "gt", 1),
                  summary="s", description="d")


def test_committed_files_match_the_code_and_drift_is_caught(tmp_path, capsys):
    assert provisioning.check() == [], "run `rankscope dashboards generate` and commit"
    assert main(["dashboards", "check"]) == 0
    assert main(["dashboards", "generate", "--root", str(tmp_path)]) == 0
    assert provisioning.check(tmp_path) == []
    gen = tmp_path / "generated" / "noc.json"
    gen.write_text(gen.read_text().replace("Open incidents", "Open incidentz", 1))
    (tmp_path / "provisioning" / "alerting" / "rankscope.yaml").unlink()
    (tmp_path / "generated" / "old.json").write_text("{}")
    problems = {d.path: d.problem for d in provisioning.check(tmp_path)}
    assert problems == {"generated/noc.json": "differs from what the code generates",
                        "provisioning/alerting/rankscope.yaml": "missing",
                        "generated/old.json": "not generated by the code (stale)"}
    capsys.readouterr()
    assert main(["dashboards", "check", "--root", str(tmp_path)]) == 1
    assert "generated/noc.json" in capsys.readouterr().err
    assert main(["dashboards", "generate", "--root", str(tmp_path)]) == 0
    assert provisioning.check(tmp_path) == []


def test_generation_is_deterministic():
    assert provisioning.render_all() == FILES


@pytest.mark.parametrize("value", ["plain", "a: b", "#hash", "yes", "1.0", "", "quote \" and '", "line\nbreak",
                                   "ünïcode", "${ENV}", "{{ $labels.node }}", "- dash"])
def test_yaml_writer_round_trips_strings(value):
    doc = {"k": value, "list": [value, {"inner": value}], "n": 3, "f": 0.8, "b": False, "none": None,
           "empty": {}, "nothing": []}
    assert yaml.safe_load(dump_yaml(doc, "header line")) == doc


# ------------------------------------------------------ what the queries read, and where
def _all_queries() -> list[tuple[str, str]]:
    """(where, query) of every panel target, query variable and annotation, and every alert rule."""
    out = []
    for name, model in MODELS.items():
        for p in model["panels"]:
            out += [(f"{name} panel {p['title']}", t["query"]) for t in p.get("targets", []) if not _is_promql(t)]
        out += [(f"{name} variable {v['name']}", v["query"]) for v in model["templating"]["list"]
                if v["type"] == "query"]
        out += [(f"{name} annotation {a['name']}", a["query"]) for a in model["annotations"]["list"]]
    for grp in _provisioned("alerting/rankscope.yaml")["groups"]:
        out += [(f"alert {r['uid']}", r["data"][0]["model"]["query"]) for r in grp["rules"]]
    return out


FROM = re.compile(r'\bFROM\s+((?:"[^"]+"\.)?"[^"]+")')


def test_every_query_names_the_retention_policy_of_what_it_reads():
    """Rollups and analyzer outputs are read from "long"; raw points from the database's default
    policy (raw): a query that named neither would read a policy nobody writes to."""
    queries = _all_queries()
    assert len(queries) > 30
    for where, q in queries:
        sources = FROM.findall(q)
        assert sources, (where, q)
        for src in sources:
            parts = [p.strip('"') for p in src.split(".")]
            measurement = parts[-1]
            assert measurement in schema.MEASUREMENTS, (where, src)
            if policy_of(measurement) == LONG_POLICY:
                assert parts == [LONG_POLICY, measurement], (where, src)
            else:
                assert parts == [measurement], (where, src)


@pytest.mark.parametrize("policy", [None, "autogen"], ids=["layout", "one-policy"])
def test_the_dashboards_read_each_measurement_where_the_store_reads_it(policy):
    """One FROM (rankscope.store.influxql): the dashboards' and the store's agree on every
    measurement, a retention policy set for everything included, and the generated queries read
    nothing else."""
    store = InfluxStore("http://127.0.0.1:1", "db", api="v2", retention=Retention(), retention_policy=policy)
    for measurement in schema.MEASUREMENTS:
        assert source(measurement, policy) == store.source(measurement), measurement
    if policy is None:
        froms = {src for _, q in _all_queries() for src in FROM.findall(q)}
        assert froms <= {store.source(m) for m in schema.MEASUREMENTS}, froms


def test_raw_points_are_read_only_by_bounded_drill_downs():
    """The NOC, every overview panel and every alert rule read rollups; a query on raw points is
    bounded to the ranks of the chosen dp ranges (at most 16 EP groups)."""
    raw = [(w, q) for w, q in _all_queries() if any(f'"{m}"' in FROM.findall(q)[0] for m in RAW_MEASUREMENTS)]
    assert raw and all(w.startswith("heatmap panel") for w, _ in raw), [w for w, _ in raw]
    for where, q in raw:
        assert '"ep_group" =~ /^$dp$/' in q, where
    by_node, recent = [p for p in MODELS["heatmap"]["panels"] if p.get("rankscope", {}).get("rowTag") == "node"]
    # over hours: the 5-minute windows, never finer than they are, or their hours once a column is
    # an hour wide (one target answers, by the column width); the last 30 minutes: per iteration
    a, b = (t["query"] for t in by_node["targets"])
    assert f'"{LONG_POLICY}"."{schema.ROLLUP_HOST_WINDOW}"' in a and "$__interval_ms < 3600000 AND" in a
    assert f'"{LONG_POLICY}"."{schema.ROLLUP_HOST_HOUR}"' in b and "$__interval_ms >= 3600000 AND" in b
    assert by_node["interval"] == "5m" and not by_node.get("timeFrom")
    assert f'"{LONG_POLICY}"."{schema.ROLLUP_HOST}"' in recent["targets"][0]["query"]
    assert recent["timeFrom"] == "30m"
    # few enough columns that the answer over hours stays small: rows x columns within the budget
    assert by_node["rankscope"]["maxRows"] * by_node["maxDataPoints"] <= HEATMAP_MAX_CELLS
    # as Grafana asks over the ranges a wall shows (up to a day): its rounding adds a quarter at most
    for hours in (1, 2, 3, 6, 12, 24):
        tr = TimeRange(0, hours * 3_600_000)
        columns = -(-tr.end_ms // panel_interval_ms(tr, by_node["maxDataPoints"], by_node["interval"])) + 1
        assert by_node["rankscope"]["maxRows"] * columns <= 1.25 * HEATMAP_MAX_CELLS, hours
    assert recent["rankscope"]["maxRows"] * recent["maxDataPoints"] <= HEATMAP_RECENT_MAX_CELLS
    assert recent["maxDataPoints"] <= 30   # a column a minute at most: its range is 30 minutes


# ---------------------------------------------------------------------- alert routing
NOTIFICATIONS = _provisioned("alerting/notifications.yaml")


def _route(node: dict, labels: dict[str, str]) -> list[tuple[str, dict]]:
    """Alertmanager's routing of one alert: (receiver, effective settings) of every route that
    takes it (the deepest matching one; siblings after a match only with continue)."""
    def matches(route: dict) -> bool:
        for label, op, value in route.get("object_matchers", []):
            have = labels.get(label, "")
            ok = {"=": have == value, "!=": have != value,
                  "=~": re.fullmatch(value, have) is not None, "!~": re.fullmatch(value, have) is None}[op]
            if not ok:
                return False
        return True

    def walk(route: dict, inherited: dict) -> list[tuple[str, dict]]:
        settings = {**inherited, **{k: route[k] for k in ("receiver", "group_by", "group_wait",
                                                          "group_interval", "repeat_interval") if k in route}}
        taken: list[tuple[str, dict]] = []
        for child in route.get("routes", []):
            if matches(child):
                taken += walk(child, settings)
                if not child.get("continue"):
                    break
        return taken or [(settings["receiver"], settings)]

    return walk(node, {})


def test_contact_points_are_webhooks_whose_addresses_and_secrets_come_from_the_environment():
    assert NOTIFICATIONS["apiVersion"] == 1
    points = NOTIFICATIONS["contactPoints"]
    uids = [r["uid"] for p in points for r in p["receivers"]]
    assert len(uids) == len(set(uids)) and all(len(u) <= 40 for u in uids)
    for p in points:
        assert p["orgId"] == 1 and p["name"]
        for r in p["receivers"]:
            assert r["type"] == "webhook" and re.fullmatch(r"\$\{[A-Z_]+\}", r["settings"]["url"])
            assert all(re.fullmatch(r"\$\{[A-Z_]+\}|POST|Bearer", str(v)) for v in r["settings"].values())
    events = next(p for p in points if p["name"] == "rankscope-events")["receivers"][0]["settings"]
    assert events["authorization_credentials"] == "${RANKSCOPE_EVENTS_TOKEN}"   # the receiver requires it


def test_every_route_sends_to_a_provisioned_contact_point_and_matches_real_labels():
    (policy,) = NOTIFICATIONS["policies"]
    names = {p["name"] for p in NOTIFICATIONS["contactPoints"]}

    def routes(node):
        yield node
        for child in node.get("routes", []):
            yield from routes(child)

    rules = [r for grp in rankscope_alert_groups() for r in grp.rules]
    labels_of_rules = {"severity", "source", "alertname"} | {
        t for r in rules for t in re.findall(r'"(\w+)"', r.query.query.split("GROUP BY")[-1])}
    for node in routes(policy):
        assert node["receiver"] in names
        for label, op, _ in node.get("object_matchers", []):
            assert op in ("=", "!=", "=~", "!~") and label in labels_of_rules, (label, op)
    for r in rules:   # grouping by job needs every rule to label its alerts with the job
        assert '"job"' in r.query.query.split("GROUP BY")[-1], r.uid


@pytest.mark.parametrize("labels,receivers,repeat,group_by", [
    ({"source": "rankscope", "severity": "critical", "class": "compute_straggler", "job": "il-0477",
      "host": "gpu-node-01294", "id": "cs-30-r10352"}, ["rankscope-noc"], "1h", ["job"]),
    ({"source": "rankscope", "severity": "critical", "class": "transient_stall", "job": "j"},
     ["rankscope-noc"], "12h", ["job"]),
    ({"source": "rankscope", "severity": "critical", "job": "j", "node": "1294", "stage": "mlp"},
     ["rankscope-noc"], "1h", ["job"]),
    ({"source": "rankscope", "severity": "warning", "job": "j", "stage": "mlp"}, ["rankscope-noc"], "4h", ["job"]),
    # another monitor's alert: to the events receiver (the analyzer judges it) and to the NOC
    ({"alertname": "server port down", "instance": "gpu-node-01294:9100", "severity": "warning"},
     ["rankscope-events", "rankscope-noc"], None, None),
])
def test_notification_policy_routes_by_source_class_and_severity_grouped_by_job(labels, receivers, repeat, group_by):
    (policy,) = NOTIFICATIONS["policies"]
    taken = _route(policy, labels)
    assert [r for r, _ in taken] == receivers
    if repeat:
        (_, settings), = taken
        assert settings["repeat_interval"] == repeat and settings["group_by"] == group_by
        assert settings["group_wait"] in ("30s", "2m", "5m")
    else:   # rankscope's own alerts never reach the events receiver (an incident confirming itself)
        assert all(r != "rankscope-events" for r, _ in _route(policy, {"source": "rankscope", "job": "j"}))


def test_a_route_to_an_unknown_contact_point_or_operator_is_refused():
    with pytest.raises(ValueError, match="unknown operator"):
        Route("rankscope-noc", matchers=(("class", "==", "x"),))
    from dashboards import routing

    bad = Route("nobody")
    original = routing.notification_policy
    routing.notification_policy = lambda: bad
    try:
        with pytest.raises(ValueError, match="unknown contact point"):
            routing.notification_document()
    finally:
        routing.notification_policy = original


def test_every_alert_links_to_the_incident_drill_down_with_its_variables_set():
    rules = {r["uid"]: r for grp in _provisioned("alerting/rankscope.yaml")["groups"] for r in grp["rules"]}
    for uid, r in rules.items():
        link = r["annotations"]["dashboard"]
        assert link.startswith("/d/rankscope-incident?var-job={{ $labels.job }}"), uid
        group_by = set(re.findall(r'"(\w+)"', r["data"][0]["model"]["query"].split("GROUP BY")[-1]))
        for text in r["annotations"].values():   # every label a template names is one the query groups by
            assert set(re.findall(r"\$labels\.(\w+)", text)) <= group_by, (uid, text)
    assert rules["rankscope-incident-open"]["annotations"]["dashboard"] == (
        "/d/rankscope-incident?var-job={{ $labels.job }}&var-incident={{ $labels.id }}")
    assert rules["rankscope-l2-culprit-node"]["annotations"]["view"] == (
        "/d/rankscope-heatmap?var-job={{ $labels.job }}&var-stage={{ $labels.stage }}")
    incident_by = rules["rankscope-incident-open"]["data"][0]["model"]["query"].split("GROUP BY")[-1]
    assert all(f'"{label}"' in incident_by for label in ("job", "class", "host"))   # labels for routing

