"""Grafana alert rules as typed records, written in Grafana's file-provisioning format.

grafanalib's ``AlertRulev9`` writes the ruler-API shape (the rule nested under
``grafana_alert``), which file provisioning rejects, and it has no threshold
expression; so the rules are modelled here and written as the file format
expects: ``apiVersion: 1``, ``groups`` (orgId, name, folder, interval) and
rules (uid, title, condition, for, noDataState, execErrState, labels,
annotations, data = the InfluxQL query on the pinned data source uid, then
``__expr__`` reduce and threshold steps).

Annotations may use Grafana's alert templates (``{{ $labels.node }}``): Grafana
does not interpolate environment variables in annotations; labels are
interpolated, so they hold no ``$``. An alert's labels are its query's GROUP BY
tags (job, host, class, ...) plus ``severity`` and ``source``; the notification
policy (:mod:`dashboards.routing`) routes on them. Every rule reads the
rollups and the analyzer's outputs, never raw points, and links to the
incident drill-down with its variables set (annotation ``dashboard``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dashboards.panels import DATASOURCE_UID, source
from rankscope import schema

EXPR_UID = "__expr__"
FOLDER = "rankscope"
#: Where every alert links, with its variables set: the incident drill-down.
INCIDENT_DASHBOARD = "rankscope-incident"
#: The label every rankscope alert carries (the notification policy routes on it).
SOURCE = "rankscope"
Reducer = Literal["last", "max", "min", "mean", "sum", "count"]
Comparison = Literal["gt", "lt"]


@dataclass(frozen=True)
class InfluxQuery:
    """An InfluxQL query evaluated over the ``from_s`` seconds before evaluation time."""

    ref_id: str
    query: str
    from_s: int
    to_s: int = 0

    def to_data(self) -> dict:
        return {
            "refId": self.ref_id,
            "relativeTimeRange": {"from": self.from_s, "to": self.to_s},
            "datasourceUid": DATASOURCE_UID,
            "model": {"refId": self.ref_id, "query": " ".join(self.query.split()), "rawQuery": True,
                      "resultFormat": "time_series", "intervalMs": 1000, "maxDataPoints": 43200},
        }


@dataclass(frozen=True)
class Reduce:
    """Reduce each series of ``expression`` to one number (NaN/null dropped)."""

    ref_id: str
    expression: str
    reducer: Reducer = "last"

    def to_data(self) -> dict:
        return {
            "refId": self.ref_id,
            "relativeTimeRange": {"from": 0, "to": 0},
            "datasourceUid": EXPR_UID,
            "model": {"refId": self.ref_id, "type": "reduce", "expression": self.expression,
                      "reducer": self.reducer, "settings": {"mode": "dropNN"},
                      "datasource": {"type": EXPR_UID, "uid": EXPR_UID}},
        }


@dataclass(frozen=True)
class Threshold:
    """Fire where ``expression`` is above (``gt``) or below (``lt``) ``value``."""

    ref_id: str
    expression: str
    op: Comparison
    value: float

    def to_data(self) -> dict:
        return {
            "refId": self.ref_id,
            "relativeTimeRange": {"from": 0, "to": 0},
            "datasourceUid": EXPR_UID,
            "model": {"refId": self.ref_id, "type": "threshold", "expression": self.expression,
                      "conditions": [{"evaluator": {"type": self.op, "params": [self.value]}}],
                      "datasource": {"type": EXPR_UID, "uid": EXPR_UID}},
        }


@dataclass(frozen=True)
class AlertRule:
    """One rule: a query, its reduction, a threshold; what the on-call engineer reads."""

    uid: str
    title: str
    query: InfluxQuery
    reduce: Reduce
    threshold: Threshold
    summary: str
    description: str
    pending: str = "1m"
    severity: str = "warning"
    dashboard_uid: str | None = None
    no_data: Literal["OK", "NoData", "Alerting"] = "OK"
    #: Variables the link to ``dashboard_uid`` sets from the alert's labels: (variable, label).
    link_vars: tuple[tuple[str, str], ...] = (("job", "job"),)
    #: The label holding the incident id, when the alert names one (the drill-down opens it).
    incident_label: str | None = None

    def __post_init__(self) -> None:
        refs = [self.query.ref_id, self.reduce.ref_id, self.threshold.ref_id]
        if len(set(refs)) != 3:
            raise ValueError(f"alert rule {self.uid}: refIds must differ, got {refs}")
        if self.reduce.expression != self.query.ref_id or self.threshold.expression != self.reduce.ref_id:
            raise ValueError(f"alert rule {self.uid}: steps must chain query -> reduce -> threshold")
        if len(self.uid) > 40:
            raise ValueError(f"alert rule uid {self.uid!r} is longer than Grafana's 40 characters")

    @staticmethod
    def link(uid: str, variables: tuple[tuple[str, str], ...]) -> str:
        """``/d/<uid>?var-job={{ $labels.job }}&...``: a dashboard with the alert's variables set."""
        query = "&".join(f"var-{var}={{{{ $labels.{label} }}}}" for var, label in variables)
        return f"/d/{uid}?{query}" if query else f"/d/{uid}"

    def to_provisioning(self) -> dict:
        # Plain links: Grafana's __dashboardUid__ would also require a __panelId__.
        drill = (("job", "job"),) + ((("incident", self.incident_label),) if self.incident_label else ())
        annotations = {"summary": self.summary, "description": self.description,
                       "dashboard": self.link(INCIDENT_DASHBOARD, drill)}
        if self.dashboard_uid and self.dashboard_uid != INCIDENT_DASHBOARD:
            annotations["view"] = self.link(self.dashboard_uid, self.link_vars)
        return {
            "uid": self.uid,
            "title": self.title,
            "condition": self.threshold.ref_id,
            "data": [self.query.to_data(), self.reduce.to_data(), self.threshold.to_data()],
            "noDataState": self.no_data,
            "execErrState": "Error",
            "for": self.pending,
            "annotations": annotations,
            "labels": {"severity": self.severity, "source": SOURCE},
            "isPaused": False,
        }


