"""What rankscope did about its verdicts, and whether the job recovered: the ``action`` points as
annotations and a table, and the times to detect and recover per day and per fault class.

The annotations go on the job dashboards (heatmap, incident drill-down) and the NOC wall; the
table and the time panels on the NOC wall. Every query reads the ``action`` points the actor
wrote (actions/records.py: title, text and tags are Grafana's annotation fields) or the
``incident`` points' durations (``time_to_detect_s``, ``time_to_recover_s``; time = onset, so a
day's column holds the incidents that began that day).
"""

from __future__ import annotations

from dashboards.panels import InfluxAnnotation, Layout, source, table, target, timeseries
from rankscope import schema

ACTION = source(schema.ACTION)
INCIDENT = source(schema.INCIDENT)
#: The actions listed on the wall whatever its time range (a drain may be older than 6 h).
ACTION_WINDOW = "time > now() - 7d"


def action_annotation(job_where: str) -> InfluxAnnotation:
    """Every step of every action (planned, done, refused, failed, skipped) of the jobs ``job_where``."""
    return InfluxAnnotation("rankscope actions",
                            f"SELECT \"title\", \"text\", \"tags\" FROM {ACTION} WHERE {job_where} AND $timeFilter",
                            text_column="text", title_column="title", tags_column="tags", color="green")


def actions_table(lay: Layout, job_where: str):
    """The latest state of each action (one row per job, incident, node and verb)."""
    return table(
        "rankscope actions (latest state, 7 days)",
        [target(f"SELECT last(\"state\") AS \"state\", last(\"mode\") AS \"mode\", last(\"reason\") AS \"reason\", "
                f"last(\"host\") AS \"host\" FROM {ACTION} WHERE {job_where} AND {ACTION_WINDOW} "
                f"GROUP BY \"job\", \"incident\", \"node\", \"action\"", table=True)],
        lay.place(24, 7), sort_by="Time",
        description="What rankscope did or would do about each incident: drain (Slurm) or cordon "
                    "(Kubernetes) the culprit node, and its undo. planned: dry-run, or about to run; done; "
                    "refused: over the hourly budget or a bad name (a person must act); failed: the "
                    "scheduler did not answer (tried again with backoff); skipped: someone else drained "
                    "it, or an operator resumed it (left alone for good). Time = the latest step.")


def recovery_times(lay: Layout, job_where: str) -> list:
    """Time to detect and time to recover, per day and per fault class (mean over the incidents
    whose onset is in that day)."""
    def per_day(title: str, field: str, description: str):
        return timeseries(
            title,
            [target(f"SELECT mean(\"{field}\") AS \"mean\" FROM {INCIDENT} WHERE {job_where} AND "
                    f"\"{field}\" >= 0 AND $timeFilter GROUP BY time($__interval), \"class\" fill(none)",
                    alias="$tag_class")],
            lay.place(12, 8), unit="s", description=description, drawStyle="bars",
            interval="1d")   # the panel's minimum interval: one bar per day of onset (wider on long ranges)
    return [
        per_day("Time to detect, per day and class", "time_to_detect_s",
                "Onset (the first slow iteration) to the iteration at which the analyzer opened the "
                "incident; the mean per day of onset and per fault class."),
        per_day("Time to recover, per day and class", "time_to_recover_s",
                "Onset to the first iteration back within 10% of the what-if (not the moment the "
                "analyzer became sure), by a node swap, a drain and restart, or the fault's end; the "
                "mean per day of onset and per fault class. Incidents whose job ended slow have none."),
    ]
