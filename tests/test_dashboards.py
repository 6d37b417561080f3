"""Structure of the generated dashboards and provisioning files (no Grafana needed)."""

from __future__ import annotations

import itertools
import re

import pytest
import yaml

from dashboards import provisioning
from dashboards.alerts import AlertRule, InfluxQuery, Reduce, Threshold
from dashboards.panels import GRID_COLUMNS, HEATMAP_MAX_ROWS, Layout, rows_heatmap
from dashboards.provisioning import dump_yaml
from dashboards.variables import IL0477_TOPOLOGY
from rankscope.cli import main

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
        assert ref.get("type") == "influxdb"


def test_alert_rules_use_the_provisioned_datasource_or_expressions():
    doc = _provisioned("alerting/rankscope.yaml")
    uids = [step["datasourceUid"] for grp in doc["groups"] for rule in grp["rules"] for step in rule["data"]]
    assert set(uids) <= DATASOURCE_UIDS | {"__expr__"} and DATASOURCE_UIDS & set(uids)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_queries_are_raw_influxql_with_grafana_macros(name):
    for p in MODELS[name]["panels"]:
        for t in p.get("targets", []):
            q = t["query"]
            assert t["rawQuery"] is True and q.startswith("SELECT "), (p["title"], q)
            if "GROUP BY time(" in q:
                assert "GROUP BY time($__interval)" in q and "$timeFilter" in q, q
            assert "now()" in q or "$timeFilter" in q or "\"id\" = '$incident'" in q, q


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
        (target,) = p["targets"]
        tag = p["rankscope"]["rowTag"]
        assert tag in ("rank", "node") and target["alias"] == f"$tag_{tag}"
        assert re.search(rf'GROUP BY time\(\$__interval\), "{tag}"', target["query"])
        assert p["rankscope"]["maxRows"] <= HEATMAP_MAX_ROWS
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
    (ds,) = _provisioned("datasources/rankscope.yaml")["datasources"]
    assert ds["type"] == "influxdb" and ds["uid"] == "rankscope-influxdb"
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
                                         "rankscope-l2-culprit-node", "rankscope-incident-open"}
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
