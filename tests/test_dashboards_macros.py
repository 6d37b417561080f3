"""The Grafana macro emulation the query tests rely on (tests/grafana_macros.py)."""

from __future__ import annotations

import pytest

from tests.grafana_macros import (
    QueryResult,
    TimeRange,
    Variable,
    apply_variable_regex,
    dashboard_queries,
    format_interval,
    interpolate,
    metric_find_values,
    panel_interval_ms,
)

TR = TimeRange(1_700_000_000_000, 1_700_003_600_000)


def test_time_filter_and_interval_as_grafana_writes_them():
    q = interpolate("SELECT mean(x) FROM m WHERE $timeFilter GROUP BY time($__interval)", {}, TR, 10_000)
    assert q == ("SELECT mean(x) FROM m WHERE time >= 1700000000000ms and time <= 1700003600000ms "
                 "GROUP BY time(10s)")
    # 1 h over 240 points = 15 s raw -> Grafana rounds to 15s; at least the minimum interval
    assert panel_interval_ms(TR, 240) == 15_000
    assert panel_interval_ms(TR, 240, "30s") == 30_000
    assert [format_interval(ms) for ms in (500, 10_000, 60_000, 7_200_000)] == ["500ms", "10s", "1m", "2h"]


def test_a_panels_relative_time_override_applies_to_relative_ranges_only():
    """Grafana's applyPanelTimeOverrides: ``timeFrom`` replaces a relative range with now-timeFrom
    to now, and leaves an absolute one (a zoom) alone."""
    model = {"panels": [{"id": 1, "title": "recent", "timeFrom": "30m", "maxDataPoints": 30,
                         "targets": [{"refId": "A", "query": "SELECT x FROM m WHERE $timeFilter "
                                                             "GROUP BY time($__interval)"}]}],
             "annotations": {"list": []}}
    (rel,) = dashboard_queries(model, {}, TimeRange(TR.start_ms, TR.end_ms, relative=True))
    assert f"time >= {TR.end_ms - 1_800_000}ms and time <= {TR.end_ms}ms" in rel.query
    assert "time(1m)" in rel.query                  # 30 min over 30 points
    (absolute,) = dashboard_queries(model, {}, TR)
    assert f"time >= {TR.start_ms}ms and time <= {TR.end_ms}ms" in absolute.query
    assert "time(2m)" in absolute.query             # 1 h over 30 points


def test_variables_formatted_like_the_influxdb_data_source():
    v = {"pp": Variable("pp", ["0", "7"], multi=True, include_all=True),
         "job": Variable("job", "il-0477.a"),
         "dp": Variable("dp", ["323"], multi=True),
         "node": Variable("node", "1294")}
    q = interpolate("WHERE pp =~ /^$pp$/ AND job = '$job' AND j =~ /^$job$/ AND e =~ /^$dp$/ AND n = '${node}'",
                    v, TR, 1000)
    assert q == r"WHERE pp =~ /^(0|7)$/ AND job = 'il-0477.a' AND j =~ /^il-0477\.a$/ AND e =~ /^323$/ AND n = '1294'"


def test_unknown_variable_is_an_error():
    with pytest.raises(KeyError, match=r"\$nope"):
        interpolate("SELECT $nope", {}, TR, 1000)


def test_variable_query_results_parsed_and_filtered_like_grafana():
    fields = QueryResult("", [{"values": [["attention", "float"], ["iteration", "integer"], ["mlp", "float"]]}])
    assert metric_find_values("SHOW FIELD KEYS FROM x", fields) == ["attention", "iteration", "mlp"]
    tags = QueryResult("", [{"values": [["job", "a"], ["job", "b"]]}])
    assert metric_find_values('SHOW TAG VALUES WITH KEY = "job"', tags) == ["a", "b"]
    assert apply_variable_regex(["attention", "iteration", "iteration_ms", "mlp"],
                                "/^(?!(iteration|iteration_ms)$)/") == ["attention", "mlp"]
    assert apply_variable_regex(['{"group": {"type": "ep", "id": 323}}'],
                                '/"group"\\s*:\\s*\\{[^{}]*?"id"\\s*:\\s*(\\d+)/') == ["323"]
