"""The data model: stages, and the InfluxDB measurements rankscope reads and writes.

Documented for people in ``docs/schema.md``; this module is the single source of
truth that the collector, the analyzer and the dashboards import.

``stage_latency`` holds ONE point per rank per iteration (tags job, rank, pp, dp,
tp, ep_group, node and, where the collector knows them, host and gpu; one float
field per stage in milliseconds, plus ``iteration`` and ``iteration_ms``), so the
series cardinality equals the rank count rather than ranks x stages (a rank's
host and GPU do not change while it runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rankscope.stage_set import (  # noqa: F401 - the data model's names, from one place
    ATTEMPT_FIELD,
    COMM_GROUPS,
    GPU_UUID_FIELD,
    ITERATION_FIELD,
    ITERATION_MS_FIELD,
    RANK_TAGS,
    RESERVED_FIELDS,
    SEGMENT_COLUMN,
    STAGE_KINDS,
    SchemaError,
    Stage,
    StageKind,
    StageSet,
)

# ----------------------------------------------------------------- measurements
STAGE_LATENCY = "stage_latency"
EVENT = "event"
L1_CHANGEPOINT = "l1_changepoint"
L2_GROUP = "l2_group"
#: L2 over all of a group kind's groups, per stage: what a wall of a 100,000-rank job can draw.
L2_KIND = "l2_kind"
L2_RANK = "l2_rank"
INCIDENT = "incident"
#: Rollups the analyzer writes for the dashboards and alert rules (analyzer/write/rollups.py).
ROLLUP_HOST = "rollup_host"
ROLLUP_JOB = "rollup_job"
#: ``rollup_host`` over fixed windows of ``ROLLUP_WINDOW_MS`` (time = the window's start): what a
#: wall over hours reads, 10x fewer points than ``rollup_host`` at one iteration per 30 s.
ROLLUP_HOST_WINDOW = "rollup_host_5m"
ROLLUP_WINDOW_MS = 300_000
#: ``rollup_host_5m`` over hours (``ROLLUP_HOUR_MS``): what the per-node heatmap reads once its
#: columns are an hour or wider (a wall over 6 h, a day, a week), 12x fewer points again.
ROLLUP_HOST_HOUR = "rollup_host_1h"
ROLLUP_HOUR_MS = 3_600_000
INCIDENT_HOST = "incident_host"
JOB_HEALTH = "job_health"
#: L3: each rank's kernels per window of profiled steps, as modes (collector/kernel_channel.py),
#: their names once, and the analyzer's findings on them (analyzer/score/kernel_scores.py).
KERNEL_STATS = "kernel_stats"
KERNEL_NAME = "kernel_name"
L3_KERNEL = "l3_kernel"
#: A job's life as the analyzer saw it: restarts (iterations going back), jumps, its end.
JOB_LIFECYCLE = "job_lifecycle"
#: Each GPU's own telemetry beside its rank (collector/gpu_sampler.py, the simulator; rankscope/gpu_health.py).
GPU_HEALTH = "gpu_health"
#: What the actor (actions/) did on a verdict: every step of every drain and resume; and who may act.
ACTION = "action"
ACTION_LEASE = "action_lease"

#: The default stages of an MoE transformer iteration (IL-0477's job).
DEFAULT_STAGES = StageSet((
    Stage("attention", "compute", description="self-attention forward+backward"),
    Stage("mlp", "compute", description="expert / MLP compute (no communication)"),
    Stage("dispatch", "comm", "ep", "EP all-to-all sending tokens to experts"),
    Stage("combine", "comm", "ep", "EP all-to-all returning expert outputs"),
    Stage("pp_send", "comm", "pipeline", "pipeline p2p send to the next stage"),
    Stage("pp_recv", "comm", "pipeline", "pipeline p2p receive from the previous stage"),
    Stage("reduce_scatter", "comm", "dp", "DP gradient reduce-scatter"),
    Stage("expert_reduce", "comm", "edp", "expert gradient reduce-scatter over the expert-data-parallel "
                                          "group (the ranks holding the same experts)"),
    Stage("all_gather", "comm", "dp", "DP parameter all-gather"),
    Stage("optimizer", "compute", description="optimizer step"),
    Stage("dataloader", "host", description="host-side batch loading"),
))

#: The model-agnostic stages every GPU profiler trace yields, whatever its module names
#: (written by ``rankscope import-trace``): each kernel no named stage claims is classed as
#: communication (its name says NCCL), memory (a copy or a set) or computation, as
#: HolisticTraceAnalysis' temporal breakdown classes kernels, plus the time the GPU runs
#: nothing. So a straggler is found even in a trace whose modules no pattern names.
#:
#: - ``compute_other`` (compute): a slow value is the rank's own device being slow.
#: - ``comm_other`` (comm, group ``dp``): a kernel name does not say which group a collective
#:   ran in. ``dp`` because the collectives of an unannotated trace are mostly the data-parallel
#:   gradient sync (DDP all-reduce, FSDP reduce-scatter / all-gather), because the members of a
#:   DP group are replicas that run the same collectives (so their times compare, whatever the
#:   group really was), and because in ``import-trace``'s default pure-DP topology the DP group
#:   is the whole job.
#: - ``memcpy`` (compute): host<->device and device copies and memsets; a slow one is the rank's
#:   own PCIe / memory path, not a wait for its peers.
#: - ``host_idle`` (host): the time in the iteration when the GPU runs nothing (HTA's idle
#:   time): the device waits for its host (data loading, Python, launch overhead, CPU-side
#:   synchronisation); a collective's wait for a peer is kernel time, not idle time.
TRACE_STAGES = StageSet((
    Stage("compute_other", "compute", description="GPU time of computation kernels no named stage claims"),
    Stage("comm_other", "comm", "dp", "GPU time of communication kernels no named stage claims"),
    Stage("memcpy", "compute", description="GPU time of memory copies and memsets"),
    Stage("host_idle", "host", description="time in the iteration when the GPU runs nothing"),
))

#: The collectives of the tensor-parallel group (an inner group: on one node), where a job times
#: them: the simulator with tp > 1, ``import-nccl`` for the communicators of one host. Every member
#: waits there for the group's slowest, which waits least: the stage that names which member of
#: a group that looks slow from outside (all of it arrives late at the outer collectives) is slow.
TP_COMM = Stage("tp_comm", "comm", "tp", "TP all-reduces (and other collectives of an intra-node group), the "
                                       "wait for its slowest member included")

#: Every stage known without a ``[stages]`` declaration: the default set, the TP collectives, then
#: the trace set.
KNOWN_STAGES = StageSet(DEFAULT_STAGES.stages + (TP_COMM,) + TRACE_STAGES.stages)



@dataclass(frozen=True)
class Measurement:
    """Name, tags and fields of one measurement (fields with their type)."""

    name: str
    tags: tuple[str, ...]
    fields: Mapping[str, str]  # field -> "float" | "int" | "str"
    description: str = ""


#: Tags of the per-host rollups; fields of their windows (``rollup_host_5m``, ``rollup_host_1h``).
_HOST_TAGS = ("job", "host", "node", "pp")
_WINDOW_FIELDS = {ITERATION_FIELD: "int", "iterations": "int", "ranks": "int", ITERATION_MS_FIELD: "float",
                  "iteration_ms_max": "float", "<stage>": "float", "<stage>_max": "float"}

MEASUREMENTS: dict[str, Measurement] = {
    STAGE_LATENCY: Measurement(
        STAGE_LATENCY, RANK_TAGS,
        {ITERATION_FIELD: "int", ITERATION_MS_FIELD: "float", GPU_UUID_FIELD: "str", ATTEMPT_FIELD: "int",
         "<stage>": "float"},
        "one point per rank per iteration; one float field (ms) per stage",
    ),
    EVENT: Measurement(
        EVENT, ("job", "name", "host", "node", "severity", "source"),
        {"rank": "int", "text": "str", "value": "int", "status": "str", "ends_ms": "int"},
        "out-of-band events (e.g. 'server port down'); time = when it started; rank -1 when the "
        "event names no rank; job absent for cluster events (matched to jobs by host); status "
        "firing|resolved (a resolved notice rewrites the firing point, ends_ms when it ended)",
    ),
    L1_CHANGEPOINT: Measurement(
        L1_CHANGEPOINT, ("job", "scope", "rank", "kind"),
        {"iteration": "int", "before_ms": "float", "after_ms": "float", "magnitude": "float",
         "ranks_affected": "int", "recovered_iteration": "int", "text": "str"},
        "L1 spikes and steps of the iteration time; time = onset; scope 'job' (median over ranks, rank '-1') or 'rank'",
    ),
    L2_GROUP: Measurement(
        L2_GROUP, ("job", "group_type", "group_id", "stage"),
        {"cv": "float", "mean": "float", "median": "float", "min": "float", "max": "float",
         "std": "float", "size": "int", "anomalous": "int"},
        "per group and stage statistics over the analysis window, for the notable groups only (the "
        "l2_groups of highest CV per kind and stage, and the group and stage of each l2_rank point); "
        "time = window end",
    ),
    KERNEL_STATS: Measurement(
        KERNEL_STATS, RANK_TAGS, {ITERATION_FIELD: "int", "steps": "int", "events": "int", "gap_max_us": "float"},
        "one point per rank and window of profiled steps; besides iteration (the window's last step), "
        "steps, events and gap_max_us (the longest time the device ran none of them), per kernel id (k + 10 hex digits of its name's hash, or 'other' for the kernels "
        "past the top K) and mode j: <id>_m<j>_n (events, a float), <id>_m<j>_p50 and <id>_m<j>_p99 (us); "
        "where the steps are known <id>_step_us, its time per step (the 25th percentile over the window's steps of "
        "its events summed in each); "
        "time = the window's end",
    ),
    KERNEL_NAME: Measurement(
        KERNEL_NAME, ("job", "kernel"), {"name": "str", "kind": "str", "group": "str"},
        "a kernel id's name (cut to 512 characters), kind (compute|comm) and, where known, the group kind "
        "of its collective (tp|dp|ep|pipeline; empty: unknown, taken as dp); time = the hour first seen",
    ),
    L3_KERNEL: Measurement(
        L3_KERNEL, ("job", "rank", "kernel", "host"),
        {"name": "str", "kind": "str", "cause": "str", "w1_us": "float", "shift_us": "float",
         "ref_median_us": "float", "ratio": "float", "step_ratio": "float", "group_type": "str", "group_id": "int",
         "iteration": "int", "windows": "int", "confirmed": "int"},
        "ranks whose kernel distribution or time per step (step_ratio: over the group's median) stands out "
        "of their group's (L3); cause: own (compute), link (a "
        "collective slow on all its members, evenly) or wait (they waited for a late peer), or unknown; "
        "kernel launch_gap (cause host): the device idle far longer than the group's; windows: in a row, "
        "confirmed: 1 from 2 windows in a row (own and link only); time = the window's end",
    ),
    L2_KIND: Measurement(
        L2_KIND, ("job", "group_type", "stage"),
        {"groups": "int", "anomalous": "int", "cv_max": "float", "cv_median": "float", "floor": "float",
         "median": "float", "max": "float"},
        "per group kind and stage, over all its groups: how many, how many flagged, the worst and median CV, "
        "the fastest member (the transfer floor of a collective), the median of the groups' medians, the "
        "slowest member; time = window end",
    ),
    L2_RANK: Measurement(
        L2_RANK, ("job", "rank", "stage", "node", "host"),
        {"value": "float", "ratio": "float", "z": "float", "baseline_ratio": "float",
         "group_type": "str", "group_id": "int"},
        "per rank scores above the reporting floor only; time = window end",
    ),
    INCIDENT: Measurement(
        INCIDENT, ("job", "id", "class"),
        {"title": "str", "text": "str", "tags": "str", "status": "str", "ranks": "str",
         "nodes": "str", "hosts": "str", "stage": "str", "ratio": "float", "group_type": "str",
         "group_ranks": "str", "onset_iteration": "int", "resolved_iteration": "int",
         "events": "str", "evidence": "str", "updated_ms": "int", "episodes": "int",
         "first_onset": "int", "last_onset": "int", "iteration_s_before": "float",
         "iteration_s_now": "float", "slowdown": "float", "gpu_hours_lost": "float",
         "iteration_s_if_restored": "float", "host_record": "str", "gpus": "str", "hardware": "str",
         "hardware_verdict": "str", "timeline": "str", "recovery": "str", "time_to_detect_s": "float",
         "time_to_recover_s": "float", "awaiting_recovery_s": "float"},
        "one point per incident, time = onset, rewritten in place as it evolves (status open|resolved); "
        "impact fields: what the incident costs the job (see rankscope.incident.Impact); gpus, hardware, "
        "timeline, recovery: JSON records (see rankscope.incident.Incident); hardware_verdict: the GPU "
        "telemetry's verdict and phrase in words (hardware_fault: GPU thermal throttling; empty: not checked)",
    ),
    ROLLUP_HOST: Measurement(
        ROLLUP_HOST, _HOST_TAGS,
        {ITERATION_FIELD: "int", "ranks": "int", ITERATION_MS_FIELD: "float", "<stage>": "float"},
        "per iteration and host (node id, pp stage): each stage's mean (<stage>) over the host's ranks "
        "(ms), their iteration time, how many reported; time = the iteration's (the maxima go to the "
        "windows only: no panel reads them per iteration)",
    ),
    ROLLUP_HOST_WINDOW: Measurement(
        ROLLUP_HOST_WINDOW, _HOST_TAGS, _WINDOW_FIELDS,
        "rollup_host over 5-minute windows aligned to the epoch: per window and host the mean of "
        "each mean field, the max of each _max field, the first iteration, how many iterations and "
        "the most ranks that reported; time = the window's start",
    ),
    ROLLUP_HOST_HOUR: Measurement(
        ROLLUP_HOST_HOUR, _HOST_TAGS, _WINDOW_FIELDS,
        "rollup_host_5m over hours aligned to the epoch, the same fields: each mean field the mean "
        "over the hour's iterations (its windows' means weighted by their iterations), each _max "
        "field the max; rewritten whenever one of its windows is, so the current hour holds the "
        "windows closed so far; time = the hour's start",
    ),
    ROLLUP_JOB: Measurement(
        ROLLUP_JOB, ("job",),
        {ITERATION_FIELD: "int", "ranks": "int", "median_ms": "float", "p99_ms": "float", "max_ms": "float",
         "slowest_rank": "int", "slowest_node": "int", "slowest_host": "str"},
        "per iteration: the iteration time's median, p99 and max over the ranks and the slowest rank; "
        "time = the iteration's",
    ),
    JOB_HEALTH: Measurement(
        JOB_HEALTH, ("job",),
        {ITERATION_FIELD: "int", "points_expected": "int", "points_received": "int",
         "completeness": "float", "late_points": "int", "sporadic_stalls": "int",
         "sporadic_ranks": "int", "sporadic_gpu_hours": "float", "sporadic_top_hosts": "str",
         "sporadic_text": "str"},
        "per job, written each analyzer cycle since it started: points expected (each rank from its "
        "first point on) and received, points that came after their iteration was analyzed, and the "
        "sporadic one-rank stalls counted as noise (an upper bound of their cost); time = the newest "
        "iteration's",
    ),
    INCIDENT_HOST: Measurement(
        INCIDENT_HOST, ("job", "id", "class", "host"),
        {"status": "str", "stage": "str", "title": "str", "ratio": "float", "onset_iteration": "int",
         "slowdown": "float", "gpu_hours_lost": "float"},
        "one point per incident and culprit host (what alert rules label alerts with); time = onset, "
        "rewritten in place as the incident evolves",
    ),
    GPU_HEALTH: Measurement(
        GPU_HEALTH, RANK_TAGS,
        {"clock_event_reasons": "int", "sm_clock_mhz": "float", "temperature_c": "float", "power_w": "float",
         "xid": "int", "ecc_dbe_volatile": "int", "uncorrectable_remapped_rows": "int", "row_remap_failure": "int",
         "pcie_replays": "int", GPU_UUID_FIELD: "str"},
        "one point per GPU and sample (at most one a second): the clock-event reasons bitmask (DCGM field "
        "112), SM clock, temperature, power, the XID seen since the last sample (0: none) and the error "
        "counters (cumulative); time = the sample's",
    ),
    JOB_LIFECYCLE: Measurement(
        JOB_LIFECYCLE, ("job", "event"),
        {"attempt": "int", ITERATION_FIELD: "int", "step": "int", "ranks": "int", "text": "str"},
        "event = restart (iterations went back: a new attempt from a checkpoint), jump (iteration "
        "numbers leapt forward) or ended (no point for the idle time); iteration = the framework's "
        "first iteration of the attempt (ended: its last), step = the analyzer's count for it (the "
        "iteration numbers of the analyzer's outputs); time = the attempt's first point (ended: the "
        "job's last); the dashboards' restart annotations",
    ),
    ACTION: Measurement(
        ACTION, ("job", "incident", "node", "action"),
        {"state": "str", "reason": "str", "host": "str", "class": "str", "scheduler": "str", "mode": "str",
         "attempt": "int", "retry_ms": "int", "final": "int", "actor": "str", "title": "str", "text": "str",
         "tags": "str"},
        "one point per step of an action on a verdict (actions/): action drain|resume of the scheduler's "
        "node for an incident; state planned|done|refused|failed|skipped with its reason; mode dry-run|"
        "enforce; attempt: the failures so far, retry_ms when it is tried again (-1: not); final: 1 when "
        "the actor never touches that node for that incident again (an operator resumed it, someone "
        "else drained it); host as the collectors reported it; title, text, tags: Grafana annotation "
        "fields; time = when the step was taken (the latest point of an action is its state)",
    ),
    ACTION_LEASE: Measurement(
        ACTION_LEASE, ("lease", "holder"),
        {"until_ms": "int"},
        "who may act (actions/lease.py): one point per claim of a holder (replica), time = when its claim "
        "began, until_ms rewritten as it renews; the earliest claim not expired holds the lease",
    ),
}


def stage_fields(columns: Iterable[str]) -> list[str]:
    """The stage columns of a ``stage_latency`` frame (everything not a tag or reserved)."""
    return [c for c in columns if c not in RESERVED_FIELDS]
