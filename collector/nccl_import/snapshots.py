"""Inspector snapshots (the Prometheus mode's dumps) -> one ``stage_latency`` row per rank per
snapshot.

In its Prometheus mode the Inspector writes, every interval (30 s at least), only the latest
collective of each communicator of a GPU: a *snapshot*, not the iteration's collectives. So
snapshots are placed by time, not by counting collectives:

- **dumps**: a rank's records whose times (the ``timestamp`` label, one second resolution) lie
  within :data:`SAME_DUMP_S` of each other are one dump (a dump that straddles a second);
- **the interval** ``P``: the median time between a rank's consecutive dumps;
- **slots**: each rank's dumps are numbered on one clock for the whole job, ``floor((t -
  t_first) / P)`` for a rank's first dump (``t_first`` the job's first), then one slot on
  (or more, one per interval that passed) for each later dump. Ranks dump on their own phase,
  so the ranks of a slot were seen up to one interval apart;
- **iteration**: a slot's number is the training iteration the anchor communicator's sequence
  numbers say (``(coll_sn - first) // per_iteration``, the median over the slot's ranks), kept
  strictly increasing; a point is so stamped with about the iteration it saw;
- **stages**: each record's stage as for the JSON logs
  (:func:`~collector.nccl_import.stages.record_stages`: every all-to-all is ``dispatch``, a
  snapshot cannot tell which of the pair it holds), summed per rank and slot
  (:func:`~collector.nccl_import.iterations.summarise`): a stage's value is the time of the one
  collective each of its communicators last ran, not the iteration's total;
- **iteration_ms**: between two of a rank's dumps, the time over the iterations its anchor
  communicator advanced (whole seconds over some 30 s: within about 3%); a rank's first dump
  takes its second's;
- **time**: the rank's dump time; the rows are made by
  :func:`~collector.nccl_import.rows.make_rows` (hosts from the records, ``gpu`` not tagged).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from collector.nccl_import.iterations import Assignment, summarise
from collector.nccl_import.records import NcclError
from collector.nccl_import.rows import NcclImport, _checked, make_rows
from collector.nccl_import.stages import comm_kinds, record_stages
from rankscope.topology import Topology

#: A rank's record times closer than this (s) are one dump (the plugin's interval is 30 s at least).
SAME_DUMP_S = 5.0


@dataclasses.dataclass(frozen=True)
class Slots:
    """Each dump (one per rank per slot): its rank, time (us) and slot, and each record's dump."""

    rank: np.ndarray
    end_us: np.ndarray
    slot: np.ndarray
    of_record: np.ndarray
    #: The interval between a rank's dumps (us); None while no rank has dumped twice.
    period_us: float | None


def place_dumps(records: pd.DataFrame) -> Slots:
    """The dumps of ``records`` (sorted by rank, then time) on the job's slots."""
    rank = records["rank"].to_numpy(np.int64)
    t = records["end_us"].to_numpy(np.float64)
    new = np.r_[True, (rank[1:] != rank[:-1]) | (t[1:] - t[:-1] > SAME_DUMP_S * 1e6)]
    dump = np.cumsum(new) - 1
    d_rank = rank[new]
    d_end = pd.Series(t).groupby(dump).max().to_numpy()
    first = np.r_[True, d_rank[1:] != d_rank[:-1]]
    gaps = np.diff(d_end)[~first[1:]]
    period = float(np.median(gaps)) if len(gaps) else None
    if period is None:
        slot = np.zeros(len(d_rank), dtype=np.int64)
    else:
        step = np.where(first, np.floor((d_end - d_end.min()) / period),
                        np.maximum(1, np.round(np.r_[0.0, np.diff(d_end)] / period)))
        slot = pd.Series(step.astype(np.int64)).groupby(d_rank).cumsum().to_numpy()
    return Slots(d_rank, d_end, slot, dump, period)


