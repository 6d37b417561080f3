"""Template variables the rankscope dashboards share (job, stage, pp, dp range, incident).

Their queries are InfluxQL metadata or SELECT queries on the schema's
measurements, run by Grafana on the rankscope data source. They read the rollups
and the analyzer's outputs (kept long), so a dashboard over an old time range
still lists its jobs, stages and pipeline stages after the raw points expired.
"""

from __future__ import annotations

from grafanalib import core as g

from dashboards.panels import Choice, custom_variable, query_variable, source
from rankscope import schema
from rankscope.topology import Topology

#: The reference job (IL-0477): TP=1, PP=9, DP=1440, EP=32, 8 GPUs per node.
IL0477_TOPOLOGY = Topology(tp=1, pp=9, dp=1440, ep=32, gpus_per_node=8)
#: The EP group of the IL-0477 culprits (pp=7, dp=256-287) and its neighbours.
IL0477_DEFAULT_EP_GROUPS = (322, 323, 324)

ROLLUP_HOST = source(schema.ROLLUP_HOST)
ROLLUP_JOB = source(schema.ROLLUP_JOB)
#: Fields of rollup_host that are not a stage's mean (hidden from the stage picker): the
#: iteration counters, the reporting count and every ``<stage>_max``.
NOT_STAGES = f"/^(?!({schema.ITERATION_FIELD}|{schema.ITERATION_MS_FIELD}|ranks)$)(?!.*_max$)/"


def job_variable(multi: bool = False) -> g.Template:
    """Jobs the analyzer rolled up."""
    return query_variable("job", "job", f'SHOW TAG VALUES FROM {ROLLUP_JOB} WITH KEY = "job"',
                          multi=multi, include_all=multi, default="All" if multi else None,
                          sort=1)


def stage_variable(default: str = "mlp") -> g.Template:
    """The stages of the rollups (the same names as the stage fields of stage_latency)."""
    return query_variable("stage", "stage", f"SHOW FIELD KEYS FROM {ROLLUP_HOST}",
                          regex=NOT_STAGES, default=default, sort=0)


def pp_variable() -> g.Template:
    """Pipeline stages of the job (multi-select, All by default)."""
    return query_variable("pp", "pp", f"SHOW TAG VALUES FROM {ROLLUP_HOST} WITH KEY = \"pp\" "
                                      f"WHERE \"job\" = '$job'",
                          multi=True, include_all=True, default="All")


def dp_range_variable(topology: Topology = IL0477_TOPOLOGY,
                      default: tuple[int, ...] = IL0477_DEFAULT_EP_GROUPS) -> g.Template:
    """dp ranges to drill into, one option per EP-sized block of a pipeline stage.

    An option reads ``pp7 dp 256-287``; its value is the id of the EP group
    that covers those ranks (``ep_group`` tag of stage_latency), so a query
    selects the ranks by tag equality and the row count stays ``ep`` per option.
    """
    per_pp = topology.ep_groups_per_dp
    choices = []
    for gid in range(topology.group_count("ep")):
        pp, block = divmod(gid, per_pp)
        lo = block * topology.ep
        choices.append(Choice(f"pp{pp} dp {lo}-{lo + topology.ep - 1}", str(gid)))
    return custom_variable("dp", "dp range", choices, [str(d) for d in default], multi=True)


def incident_variable() -> g.Template:
    """Incidents of the job, newest id last."""
    return query_variable("incident", "incident",
                          f"SHOW TAG VALUES FROM {source(schema.INCIDENT)} WITH KEY = \"id\" WHERE \"job\" = '$job'",
                          sort=1)


def incident_field_variable(name: str, label: str, field: str, regex: str | None = None) -> g.Template:
    """A hidden variable holding one field of the chosen incident (for the queries below it)."""
    return query_variable(name, label,
                          f"SELECT \"{field}\" FROM {source(schema.INCIDENT)} WHERE \"job\" = '$job' "
                          f"AND \"id\" = '$incident'",
                          regex=regex, hide=g.HIDE_VARIABLE, sort=0)
