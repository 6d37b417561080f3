"""Step 2, name stages: the kind of every communicator against the job's layout, and the stage
of every collective (see the package's doc for the table)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.nccl_import.records import NcclError, world_of
from rankscope.topology import Topology, TopologyError

#: Comm kinds tried against the layout, in order.
_LAYOUT_KINDS = ("tp", "dp", "ep", "edp", "pipeline")


def default_topology(records: pd.DataFrame, gpus_per_node: int | None = None) -> Topology:
    """The layout the records show when none is given: data parallelism over the ranks they
    name, with the intra-node groups as TP groups (:func:`intra_node_size`), on the hosts'
    GPU count (the ranks each host's records name, when every rank's host is known and they
    are the same on every host; else ``gpus_per_node``, else 8, or the world if smaller)."""
    world = world_of(records)
    tp, per_host = intra_node_size(records, world)
    gpn = gpus_per_node or per_host or (8 if world % 8 == 0 else world)
    try:
        return Topology(tp=tp, dp=world // tp, gpus_per_node=gpn)
    except TopologyError:
        try:
            return Topology(dp=world, gpus_per_node=gpn)
        except TopologyError as exc:
            raise NcclError(f"the records' {world} ranks do not fit a topology: {exc}") from None


def _hosts(records: pd.DataFrame, world: int) -> np.ndarray | None:
    """Each rank's host (object array), when the records name one for every rank."""
    if "host" not in records.columns:
        return None
    known = records.dropna(subset=["host"]).groupby("rank")["host"].first()
    if len(known) != world or set(known.index) != set(range(world)):
        return None
    return known.sort_index().to_numpy(dtype=object)


def intra_node_size(records: pd.DataFrame, world: int) -> tuple[int, int | None]:
    """The size of the innermost groups of GPUs on one host that communicate apart (1: none), and
    the GPUs per host (None when not every rank's host is known or the hosts differ).

    A communicator is intra-node when all its members sit on one host, it has 2 or more and
    fewer than the world, and it runs collectives (not only sends and receives). Its size is the
    TP size when such communicators of that size split the job into blocks of consecutive ranks
    (rank = tp fastest, as Megatron-LM and torchrun number them); the smallest such size wins (TP
    is the innermost group). Anything else leaves the job data parallel."""
    hosts = _hosts(records, world)
    if hosts is None:
        return 1, None
    _, per = np.unique(hosts, return_counts=True)
    per_host = int(per[0]) if (per == per[0]).all() else None
    members = records.groupby("comm")["members"].first()
    ops = records.groupby("comm")["op"].agg(lambda o: set(o))
    sizes: dict[int, set[int]] = {}
    for comm, mem in members.items():
        mem = tuple(int(m) for m in mem)
        if not 2 <= len(mem) < world or ops[comm] <= {"send", "recv"} or len({hosts[m] for m in mem}) != 1:
            continue
        if mem == tuple(range(mem[0], mem[0] + len(mem))) and mem[0] % len(mem) == 0:
            sizes.setdefault(len(mem), set()).add(mem[0] // len(mem))
    full = [t for t, blocks in sizes.items() if world % t == 0 and len(blocks) == world // t]
    return (min(full) if full else 1), per_host


def comm_kinds(records: pd.DataFrame, topo: Topology) -> dict[str, str]:
    """Kind of every communicator: a group kind of ``topo`` its members form, else ``pipeline``
    (two members, only sends and receives), ``world`` (the whole job) or ``other``."""
    sets = {kind: {tuple(sorted(row)) for row in topo.members(kind).tolist()} for kind in _LAYOUT_KINDS}
    ops = records.groupby("comm")["op"].agg(lambda o: set(o))
    members = records.groupby("comm")["members"].first()
    out = {}
    for comm, mem in members.items():
        mem = tuple(mem)
        p2p_only = ops[comm] <= {"send", "recv"}
        kind = next((k for k in _LAYOUT_KINDS if mem in sets[k] and topo.group_size(k) > 1), None)
        if kind == "tp" and p2p_only:
            kind = None
        if kind is None:
            kind = ("pipeline" if p2p_only and len(mem) == 2 else
                    "world" if len(mem) == topo.world else "other")
        out[str(comm)] = kind
    return out


def stage_of(op: str, kind: str) -> str:
    """The stage of an operation on a communicator of ``kind`` (``dispatch`` for all-to-alls: the
    caller alternates dispatch / combine)."""
    if op == "all_to_all" and kind in ("ep", "world", "other", "dp"):
        return "dispatch"
    if op in ("send", "recv") and kind in ("pipeline", "other"):
        return "pp_send" if op == "send" else "pp_recv"
    if kind == "dp":
        return {"reduce_scatter": "reduce_scatter", "all_reduce": "reduce_scatter",
                "all_gather": "all_gather"}.get(op, "comm_other")
    if kind == "edp" and op in ("reduce_scatter", "all_reduce"):
        return "expert_reduce"
    if kind == "tp" and op not in ("send", "recv"):
        return "tp_comm"
    return "comm_other"


def record_stages(records: pd.DataFrame, kinds: dict[str, str], keep: np.ndarray,
                  iteration: np.ndarray) -> np.ndarray:
    """The stage of each record ``keep`` selects (``iteration``: every record's iteration). The
    all-to-alls of an iteration alternate dispatch / combine, per rank and communicator."""
    kind = records["comm"].map(kinds).to_numpy()
    key = pd.Series(records["op"].to_numpy(dtype=str), dtype=object) + "|" + pd.Series(kind, dtype=object)
    stage = key.map({k: stage_of(*k.split("|")) for k in pd.unique(key)}).to_numpy()[keep]
    a2a = stage == "dispatch"
    if a2a.any():
        calls = pd.DataFrame({"rank": records["rank"].to_numpy(np.int64)[keep][a2a],
                              "iteration": iteration[keep][a2a],
                              "comm": records["comm"].to_numpy()[keep][a2a]})
        nth = calls.groupby(["rank", "iteration", "comm"]).cumcount().to_numpy()
        stage[a2a] = np.where(nth % 2 == 0, "dispatch", "combine")
    return stage