@dataclass(frozen=True)
class AlertGroup:
    """Rules evaluated together every ``interval``."""

    name: str
    interval: str
    rules: list[AlertRule] = field(default_factory=list)
    folder: str = FOLDER
    org_id: int = 1

    def to_provisioning(self) -> dict:
        uids = [r.uid for r in self.rules]
        if len(set(uids)) != len(uids):
            raise ValueError(f"alert group {self.name}: duplicate rule uid")
        return {"orgId": self.org_id, "name": self.name, "folder": self.folder,
                "interval": self.interval, "rules": [r.to_provisioning() for r in self.rules]}


def provisioning_document(groups: list[AlertGroup]) -> dict:
    """The whole alerting provisioning file (apiVersion 1)."""
    return {"apiVersion": 1, "groups": [grp.to_provisioning() for grp in groups]}


# ---------------------------------------------------------------- the rules
#: L1: iteration time after / before a change point that pages.
L1_STEP_RATIO = 1.2
#: L2: a rank this many times its group median in a stage is a straggler.
L2_RANK_RATIO = 3.0


def rankscope_alert_groups() -> list[AlertGroup]:
    """The rules rankscope provisions: L1 step change, L2 group CV, L2 culprit rank, open incident,
    L3 kernel finding (a warning)."""
    l1 = AlertRule(
        uid="rankscope-l1-step",
        title="L1: iteration time stepped up",
        query=InfluxQuery("A", f"SELECT max(\"after_ms\") / max(\"before_ms\") FROM {source(schema.L1_CHANGEPOINT)} "
                               "WHERE \"scope\" = 'job' AND \"kind\" = 'step' AND $timeFilter GROUP BY \"job\"",
                          from_s=3600),
        reduce=Reduce("B", "A", "max"), threshold=Threshold("C", "B", "gt", L1_STEP_RATIO),
        summary="Job {{ $labels.job }}: iteration time is {{ humanize $values.B.Value }}x what it was",
        description="L1 found a step change of the job's median iteration time in the last hour. "
                    "Open the NOC overview for the job, then the incident drill-down: the analyzer names "
                    "the culprit node, stage and ratio once L2 confirms it. Do not act on out-of-band "
                    "network events before checking which stages slowed down.",
        severity="warning", dashboard_uid="rankscope-noc")
    cv = AlertRule(
        uid="rankscope-l2-group-cv",
        title="L2: parallel group uneven (flagged by the analyzer)",
        # the analyzer's verdict (its cv_threshold), not a threshold of its own: any flagged
        # group's CV is above zero, and the summary shows it
        query=InfluxQuery("A", f"SELECT max(\"cv\") FROM {source(schema.L2_GROUP)} WHERE \"anomalous\" = 1 "
                               "AND $timeFilter GROUP BY \"job\", \"group_type\", \"stage\"", from_s=600),
        reduce=Reduce("B", "A", "max"), threshold=Threshold("C", "B", "gt", 0),
        summary="Job {{ $labels.job }}: {{ $labels.stage }} varies across a {{ $labels.group_type }} group "
                "(CV {{ humanize $values.B.Value }})",
        description="Some ranks of one {{ $labels.group_type }} group take much longer in stage "
                    "{{ $labels.stage }} than the others. A compute stage (attention, mlp, optimizer) "
                    "points at the slow ranks' own hardware; a collective points at the link or at a "
                    "member arriving late. See the L2 dashboard's 'Groups over threshold' table.",
        severity="warning", dashboard_uid="rankscope-l2", link_vars=(("job", "job"), ("group_type", "group_type")))
    rank = AlertRule(
        uid="rankscope-l2-culprit-node",
        title="L2: node far slower than its group",
        query=InfluxQuery("A", f"SELECT max(\"ratio\") FROM {source(schema.L2_RANK)} WHERE $timeFilter "
                               "GROUP BY \"job\", \"host\", \"node\", \"stage\"", from_s=600),
        reduce=Reduce("B", "A", "max"), threshold=Threshold("C", "B", "gt", L2_RANK_RATIO),
        summary="Job {{ $labels.job }}: host {{ $labels.host }} (node {{ $labels.node }}) is "
                "{{ humanize $values.B.Value }}x its group median in {{ $labels.stage }}",
        description="Ranks on host {{ $labels.host }} spend {{ humanize $values.B.Value }} times the group "
                    "median in {{ $labels.stage }}. If that stage is compute-only, the machine is degraded: "
                    "drain or replace {{ $labels.host }}; network repairs will not help.",
        severity="critical", dashboard_uid="rankscope-heatmap", link_vars=(("job", "job"), ("stage", "stage")))
    return [AlertGroup("rankscope fail-slow", "1m", [l1, cv, rank, _incident_rule(), _kernel_rule()]),
            AlertGroup("rankscope actions", "1m", [drained_not_recovered_rule()])]


