"""Per-operation traces (one row per operation of a rank) -> ``stage_latency`` points.

The format is the one of ByteDance-Seed/StragglerAnalysis (the traces of "Understanding
Stragglers in Large Model Training Using What-if Analysis", OSDI'25): one row per recorded
operation, with the columns

- ``rank``, ``dp_rank``, ``stage`` (the PP rank): the worker that ran it;
- ``step``: the training step;
- ``optype``: Megatron-LM's name of the operation (``forward-compute``, ``forward-send``,
  ``grads-reduce-scatter``, ...; :data:`OPTYPE_STAGES`);
- ``start_ts``, ``duration``: seconds, ``start_ts`` from the start of the step.

Such a trace records one rank per *worker* (a PP stage x DP rank cell: the first rank of its
tensor- and sequence-parallel group, whose other members run in lockstep with it), as the
what-if analysis models a job. :func:`stage_frame` writes one point per worker: rank ``r``
of the imported job is the worker ``dp + DP * pp`` (Megatron's tp-dp-pp order with the
tensor-parallel dimension folded into the worker), so its ranks in the real job are
``r * ranks_per_worker ... (r + 1) * ranks_per_worker - 1``; a node holds
``gpus_per_node / ranks_per_worker`` workers.

Stages (per step, the sum of the rank's operations of that stage, in milliseconds, as the
stage timer writes totals): compute to compute stages, collectives to the communication stage
of their group:

====================================== ===================== ==========================
optype                                 stage                 kind (group)
====================================== ===================== ==========================
forward-compute, backward-compute      ``compute_other``     compute
optimizer                              ``optimizer``         compute
forward-send, backward-send            ``pp_send``           comm (pipeline)
forward-recv, backward-recv            ``pp_recv``           comm (pipeline)
grads-reduce-scatter                   ``reduce_scatter``    comm (dp)
params-all-gather                      ``all_gather``        comm (dp)
separate-grads-all-reduce,             ``comm_other``        comm (dp)
layernorm-grads-all-reduce,
embedding-grads-all-reduce,
optimizer-clip-main-grad
gc, first-op                           (not a stage)
====================================== ===================== ==========================

``forward-compute`` and ``backward-compute`` are whole layers' forward and backward passes:
no named default stage (attention, mlp) holds them, so they are the model-agnostic
``compute_other`` that ``import-trace`` also writes. The gradient-norm all-reduce of
``optimizer-clip-main-grad``, the embedding and layernorm all-reduces run in groups no
default stage names; ``comm_other`` holds them, as it holds a profiler trace's unnamed
collectives. ``gc`` (Python garbage collection, recorded as zero time) and ``first-op`` (a
marker) time nothing.

The traces' times start at 0 in every step. A point's time is that rank's own end of the
step on a clock of the job's: step ``s`` starts at ``start_ms + (s - first step) * period``,
``period`` the longest step of the trace (whole seconds), so steps keep their order and the
gaps between the steps a trace sampled; ``iteration_ms`` is the rank's own step, from its
first operation's start to its last operation's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collector.untrusted.bounded_read import DEFAULT_LIMIT, MB, FileLimit, open_bounded
from rankscope.stage_rows import stage_rows
from rankscope.times import MAX_EPOCH_MS
from rankscope.topology import Topology, TopologyError

#: The columns a per-operation trace must have.
REQUIRED_COLUMNS = ("rank", "dp_rank", "stage", "step", "optype", "start_ts", "duration")

#: optype -> stage (None: recorded, but no stage's time).
OPTYPE_STAGES: dict[str, str | None] = {
    "forward-compute": "compute_other",
    "backward-compute": "compute_other",
    "optimizer": "optimizer",
    "forward-send": "pp_send",
    "backward-send": "pp_send",
    "forward-recv": "pp_recv",
    "backward-recv": "pp_recv",
    "grads-reduce-scatter": "reduce_scatter",
    "params-all-gather": "all_gather",
    "separate-grads-all-reduce": "comm_other",
    "layernorm-grads-all-reduce": "comm_other",
    "embedding-grads-all-reduce": "comm_other",
    "optimizer-clip-main-grad": "comm_other",
    "gc": None,
    "first-op": None,
}


class OpsError(ValueError):
    """A per-operation trace that cannot be imported (the message says what is wrong)."""


@dataclass(frozen=True)
class OpsLayout:
    """The workers a trace records and where they sit: the imported job's topology."""

    topology: Topology
    #: Ranks of the real job per recorded worker (its tensor- x sequence-parallel group).
    ranks_per_worker: int
    #: The trace's own rank of every imported rank (worker), in worker order.
    trace_rank: np.ndarray


def check_columns(ops: pd.DataFrame, source: str = "the trace") -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in ops.columns]
    if missing:
        raise OpsError(f"{source} lacks column(s) {', '.join(missing)}; a per-operation trace has "
                       f"{', '.join(REQUIRED_COLUMNS)} (it has {', '.join(map(str, ops.columns)) or 'none'})")


