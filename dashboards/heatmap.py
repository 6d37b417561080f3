"""Rank x stage heatmap: one stage, ranks (rows) over time (columns), as in IL-0477.

At 12,960 ranks a browser cannot draw one row per rank, so the overview
draws one row per node (8 ranks each: 1,620 rows) from the 5-minute windows
of the per-host rollups (``rollup_host_5m``: the mean over the node's ranks),
or from their hours (``rollup_host_1h``) once its columns are an hour or wider,
never the 12,960 raw series, and asks for few enough columns that the answer
stays small over hours; a second panel shows the last 30 minutes from the
per-iteration ``rollup_host``. Raw points are read only by the drill-down,
single ranks of the chosen dp ranges (an EP group of 32 ranks each), and by
the snapshot table of those ranks; the ratio heatmap shows the analyzer's
per-rank ratio to the group median (only ranks above its reporting floor).
"""

from __future__ import annotations

from dashboards.action_panels import action_annotation
from dashboards.panels import (
    HEATMAP_MAX_CELLS,
    HEATMAP_RECENT_MAX_CELLS,
    DashboardSpec,
    HeatmapColor,
    Layout,
    by_interval,
    dashboard_link,
    rows_heatmap,
    source,
    table,
    target,
)
from dashboards.variables import (
    IL0477_TOPOLOGY,
    dp_range_variable,
    job_variable,
    pp_variable,
    stage_variable,
)
from rankscope import schema
from rankscope.topology import Topology

UID = "rankscope-heatmap"
#: dp-range options a user may tick at once in the drill-down (rows = options x EP size).
MAX_DP_RANGES = 16


def _nodes(lay: Layout, topology: Topology) -> list:
    """Every node over hours (the 5-minute and hourly windows), then over the last 30 minutes."""
    hosts = "\"job\" = '$job' AND \"pp\" =~ /^$pp$/"
    where = f"{hosts} AND $timeFilter"
    cols = max(HEATMAP_MAX_CELLS // topology.nodes, 1)
    by_node = rows_heatmap(
        "$stage by node, all ranks (mean over the node's ranks, 5-minute or hourly windows)",
        by_interval(f"SELECT mean(\"$stage\") FROM {{source}} WHERE {{when}} AND {hosts} "
                    f"GROUP BY time($__interval), \"node\" fill(none)",
                    [(schema.ROLLUP_HOST_WINDOW, schema.ROLLUP_WINDOW_MS),
                     (schema.ROLLUP_HOST_HOUR, schema.ROLLUP_HOUR_MS)]),
        lay.place(24, 14), row_tag="node", max_rows=topology.nodes, max_points=cols, min_interval="5m",
        description=f"Rows are nodes ({topology.gpus_per_node} ranks each, {topology.nodes} at most), "
                    f"columns time. A bright row is a slow node; a dark band across many nodes is a "
                    f"collective that finished early because its members arrived late. Read from the "
                    f"5-minute windows of the per-host rollups, written when a window closes (the "
                    f"newest minutes are in the panel below), or from their hours once a column is an "
                    f"hour or wider (query B; A answers narrower columns): a wall over 6 h reads one "
                    f"point per node per column, a wall over 3 h four (20-minute columns). The first column holds the "
                    f"window or hour the range begins inside whole.")
    lay.newline()
    recent = rows_heatmap(
        "$stage by node, last 30 minutes (mean over the node's ranks)",
        f"SELECT mean(\"$stage\") FROM {source(schema.ROLLUP_HOST)} WHERE {where} "
        f"GROUP BY time($__interval), \"node\" fill(none)",
        lay.place(24, 10), row_tag="node", max_rows=topology.nodes, time_from="30m",
        max_points=min(max(HEATMAP_RECENT_MAX_CELLS // topology.nodes, 1), 30),
        description="The same rows over the last 30 minutes (while the dashboard shows a range up to "
                    "now; a zoomed range shows here whole), from the per-iteration host rollups: what "
                    "happened since the last 5-minute window closed.")
    return [by_node, recent]


def _ranks(lay: Layout, topology: Topology) -> list:
    """Single ranks of the chosen dp ranges (raw points): over time, then their latest values."""
    drill_where = "\"job\" = '$job' AND \"ep_group\" =~ /^$dp$/ AND $timeFilter"
    by_rank = rows_heatmap(
        "$stage by rank, dp ranges $dp",
        f"SELECT mean(\"$stage\") FROM {source(schema.STAGE_LATENCY)} WHERE {drill_where} "
        f"GROUP BY time($__interval), \"rank\" fill(none)",
        lay.place(24, 14), row_tag="rank", max_rows=MAX_DP_RANGES * topology.ep,
        description="Single ranks of the chosen dp ranges (pick them in 'dp range'; "
                    f"{topology.ep} rows each).")
    lay.newline()
    stage_cols = ", ".join(f"last(\"{s}\") AS \"{s}\"" for s in schema.DEFAULT_STAGES.names)
    snapshot = table(
        "Snapshot: rank x stage, latest window (dp ranges $dp)",
        [target(f"SELECT {stage_cols} FROM {source(schema.STAGE_LATENCY)} WHERE {drill_where} "
                f"GROUP BY \"rank\", \"node\", \"host\"",
                table=True)],
        lay.place(24, 12), sort_by="$stage",
        overrides=[{"matcher": {"id": "byRegexp", "options": "/" + "|".join(schema.DEFAULT_STAGES.names) + "/"},
                    "properties": [{"id": "custom.cellOptions", "value": {"type": "color-background",
                                                                          "mode": "gradient"}},
                                   {"id": "unit", "value": "ms"},
                                   {"id": "color", "value": {"mode": "continuous-BlYlRd"}}]}],
        description="Last value of every stage per rank; colour by value within each column.")
    return [by_rank, snapshot]


def _ratios(lay: Layout) -> list:
    return [rows_heatmap(
        "$stage: ratio to the group median (ranks over the analyzer's reporting floor)",
        f"SELECT max(\"ratio\") FROM {source(schema.L2_RANK)} WHERE \"job\" = '$job' AND \"stage\" = '$stage' "
        "AND $timeFilter GROUP BY time($__interval), \"rank\" fill(none)",
        lay.place(24, 10), row_tag="rank", max_rows=2000, unit="none",
        color=HeatmapColor(scheme="RdBu", scale="linear", min=0, max=6),
        description="1 = the group median. Above 1: slower than the group (a straggler); below 1: "
                    "finished early (waited less).")]


def spec(topology: Topology = IL0477_TOPOLOGY) -> DashboardSpec:
    lay = Layout()
    panels = _nodes(lay, topology)
    lay.newline()
    panels += _ranks(lay, topology)
    lay.newline()
    panels += _ratios(lay)
    return DashboardSpec(
        uid=UID, title="rankscope / rank x stage heatmap",
        description="Per-rank stage latency over time; node overview and single-rank drill-down.",
        panels=panels,
        variables=[job_variable(), stage_variable(), pp_variable(), dp_range_variable(topology)],
        annotations=[action_annotation("\"job\" = '$job'")],
        time_from="now-3h", refresh="1m",
        links=[dashboard_link("NOC overview", "rankscope-noc", include_vars=False),
               dashboard_link("Incident drill-down", "rankscope-incident")],
    )