#: Minutes a job rankscope drained may take to recover before the alert fires (a restart on a
#: new node takes a few minutes: scheduling, loading the checkpoint, warming up).
RECOVERY_DEADLINE_MIN = 30


def drained_not_recovered_rule(minutes: int = RECOVERY_DEADLINE_MIN) -> AlertRule:
    """A job whose culprit node rankscope drained, not back within 10% of the what-if ``minutes``
    later (the analyzer's ``awaiting_recovery_s``, by the wall clock: a job that hangs counts)."""
    return AlertRule(
        uid="rankscope-drained-not-recovered",
        title="A job rankscope drained has not recovered",
        query=InfluxQuery("A", f"SELECT last(\"awaiting_recovery_s\") / 60 FROM {source(schema.INCIDENT)} "
                               "WHERE $timeFilter GROUP BY \"job\", \"id\", \"class\"", from_s=30 * 86400),
        reduce=Reduce("B", "A", "last"), threshold=Threshold("C", "B", "gt", float(minutes)),
        summary="Job {{ $labels.job }}: not recovered {{ humanize $values.B.Value }} min after rankscope drained "
                "the culprit node of {{ $labels.id }}",
        description=f"rankscope drained the culprit node of incident {{{{ $labels.id }}}} ({{{{ $labels.class }}}}) "
                    f"more than {minutes} minutes ago and job {{{{ $labels.job }}}} is not back within 10% of "
                    "its what-if iteration time: it did not restart, restarted on the same machine, or the "
                    "verdict was wrong. Check the job's scheduler state and the incident drill-down; the "
                    "NOC's actions table shows what was done.",
        severity="critical", dashboard_uid=INCIDENT_DASHBOARD, pending="0s", incident_label="id")