def _slot_iterations(slots: Slots, anchor_it: np.ndarray) -> np.ndarray:
    """Per dump, its slot's iteration: the median anchor iteration of the slot's dumps,
    strictly increasing from slot to slot, never negative."""
    per_slot = pd.Series(anchor_it).groupby(slots.slot).median()
    s = per_slot.index.to_numpy(np.int64)
    v = np.floor(per_slot.to_numpy(np.float64)) - np.arange(len(s))
    v = np.fmax.accumulate(np.where(np.isnan(v), -np.inf, v))
    v = np.where(np.isfinite(v), v, v[np.isfinite(v)].min() if np.isfinite(v).any() else 0.0)
    it = v + np.arange(len(s))
    it -= min(0.0, it.min())
    return pd.Series(it.astype(np.int64), index=s).reindex(slots.slot).to_numpy()


def _iteration_ms(slots: Slots, anchor_it: np.ndarray) -> np.ndarray:
    """Per dump, the rank's time per iteration since its previous dump with an anchor record
    (its first: its next one's)."""
    f = pd.DataFrame({"rank": slots.rank, "t": slots.end_us / 1000.0, "a": anchor_it}).dropna()
    prev = f.groupby("rank")[["t", "a"]].shift()
    rate = (f["t"] - prev["t"]) / (f["a"] - prev["a"])
    rate = rate.where(f["a"] > prev["a"])
    rate = rate.groupby(f["rank"]).bfill()
    return rate.reindex(range(len(slots.rank))).to_numpy(np.float64)


def _anchor_iterations(df: pd.DataFrame, slots: Slots, anchor: str, per_iteration: int,
                       first_sn: int | None) -> tuple[np.ndarray, int]:
    """Per dump, the iteration its anchor record says (NaN without one), and the first sn."""
    is_anchor = (df["comm"] == anchor).to_numpy()
    sn = df["sn"].to_numpy(np.int64)
    first = int(sn[is_anchor].min()) if first_sn is None else int(first_sn)
    it = pd.Series((sn[is_anchor] - first) / per_iteration).groupby(slots.of_record[is_anchor]).max()
    return it.reindex(range(len(slots.rank))).to_numpy(np.float64), first


def snapshot_frame(records: pd.DataFrame, job: str, topo: Topology | None = None, per_iteration: int = 1,
                   anchor: str | None = None, first_sn: int | None = None,
                   iteration_offset: int = 0) -> NcclImport:
    """One ``stage_latency`` row per rank per snapshot (see the module's doc). Pure.

    ``closed`` holds, per rank, the iteration of its newest slot once the interval is known
    (empty before: a follower writes nothing until every rank dumped twice)."""
    topo, anchor = _checked(records, topo, per_iteration, anchor)
    kinds = comm_kinds(records, topo)
    df = records.sort_values(["rank", "end_us", "line"], kind="stable").reset_index(drop=True)
    slots = place_dumps(df)
    anchor_it, first = _anchor_iterations(df, slots, anchor, per_iteration, first_sn)
    if np.isnan(anchor_it).all():
        raise NcclError(f"no dump holds a collective of the anchor communicator {anchor}: give --anchor")
    dump_it = _slot_iterations(slots, np.floor(anchor_it))
    iteration = dump_it[slots.of_record]
    assign = Assignment(np.ones(len(df), dtype=bool), iteration, slots.rank, dump_it, slots.end_us)
    summary = summarise(df, assign, record_stages(df, kinds, assign.ok, iteration))
    per_dump = pd.Series(_iteration_ms(slots, anchor_it),
                         index=pd.MultiIndex.from_arrays([slots.rank, dump_it]))
    summary = dataclasses.replace(summary, iteration_ms=per_dump.reindex(
        pd.MultiIndex.from_arrays([summary.rank, summary.iteration])).to_numpy(np.float64))
    hosts = df.groupby("rank")["host"].first()
    hosts = hosts if hosts.notna().all() and len(hosts) == topo.world else None
    frame = make_rows(summary, hosts, job, topo, iteration_offset)
    closed = {} if slots.period_us is None else \
        {int(r): int(i) for r, i in pd.Series(dump_it).groupby(slots.rank).max().items()}
    return NcclImport(frame, topo, anchor, kinds, {}, closed)
