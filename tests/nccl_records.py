"""Collective records in the shapes NCCL Inspector and PyTorch's Flight Recorder write them
(the collector/nccl_import package cites the sources), for a small simulated job.

The job: pp=2 x dp=4 (8 ranks, Megatron order: rank = dp + 4 * pp), per iteration
compute, a forward pipeline hop (stage 0 sends to stage 1), compute, a backward hop (stage 1
sends to stage 0), the DP gradient reduce-scatter and all-gather, and a job-wide all-reduce
(the loss). A collective ends for all its members when the last one arrived plus its own
transfer time, so each member's measured time is its wait for the last arrival plus the
transfer: a slow rank arrives last and measures the shortest times.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np

PP, DP = 2, 4
WORLD = PP * DP
T0_US = 1_764_800_000_000_000  # epoch microseconds


def rank_of(pp: int, dp: int) -> int:
    return dp + DP * pp


def comms() -> dict[str, tuple[int, ...]]:
    """Communicator id -> global members."""
    out = {"0xworld00000000": tuple(range(WORLD))}
    for pp in range(PP):
        out[f"0xdp{pp:012x}"] = tuple(rank_of(pp, d) for d in range(DP))
    for d in range(DP):
        out[f"0xpp{d:012x}"] = (rank_of(0, d), rank_of(1, d))
    return out


def simulate(iterations: int = 30, slow_rank: int | None = 5, slow_from: int = 15, factor: float = 4.0,
             seed: int = 0, compute_ms: float = 20.0) -> list[dict]:
    """Per rank, per collective in the order run: dicts with rank, comm, op, sn, start_us, end_us, ms."""
    rng = np.random.default_rng(seed)
    members = comms()
    sn = {c: 0 for c in members}          # the communicator's sequence number (same on every member)
    clock = np.zeros(WORLD)               # each rank's own time, us from T0
    recs: list[dict] = []

    def coll(comm: str, op: str, base_us: float, ranks=None, ops=None):
        ranks = list(members[comm]) if ranks is None else ranks
        arrive = clock[ranks]
        end = arrive.max() + base_us * (1 + 0.03 * rng.standard_normal())
        for i, r in enumerate(ranks):
            recs.append({"rank": r, "comm": comm, "op": ops[i] if ops else op, "sn": sn[comm],
                         "start_us": float(arrive[i]), "end_us": float(end), "ms": (end - arrive[i]) / 1000.0})
            clock[r] = end
        sn[comm] += 1

    for it in range(iterations):
        def compute(it=it):
            c = compute_ms * 1000.0 * (1 + 0.03 * rng.standard_normal(WORLD))
            if slow_rank is not None and it >= slow_from:
                c[slow_rank] *= factor
            clock[:] += c
        compute()
        for d in range(DP):
            coll(f"0xpp{d:012x}", "", 800.0, [rank_of(0, d), rank_of(1, d)], ["send", "recv"])
        compute()
        for d in range(DP):
            coll(f"0xpp{d:012x}", "", 800.0, [rank_of(1, d), rank_of(0, d)], ["send", "recv"])
        for pp in range(PP):
            coll(f"0xdp{pp:012x}", "reduce_scatter", 3000.0)
        for pp in range(PP):
            coll(f"0xdp{pp:012x}", "all_gather", 2500.0)
        coll("0xworld00000000", "all_reduce", 200.0)
    return recs


_INSPECTOR_COLL = {"send": "Send", "recv": "Recv", "reduce_scatter": "ReduceScatter",
                   "all_gather": "AllGather", "all_reduce": "AllReduce", "all_to_all": "SendRecv"}


def host_of(rank: int) -> str:
    return f"gpu-node-{rank // 4:03d}"


def inspector_line(rec: dict, verbose: bool = True) -> str:
    """One record as the Inspector's dump thread writes it (one JSON object per line)."""
    members = comms()[rec["comm"]]
    perf = {"coll": _INSPECTOR_COLL[rec["op"]], "coll_sn": rec["sn"], "coll_msg_size_bytes": 1 << 24,
            "coll_exec_time_us": int(round(rec["ms"] * 1000)), "coll_timing_source": "kernel_gpu",
            "coll_algobw_gbs": 100.0, "coll_busbw_gbs": 90.0}
    start, end = T0_US + int(rec["start_us"]), T0_US + int(rec["end_us"])
    if verbose:
        perf["event_trace_sn"] = {"coll_start_sn": 1, "coll_stop_sn": 2,
                                  "kernel_events": [{"channel_id": 0, "kernel_start_sn": 3, "kernel_stop_sn": 5,
                                                     "kernel_record_sn": 4}]}
        perf["event_trace_ts"] = {"coll_start_ts": start - 10, "coll_stop_ts": start - 5,
                                  "kernel_events": [{"channel_id": 0, "kernel_start_ts": start,
                                                     "kernel_stop_ts": end, "kernel_record_ts": end}]}
    obj = {"header": {"id": rec["comm"], "rank": members.index(rec["rank"]), "n_ranks": len(members),
                      "nnodes": len({host_of(r) for r in members})},
           "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism":
                        "nccl_profiler_interface", "dump_timestamp_us": end + 300,
                        "hostname": host_of(rec["rank"]), "pid": 1000 + rec["rank"]},
           "coll_perf": perf}
    return json.dumps(obj, separators=(",", ":"))