def layout(ops: pd.DataFrame, ranks_per_worker: int = 1, gpus_per_node: int = 8) -> OpsLayout:
    """The topology of the workers ``ops`` records: pp and dp from its ``stage`` and ``dp_rank``
    columns, one rankscope rank per worker, ``gpus_per_node / ranks_per_worker`` per node."""
    if ranks_per_worker < 1 or gpus_per_node < 1:
        raise OpsError("ranks per worker and GPUs per node must be positive")
    if gpus_per_node % ranks_per_worker:
        raise OpsError(f"{ranks_per_worker} rank(s) per worker do not divide {gpus_per_node} GPUs per node")
    cells = ops[["rank", "stage", "dp_rank"]].drop_duplicates()
    if cells["rank"].duplicated().any():
        r = int(cells.loc[cells["rank"].duplicated(), "rank"].iloc[0])
        raise OpsError(f"rank {r} is recorded at more than one (stage, dp_rank)")
    if cells[["stage", "dp_rank"]].duplicated().any():
        st, dp = cells.loc[cells[["stage", "dp_rank"]].duplicated(), ["stage", "dp_rank"]].iloc[0]
        raise OpsError(f"stage {int(st)}, dp_rank {int(dp)} is recorded by more than one rank")
    if (cells[["stage", "dp_rank"]] < 0).any().any():
        raise OpsError("stage and dp_rank must be >= 0")
    pp, dp = int(cells["stage"].max()) + 1, int(cells["dp_rank"].max()) + 1
    if len(cells) != pp * dp:
        raise OpsError(f"the trace records {len(cells)} worker(s), not every one of pp={pp} x dp={dp}; "
                       f"a worker with no operation cannot be placed")
    per_node = gpus_per_node // ranks_per_worker
    if (pp * dp) % per_node:
        raise OpsError(f"{pp * dp} worker(s) of {ranks_per_worker} rank(s) do not fill nodes of "
                       f"{gpus_per_node} GPUs ({per_node} workers each); give the job's GPUs per node")
    try:
        topo = Topology(pp=pp, dp=dp, gpus_per_node=per_node)
    except TopologyError as exc:
        raise OpsError(f"the trace's layout does not fit a topology: {exc}") from None
    worker = topo.rank_of(pp=cells["stage"].to_numpy(np.int64), dp=cells["dp_rank"].to_numpy(np.int64))
    trace_rank = np.empty(topo.world, dtype=np.int64)
    trace_rank[worker] = cells["rank"].to_numpy(np.int64)
    return OpsLayout(topo, ranks_per_worker, trace_rank)


def stage_frame(ops: pd.DataFrame, job: str, start_ms: int, ranks_per_worker: int = 1,
                gpus_per_node: int = 8, stages: Mapping[str, str | None] | None = None,
                host_pattern: str | None = None) -> tuple[pd.DataFrame, OpsLayout]:
    """One ``stage_latency`` row per recorded worker per step (see the module's doc), and the
    layout the rows' tags follow. Pure: reads ``ops``, writes nothing.

    The traces name no host. ``host_pattern`` (e.g. ``"gpu-node-{node:03d}"``) names each
    node's, for a job placed in blocks of ``gpus_per_node`` ranks; the ``host`` and ``gpu``
    tags (the local index of the worker's first GPU) are then written, else neither."""
    mapping = dict(OPTYPE_STAGES if stages is None else stages)
    optype, start, dur = _checked_ops(ops, mapping)
    lay = _placed_layout(ops, ranks_per_worker, gpus_per_node, host_pattern)
    topo = lay.topology
    worker_of = pd.Series(np.arange(topo.world), index=lay.trace_rank)
    df = pd.DataFrame({"rank": worker_of.loc[ops["rank"].to_numpy(np.int64)].to_numpy(),
                       "step": ops["step"].to_numpy(np.int64), "stage": optype.map(mapping).to_numpy(),
                       "start": start, "end": start + dur, "ms": dur * 1000.0})
    keys = ["step", "rank"]
    span = df.groupby(keys, sort=True).agg(first=("start", "min"), last=("end", "max"))
    timed = df[df["stage"].notna()]
    per_stage = timed.groupby([*keys, "stage"], sort=True)["ms"].sum().unstack("stage")
    names = [s for s in dict.fromkeys(v for v in mapping.values() if v) if s in per_stage.columns]
    per_stage = per_stage.reindex(span.index)[names].fillna(0.0)
    steps = span.index.get_level_values("step").to_numpy(np.int64)
    ranks = span.index.get_level_values("rank").to_numpy(np.int64)
    period_ms = max(1000.0, float(np.ceil(span["last"].max())) * 1000.0)
    time = start_ms + ((steps - int(steps.min())) * period_ms + span["last"].to_numpy() * 1000.0).round()
    check_times(time, steps, period_ms)
    # the worker's first GPU: its local index among the workers of its node, in GPUs
    gpu = topo.local_index[ranks] * ranks_per_worker if topo.hosts is not None else None
    out = stage_rows(job, ranks, steps, time.astype(np.int64),
                     {name: per_stage[name].to_numpy(np.float64) for name in names}, topo=topo,
                     iteration_ms=((span["last"] - span["first"]) * 1000.0).to_numpy(), gpu=gpu)
    return out, lay


