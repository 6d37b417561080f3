"""L2 view: how uneven each parallel group is, per stage.

The coefficient of variation (CV) of a stage across a group's ranks, the
transfer floor of the collectives (the fastest member's time, i.e. the
transfer itself; the rest of a member's time is waiting), and the groups the
analyzer flagged as over its threshold.
"""

from __future__ import annotations

from grafanalib import core as g

from dashboards.panels import (
    DashboardSpec,
    Layout,
    dashboard_link,
    query_variable,
    source,
    table,
    target,
    timeseries,
)
from dashboards.variables import job_variable
from rankscope import schema

UID = "rankscope-l2"
L2_GROUP = source(schema.L2_GROUP)
L2_KIND = source(schema.L2_KIND)
#: CV above which the analyzer flags a group (IL-0477: the culprits' group had CV > 0.8).
CV_THRESHOLD = 0.8


def group_type_variable() -> g.Template:
    return query_variable("group_type", "group type",
                          f"SHOW TAG VALUES FROM {L2_KIND} WITH KEY = \"group_type\" WHERE \"job\" = '$job'",
                          multi=True, include_all=True, default="All", sort=1)


def spec() -> DashboardSpec:
    lay = Layout()
    where = "\"job\" = '$job' AND \"group_type\" =~ /^$group_type$/ AND $timeFilter"
    cv = timeseries(
        "Worst group CV per stage",
        [target(f"SELECT max(\"cv_max\") FROM {L2_KIND} WHERE {where} "
                f"GROUP BY time($__interval), \"group_type\", \"stage\" fill(none)",
                alias="$tag_group_type $tag_stage")],
        lay.place(16, 10), unit="none",
        thresholdsStyleMode="line", thresholds=[{"color": "green", "value": None},
                                                {"color": "red", "value": CV_THRESHOLD}],
        description=f"Highest CV over the groups of each kind; the red line is the analyzer's "
                    f"threshold ({CV_THRESHOLD}). A compute stage above it names a straggler.")
    flagged_count = table(
        "Groups over threshold, by stage",
        [target(f"SELECT count(\"cv_max\") AS \"windows\", max(\"anomalous\") AS \"groups\", "
                f"max(\"cv_max\") AS \"max cv\" FROM {L2_KIND} "
                f"WHERE {where} AND \"anomalous\" > 0 GROUP BY \"group_type\", \"stage\"", table=True)],
        lay.place(8, 10), sort_by="max cv",
        description="Per kind and stage: the windows with a group over the threshold, the most groups over "
                    "it at once, and the highest CV.")
    lay.newline()
    comm = "|".join(schema.DEFAULT_STAGES.of_kind("comm"))
    floor = timeseries(
        "Transfer floor of the collectives (fastest member) and the median member",
        [target(f"SELECT min(\"floor\") AS \"floor\", median(\"median\") AS \"median\" FROM {L2_KIND} "
                f"WHERE \"job\" = '$job' AND \"stage\" =~ /^({comm})$/ AND $timeFilter "
                f"GROUP BY time($__interval), \"stage\" fill(none)", alias="$tag_stage $col")],
        lay.place(24, 10), unit="ms",
        description="A collective ends when its last member arrives, so a member's time = transfer + "
                    "waiting. The fastest member of a group (the floor) measures the transfer; the median "
                    "minus the floor is waiting, which grows when a straggler holds the group. A floor "
                    "that rises is the link itself.")
    lay.newline()
    groups = table(
        "Groups over threshold",
        [target(f"SELECT last(\"cv\") AS \"cv\", last(\"median\") AS \"median ms\", last(\"max\") AS \"max ms\", "
                f"last(\"size\") AS \"size\" FROM {L2_GROUP} WHERE {where} AND \"anomalous\" = 1 "
                f"GROUP BY \"group_type\", \"group_id\", \"stage\"", table=True)],
        lay.place(24, 10), sort_by="cv",
        description="Latest statistics of every group and stage the analyzer flagged in the time range (the "
                    "analyzer writes the groups of highest CV per kind and stage, and those of the ranks it "
                    "reports; the charts above summarise all groups).")
    return DashboardSpec(
        uid=UID, title="rankscope / L2 parallel groups",
        description="Per-group, per-stage spread (CV), collective transfer floors, flagged groups.",
        panels=[cv, flagged_count, floor, groups],
        variables=[job_variable(), group_type_variable()],
        time_from="now-3h", refresh="1m",
        links=[dashboard_link("NOC overview", "rankscope-noc", include_vars=False),
               dashboard_link("Rank x stage heatmap", "rankscope-heatmap")],
    )