def _incident_rule() -> AlertRule:
    """Any open incident, one alert per culprit host (critical: the page)."""
    # fires on any open incident: counts its points (a silent-rank incident has ratio 0)
    return AlertRule(
        uid="rankscope-incident-open",
        title="Fail-slow incident open",
        query=InfluxQuery("A", f"SELECT count(\"onset_iteration\") FROM {source(schema.INCIDENT_HOST)} WHERE \"status\" = 'open' "
                               "AND $timeFilter GROUP BY \"job\", \"id\", \"class\", \"host\"", from_s=30 * 86400),
        reduce=Reduce("B", "A", "last"), threshold=Threshold("C", "B", "gt", 0),
        summary="Job {{ $labels.job }}: {{ $labels.class }} incident {{ $labels.id }} is open on host "
                "{{ $labels.host }}",
        description="The analyzer opened incident {{ $labels.id }} ({{ $labels.class }}) on job "
                    "{{ $labels.job }}; host {{ $labels.host }} holds culprit ranks (one alert per culprit "
                    "host, grouped per job). Its record names the culprit ranks, stage, ratio and cost, "
                    "its verdict on each out-of-band event, and what the culprit GPUs' own telemetry says "
                    "(hardware_verdict: hardware_fault and why, e.g. GPU thermal throttling, or "
                    "no_hardware_signal: look at software, data, the host). Drain or replace {{ $labels.host }} when the "
                    "class is a compute fault; do not repair the network on the strength of a port event "
                    "the record contradicts.",
        severity="critical", dashboard_uid=INCIDENT_DASHBOARD, pending="0s", incident_label="id")


def _kernel_rule() -> AlertRule:
    """A confirmed L3 kernel finding (a warning: it costs nothing yet)."""
    return AlertRule(
        uid="rankscope-l3-kernel",
        title="L3: a kernel slower on some ranks than in their group (confirmed)",
        query=InfluxQuery("A", f"SELECT max(\"ratio\") FROM {source(schema.L3_KERNEL)} WHERE \"confirmed\" = 1 "
                               "AND $timeFilter GROUP BY \"job\", \"host\", \"kernel\"", from_s=3600),
        reduce=Reduce("B", "A", "max"), threshold=Threshold("C", "B", "gt", 0),
        summary="Job {{ $labels.job }}: kernel {{ $labels.kernel }} on host {{ $labels.host }} runs "
                "{{ humanize $values.B.Value }}x its group's reference",
        description="The analyzer found kernel {{ $labels.kernel }} slower on ranks of host {{ $labels.host }} "
                    "than in the rest of their data-parallel group, two windows of profiled steps in a row. "
                    "The L3 dashboard names the kernel and its cause. Without an open incident it costs "
                    "nothing yet (hidden by overlap): plan the work, do not page. Cause own (a compute "
                    "kernel): the machine, drain {{ $labels.host }} at a convenient time; cause link (a "
                    "collective slow on all its group's members): the group's link, not the GPUs.",
        severity="warning", dashboard_uid="rankscope-kernels", link_vars=(("job", "job"),))
