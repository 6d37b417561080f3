"""Incident drill-down: one incident's evidence, its culprits against their group,
the out-of-band events and the analyzer's verdict on each.

Hidden variables read the chosen incident's fields (culprit node, stage, group)
so every panel below follows the incident picked at the top. The culprit node's
stages come from the per-host rollups (kept long), so an incident months old
still shows its evidence after the raw points expired.
"""

from __future__ import annotations

from dashboards.action_panels import action_annotation
from dashboards.panels import (
    PROMETHEUS,
    DashboardSpec,
    InfluxAnnotation,
    Layout,
    dashboard_link,
    prom_target,
    source,
    table,
    target,
    timeseries,
)
from dashboards.variables import incident_field_variable, incident_variable, job_variable
from rankscope import schema

UID = "rankscope-incident"
INCIDENT = source(schema.INCIDENT)
ROLLUP_HOST = source(schema.ROLLUP_HOST)
#: Grafana variable regexes that pick values out of an incident's text fields.
FIRST_NUMBER = "/^(\\d+)/"
EVIDENCE_GROUP_ID = '/"group"\\s*:\\s*\\{[^{}]*?"id"\\s*:\\s*(\\d+)/'
INCIDENT_WHERE = "\"job\" = '$job' AND \"id\" = '$incident'"
#: The first culprit host's first label (its short name): dcgm-exporter's ``Hostname`` is often
#: the short name where the job reports the full one, so the GPU panels match either.
FIRST_HOST_SHORT = "/^([^.,]+)/"
#: dcgm-exporter's series of the culprit host's GPUs, by short or full name.
CULPRIT_GPUS = 'Hostname=~"(?i)$culprit_host(\\\\..+)?"'


def _record(lay: Layout) -> list:
    return [table(
        "Incident record",
        [target("SELECT \"title\", \"class\", \"status\", \"hosts\", \"nodes\", \"ranks\", \"stage\", \"ratio\", "
                "\"hardware_verdict\", \"group_type\", \"group_ranks\", \"onset_iteration\", \"resolved_iteration\", \"slowdown\", "
                "\"gpu_hours_lost\", \"iteration_s_if_restored\", \"text\" "
                f"FROM {INCIDENT} WHERE {INCIDENT_WHERE}", table=True)],
        lay.place(24, 6),
        description="What the analyzer concluded: fault class, the hosts to drain, culprit ranks and node, "
                    "the stage and its ratio to the group median, the group, onset (and resolution) "
                    "iteration, and the cost: slowdown, GPU-hours lost, iteration time if restored.")]


def _culprit_node(lay: Layout) -> list:
    """The culprit node's stage against its group's median, and every stage of the node."""
    culprit_vs_group = timeseries(
        "$stage: culprit node $culprit_node against the $group_type groups' median",
        [target(f"SELECT mean(\"$stage\") AS \"culprit node $culprit_node\" FROM {ROLLUP_HOST} "
                "WHERE \"job\" = '$job' AND \"node\" = '$culprit_node' AND $timeFilter "
                "GROUP BY time($__interval) fill(none)", "A"),
         target(f"SELECT mean(\"median\") AS \"median over the groups\" FROM {source(schema.L2_KIND)} "
                "WHERE \"job\" = '$job' AND \"group_type\" = '$group_type' AND \"stage\" = '$stage' "
                "AND $timeFilter GROUP BY time($__interval) fill(none)", "B")],
        lay.place(12, 10), unit="ms",
        description="The culprits' time in the incident's stage next to the median of the groups of their "
                    "kind (every group's median, summarised per window: before the onset and after the "
                    "end too, when the analyzer writes no point of their own group).")
    stages = ", ".join(f"mean(\"{s}\") AS \"{s}\"" for s in schema.DEFAULT_STAGES.names)
    culprit_stages = timeseries(
        "Every stage of culprit node $culprit_node",
        [target(f"SELECT {stages} FROM {ROLLUP_HOST} WHERE \"job\" = '$job' AND \"node\" = '$culprit_node' "
                "AND $timeFilter GROUP BY time($__interval) fill(none)")],
        lay.place(12, 10), unit="ms",
        description="A compute-only stage that rises while the collectives do not is a compute fault; "
                    "a collective that rises alone points at the network.")
    return [culprit_vs_group, culprit_stages]


def _ratios_and_events(lay: Layout) -> list:
    """The culprit ranks' ratios per stage and the out-of-band events, side by side."""
    ratios = table(
        "Culprit ranks: ratio to group median per stage",
        [target("SELECT max(\"ratio\") AS \"ratio\", last(\"value\") AS \"ms\", last(\"baseline_ratio\") AS "
                f"\"baseline ratio\" FROM {source(schema.L2_RANK)} WHERE \"job\" = '$job' AND \"node\" = '$culprit_node' "
                "AND $timeFilter GROUP BY \"rank\", \"stage\"", table=True)],
        lay.place(12, 9), sort_by="ratio",
        description="Stages of the culprit node's ranks that the analyzer scored above its floor.")
    events = table(
        "Out-of-band events",
        [target(f"SELECT \"text\", \"rank\", \"value\" FROM {source(schema.EVENT)} WHERE \"job\" = '$job' "
                "AND $timeFilter GROUP BY \"name\", \"host\", \"node\", \"severity\", \"source\"", table=True)],
        lay.place(12, 9), sort_by="Time",
        description="Events from other monitors (e.g. 'server port down') during the time range.")
    return [ratios, events]


