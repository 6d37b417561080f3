"""Step 4, make rows: one ``stage_latency`` row per rank per closed iteration, and
:func:`stage_frame`, which runs the steps from the record table to those rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from collector.nccl_import.iterations import (
    Summary,
    assign_iterations,
    choose_anchor,
    closed_iterations,
    missing_records,
    summarise,
)
from collector.nccl_import.records import NcclError
from collector.nccl_import.stages import comm_kinds, default_topology, record_stages
from rankscope import schema
from rankscope.stage_rows import stage_rows
from rankscope.topology import Topology


@dataclass
class NcclImport:
    """What :func:`stage_frame` made of the records."""

    frame: pd.DataFrame
    topology: Topology
    anchor: str
    kinds: dict[str, str]
    #: Records lost to the Inspector's sampling (sequence-number gaps), per communicator.
    missing: dict[str, int] = field(default_factory=dict)
    #: Last anchor iteration each rank closed (follow mode writes those below the minimum).
    closed: dict[int, int] = field(default_factory=dict)


def _checked(records: pd.DataFrame, topo: Topology | None, per_iteration: int, anchor: str | None) -> tuple[Topology, str]:
    """The topology and the anchor, once the records fit them."""
    if per_iteration < 1:
        raise NcclError("--per-iteration must be at least 1")
    if not len(records):
        raise NcclError("no collective record to import")
    topo = topo or default_topology(records)
    bad = records["rank"][(records["rank"] < 0) | (records["rank"] >= topo.world)]
    if len(bad):
        raise NcclError(f"rank {int(bad.iloc[0])} is outside the job's {topo.world} ranks (give --tp/--pp/--dp/--ep)")
    anchor = anchor if anchor is not None else choose_anchor(records)
    if anchor not in set(records["comm"]):
        raise NcclError(f"anchor communicator {anchor!r} has no record; known: {', '.join(sorted(set(records['comm'])))}")
    return topo, anchor


def stage_frame(records: pd.DataFrame, job: str, topo: Topology | None = None, per_iteration: int = 1,
    anchor: str | None = None, first_sn: int | None = None, iteration_offset: int = 0) -> NcclImport:
    """One ``stage_latency`` row per rank per iteration (see the package's doc). Pure."""
    topo, anchor = _checked(records, topo, per_iteration, anchor)
    kinds = comm_kinds(records, topo)
    df = records.sort_values(["rank", "order", "line"], kind="stable").reset_index(drop=True)
    assign = assign_iterations(df, anchor, per_iteration, first_sn)
    if not assign.ok.any():
        raise NcclError(f"no iteration is complete: the anchor communicator {anchor} ({kinds[anchor]}) closed "
                        f"none ({per_iteration} collective(s) per iteration)")
    summary = summarise(df, assign, record_stages(df, kinds, assign.ok, assign.iteration))
    frame = make_rows(summary, _hosts(df, topo), job, topo, iteration_offset)
    return NcclImport(frame, topo, anchor, kinds, missing_records(df), closed_iterations(assign))


def _hosts(df: pd.DataFrame, topo: Topology) -> pd.Series | None:
    """Each rank's host, when the records name one for every rank of the job."""
    hosts = df.groupby("rank")["host"].first() if "host" in df.columns else None
    if hosts is not None and hosts.notna().all() and len(hosts) == topo.world:
        return hosts
    return None


def make_rows(summary: Summary, hosts: pd.Series | None, job: str, topo: Topology,
              iteration_offset: int = 0) -> pd.DataFrame:
    """The ``stage_latency`` rows of a summary (by :func:`~rankscope.stage_rows.stage_rows`):
    times strictly increasing per rank (1 ms apart at least), the ranks' hosts when the records
    name every one (never the topology's), no ``gpu`` (the records name no device), and each
    stage seen (in the schema's order)."""
    r = summary.rank
    t = _increasing(np.round(summary.end_ms).astype(np.int64), summary.same_rank)
    per_stage = summary.per_stage
    stages = {s: per_stage[s].to_numpy(np.float64) for s in schema.KNOWN_STAGES.names if s in per_stage.columns}
    return stage_rows(job, r, summary.iteration + iteration_offset, t, stages, topo=topo,
                      iteration_ms=np.maximum(summary.iteration_ms, 0.0),
                      host=hosts.reindex(r).to_numpy() if hosts is not None else "", gpu=None)


def _increasing(t: np.ndarray, same: np.ndarray) -> np.ndarray:
    """``t`` made strictly increasing inside each run of ``same`` (a rank's rows), +1 ms steps."""
    n = np.arange(len(t))
    start = np.maximum.accumulate(np.where(~same, n, 0))
    # t'_i = max_{j<=i in run}(t_j + (i - j)) = (i - start) + cummax(t_j - (j - start)) within the run
    shifted = t - (n - start)
    run_id = np.cumsum(~same)
    cm = pd.Series(shifted).groupby(run_id).cummax().to_numpy()
    return cm + (n - start)