def inspector_files(recs: list[dict], directory: Path, verbose: bool = True) -> list[Path]:
    """``<hostname>-pid<pid>.log`` per rank, records in the order they completed."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(WORLD):
        mine = sorted((x for x in recs if x["rank"] == r), key=lambda x: x["end_us"])
        p = directory / f"{host_of(r)}-pid{1000 + r}.log"
        p.write_text("".join(inspector_line(x, verbose) + "\n" for x in mine))
        paths.append(p)
    return paths


_FR_NAMES = {"reduce_scatter": "nccl:_reduce_scatter_base", "all_gather": "nccl:_all_gather_base",
             "all_reduce": "nccl:all_reduce", "all_to_all": "nccl:all_to_all"}


def flight_recorder_dump(recs: list[dict], rank: int, timed: bool = True) -> dict:
    """One rank's dump dict (``dump_dict``'s keys), entries in the order recorded; without
    ``timed`` as PyTorch writes it by default (no duration, no completion, ``scheduled``)."""
    members = comms()
    names = {c: str(i) for i, c in enumerate(members)}
    entries = []
    mine = sorted((x for x in recs if x["rank"] == rank), key=lambda x: x["end_us"])
    for i, x in enumerate(mine):
        mem = members[x["comm"]]
        p2p = x["op"] in ("send", "recv")
        if p2p:
            other = [m for m in mem if m != rank][0]
            me, peer = mem.index(rank), mem.index(other)
            name = f"nccl:send {me}->{peer}" if x["op"] == "send" else f"nccl:recv {me}<-{peer}"
        else:
            name = _FR_NAMES[x["op"]]
        entries.append({
            "record_id": i, "pg_id": int(names[x["comm"]]), "process_group": (names[x["comm"]], "undefined"),
            "thread_name": "pt_nccl_watchdg", "thread_id": "1",
            "collective_seq_id": 0 if p2p else x["sn"] + 1, "p2p_seq_id": x["sn"] + 1 if p2p else 0,
            "op_id": i + 1, "profiling_name": name, "time_created_ns": (T0_US + int(x["start_us"])) * 1000,
            "duration_ms": x["ms"], "input_sizes": [[1024]], "input_dtypes": ["Float"],
            "output_sizes": [[1024]], "output_dtypes": ["Float"], "state": "completed",
            "time_discovered_started_ns": (T0_US + int(x["start_us"])) * 1000,
            "time_discovered_completed_ns": (T0_US + int(x["end_us"]) + 50) * 1000,
            "retired": True, "timeout_ms": 600000, "is_p2p": p2p,
        })
        if not timed:
            del entries[-1]["duration_ms"]
            entries[-1].update(state="scheduled", time_discovered_started_ns=None,
                               time_discovered_completed_ns=None)
    pg_config = {names[c]: {"name": names[c], "desc": "undefined", "ranks": str(list(m))}
                 for c, m in members.items()}
    return {"version": "2.10", "comm_lib_version": "2.27.3", "pg_config": pg_config,
            "pg_status": {n: {"last_enqueued_collective": 1, "last_started_collective": 1,
                              "last_completed_collective": 1} for n in names.values()},
            "entries": entries}


def flight_recorder_files(recs: list[dict], directory: Path, as_json: bool = False, timed: bool = True,
                          hosts: bool = False) -> list[Path]:
    """A dump per rank; with ``hosts`` named ``<host>.nccl_trace_rank_<rank>``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(WORLD):
        p = directory / (f"{host_of(r)}.nccl_trace_rank_{r}" if hosts else f"nccl_trace_rank_{r}")
        dump = flight_recorder_dump(recs, r, timed)
        if as_json:
            p.write_text(json.dumps(dump))
        else:
            p.write_bytes(pickle.dumps(dump))
        paths.append(p)
    return paths