def _verdicts(lay: Layout) -> list:
    return [table(
        "Verdict on each event and the evidence",
        [target(f"SELECT \"events\", \"evidence\" FROM {INCIDENT} WHERE {INCIDENT_WHERE}", table=True)],
        lay.place(24, 8),
        overrides=[{"matcher": {"id": "byRegexp", "options": "/events|evidence/"},
                    "properties": [{"id": "custom.cellOptions", "value": {"type": "json-view"}}]}],
        description="The analyzer's verdict on every event near the incident: consistent with the "
                    "evidence or contradicted by it (e.g. a network event while only compute stages are slow).")]


def gpu_queries() -> dict[str, str]:
    """The PromQL of the culprit host's GPU panels, by title (also run by the tests against Prometheus)."""
    return {
        "SM clock": f"DCGM_FI_DEV_SM_CLOCK{{{CULPRIT_GPUS}}}",
        "temperature": f"DCGM_FI_DEV_GPU_TEMP{{{CULPRIT_GPUS}}}",
        "clock-event reasons (field 112)": f"max by (gpu) (DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{CULPRIT_GPUS}}} "
                                           f"or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{CULPRIT_GPUS}}})",
    }


def _gpus(lay: Layout) -> list:
    """The culprit host's GPUs from dcgm-exporter in Prometheus, beside the InfluxDB panels."""
    units = {"SM clock": "rotmhz", "temperature": "celsius", "clock-event reasons (field 112)": "none"}
    return [timeseries(
        f"GPUs of $culprit_host (DCGM): {title}", [prom_target(expr, "A", "GPU {{gpu}}")], lay.place(8, 8),
        unit=units[title], datasource=PROMETHEUS,
        description="The culprit host's GPUs as NVIDIA dcgm-exporter reports them (Prometheus data source). "
                    "The incident record's hardware_verdict says whether they set the host apart from its own "
                    "past and the job's other GPUs; field 112's bits: 0x4 SW power cap, 0x8 HW slowdown, "
                    "0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake.")
        for title, expr in gpu_queries().items()]


def _annotations() -> list[InfluxAnnotation]:
    return [
        InfluxAnnotation("Incident", f"SELECT \"title\", \"text\", \"tags\" FROM {INCIDENT} WHERE "
                                     f"{INCIDENT_WHERE} AND $timeFilter",
                         text_column="text", title_column="title", tags_column="tags", color="red"),
        InfluxAnnotation("Events", f"SELECT \"text\", \"host\" FROM {source(schema.EVENT)} WHERE \"job\" = '$job' "
                                   "AND $timeFilter", text_column="text", tags_column="host", color="purple"),
        InfluxAnnotation("L1 change points", f"SELECT \"text\" FROM {source(schema.L1_CHANGEPOINT)} WHERE \"job\" = '$job' "
                                             "AND \"scope\" = 'job' AND $timeFilter",
                         text_column="text", color="orange"),
        InfluxAnnotation("Restarts and job ends", f"SELECT \"text\", \"event\" FROM {source(schema.JOB_LIFECYCLE)} "
                                                  "WHERE \"job\" = '$job' AND $timeFilter",
                         text_column="text", tags_column="event", color="blue"),
        action_annotation("\"job\" = '$job'"),
    ]


def spec() -> DashboardSpec:
    lay = Layout()
    panels = _record(lay)
    for row in (_culprit_node, _gpus, _ratios_and_events, _verdicts):   # one row of the grid each
        lay.newline()
        panels += row(lay)
    return DashboardSpec(
        uid=UID, title="rankscope / incident drill-down",
        description="One incident: evidence, culprits against their group, events and their verdicts.",
        panels=panels,
        variables=[
            job_variable(), incident_variable(),
            incident_field_variable("culprit_node", "culprit node", "nodes", regex=FIRST_NUMBER),
            incident_field_variable("culprit_host", "culprit host", "hosts", regex=FIRST_HOST_SHORT),
            incident_field_variable("stage", "stage", "stage"),
            incident_field_variable("group_type", "group type", "group_type"),
            incident_field_variable("group_id", "group id", "evidence", regex=EVIDENCE_GROUP_ID),
        ],
        annotations=_annotations(),
        time_from="now-6h", refresh="1m",
        links=[dashboard_link("NOC overview", "rankscope-noc", include_vars=False),
               dashboard_link("Rank x stage heatmap", "rankscope-heatmap")],
    )