def _checked_ops(ops: pd.DataFrame, mapping: Mapping[str, str | None]
                 ) -> tuple[pd.Series, np.ndarray, np.ndarray]:
    """``(optype, start_ts, duration)`` of a trace whose columns, optypes and times are sound."""
    check_columns(ops)
    if not len(ops):
        raise OpsError("the trace holds no operation")
    optype = ops["optype"].astype(str)
    unknown = sorted(set(optype.unique()) - set(mapping))
    if unknown:
        raise OpsError(f"unknown optype(s) {', '.join(unknown)}; known: {', '.join(mapping)}")
    start = pd.to_numeric(ops["start_ts"], errors="coerce").to_numpy(np.float64)
    dur = pd.to_numeric(ops["duration"], errors="coerce").to_numpy(np.float64)
    bad = ~np.isfinite(start) | ~np.isfinite(dur) | (dur < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise OpsError(f"{int(bad.sum())} operation(s) with a missing, non-finite or negative start_ts or "
                       f"duration (first: row {i}, {optype.iloc[i]} at {ops['start_ts'].iloc[i]!r}, "
                       f"duration {ops['duration'].iloc[i]!r})")
    return optype, start, dur


def check_times(time_ms: np.ndarray, steps: np.ndarray, period_ms: float | None = None) -> None:
    """Refuse points whose times a store cannot hold (before 1970 or after 2262)."""
    ok = np.isfinite(time_ms) & (time_ms >= 0) & (time_ms <= MAX_EPOCH_MS)
    if not ok.all():
        every = f", one every {period_ms / 1000:g} s," if period_ms else ""
        raise OpsError(f"steps {int(steps.min())}-{int(steps.max())}{every} would place points outside the "
                       f"times a store holds (1970 to 2262): check the step column and --start, or import "
                       f"the steps in parts")


def _placed_layout(ops: pd.DataFrame, ranks_per_worker: int, gpus_per_node: int,
                   host_pattern: str | None) -> OpsLayout:
    """The trace's layout, its nodes named by ``host_pattern`` when given."""
    lay = layout(ops, ranks_per_worker, gpus_per_node)
    if host_pattern is None:
        return lay
    topo = lay.topology
    try:
        topo = Topology(pp=topo.pp, dp=topo.dp, gpus_per_node=topo.gpus_per_node, host_pattern=host_pattern)
    except TopologyError as exc:
        raise OpsError(str(exc)) from None
    return OpsLayout(topo, lay.ranks_per_worker, lay.trace_rank)


def read_ops(path, limit: FileLimit = DEFAULT_LIMIT) -> pd.DataFrame:
    """The :data:`REQUIRED_COLUMNS` of a per-operation trace file (Parquet, or CSV by its
    suffix), read within ``limit`` (a CSV as a bounded stream; a Parquet file refused from its
    footer when its columns would take more)."""
    from pathlib import Path

    p = Path(path)
    if not p.exists():
        raise OpsError(f"{p}: no such file")
    if p.is_dir():
        raise OpsError(f"{p} is a directory, not a trace file")
    if p.suffix.lower() == ".csv":
        ops = _read_csv(p, limit)
    else:
        ops = _read_parquet(p, limit)
    check_columns(ops, str(p))
    return ops


def _read_csv(p, limit: FileLimit) -> pd.DataFrame:
    try:
        with open_bounded(p, limit, OpsError, gunzip=True) as fh:
            head = pd.read_csv(fh, nrows=0)
        check_columns(head, str(p))
        with open_bounded(p, limit, OpsError, gunzip=True) as fh:
            return pd.read_csv(fh, usecols=list(REQUIRED_COLUMNS), low_memory=False)
    except (ValueError, pd.errors.ParserError) as exc:
        if isinstance(exc, OpsError):
            raise
        raise OpsError(f"{p}: not a readable CSV file: {exc}") from None


def _read_parquet(p, limit: FileLimit) -> pd.DataFrame:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise OpsError("reading Parquet traces needs pyarrow: pip install 'rankscope[traces]'") from None
    try:
        pf = pq.ParquetFile(p)
        check_columns(pd.DataFrame(columns=pf.schema_arrow.names), str(p))
        meta = pf.metadata
        wanted = [i for i in range(meta.num_columns) if meta.schema.column(i).path in REQUIRED_COLUMNS]
        stored = sum(meta.row_group(g).column(i).total_uncompressed_size
                     for g in range(meta.num_row_groups) for i in wanted)
        if max(stored, meta.num_rows * len(REQUIRED_COLUMNS) * 8) > limit.max_bytes:
            raise OpsError(limit.refusal(p) + f" ({meta.num_rows} rows, about "
                           f"{max(stored, meta.num_rows * len(REQUIRED_COLUMNS) * 8) / MB:.0f} MB unpacked)")
        return pf.read(columns=list(REQUIRED_COLUMNS)).to_pandas()
    except OpsError:
        raise
    except Exception as exc:  # pyarrow raises its own ArrowInvalid / OSError for a non-Parquet file
        raise OpsError(f"{p}: not a Parquet file ({type(exc).__name__}: {str(exc)[:200]})") from None
