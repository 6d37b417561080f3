"""NCCL Inspector logs of a job on two hosts, made by a timing model of its own (not the
simulator's): per layer each GPU computes, then the GPUs of each host all-reduce over NVLink
(an intra-node communicator, as tensor parallelism runs), and once an iteration each GPU
all-reduces its gradients with the GPU of the same local index on the other host (a
cross-host communicator), then the job-wide communicator all-reduces the loss.

A collective ends for all its members when the last one arrived plus its transfer, so each
member's ``coll_exec_time_us`` is its wait for the last arrival plus the transfer. A slow GPU
makes its host's all-reduce wait for it (it waits least there), and its whole host arrives late
at the cross-host all-reduce, where the other host waits: from outside, all eight GPUs of the
slow host look late; only the intra-node collective says which one was.

Noise: per-GPU persistent speed (2%), per-layer jitter (4%), transfers (5%), and now and then
one GPU of either host preempted for one layer (up to 5x), as a busy host does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

T0_US = 1_765_000_000_000_000


@dataclass(frozen=True)
class TwoHostJob:
    """The job's shape and its fault."""

    gpus: int = 8                  # GPUs per host
    hosts: tuple[str, ...] = ("gpu-a17.cluster.example", "gpu-b03.cluster.example")
    layers: int = 6
    layer_ms: float = 12.0         # compute of one layer on one GPU
    nvlink_ms: float = 0.4         # intra-node all-reduce transfer
    ring_ms: float = 30.0          # cross-host gradient all-reduce transfer
    loss_ms: float = 0.2
    slow_rank: int | None = 11
    slow_from: int = 15
    slow_until: int | None = None
    factor: float = 3.0
    iterations: int = 40
    seed: int = 0
    preempt_rate: float = 0.002    # per GPU and layer

    @property
    def world(self) -> int:
        return self.gpus * len(self.hosts)

    def host_of(self, rank: int) -> str:
        return self.hosts[rank // self.gpus]


def _comms(job: TwoHostJob) -> dict[str, tuple[int, ...]]:
    out = {"0x7e57000000000001": tuple(range(job.world))}
    for h in range(len(job.hosts)):
        out[f"0x1a7a{h:012x}"] = tuple(range(h * job.gpus, (h + 1) * job.gpus))
    for g in range(job.gpus):
        out[f"0xd9{g:014x}"] = tuple(g + h * job.gpus for h in range(len(job.hosts)))
    return out


def records(job: TwoHostJob) -> list[dict]:
    """Every rank's collectives in the order run: rank, comm, coll, sn, start_us, end_us."""
    rng = np.random.default_rng(job.seed)
    comms = _comms(job)
    speed = np.exp(0.02 * rng.standard_normal(job.world))
    clock = np.zeros(job.world)
    sn = {c: 0 for c in comms}
    out: list[dict] = []

    def coll(comm: str, base_ms: float) -> None:
        ranks = list(comms[comm])
        end = clock[ranks].max() + base_ms * 1000.0 * np.exp(0.05 * rng.standard_normal())
        for r in ranks:
            out.append({"rank": r, "comm": comm, "coll": "AllReduce", "sn": sn[comm],
                        "start_us": float(clock[r]), "end_us": float(end)})
            clock[r] = end
        sn[comm] += 1

    for it in range(job.iterations):
        slow = job.slow_rank is not None and it >= job.slow_from and (job.slow_until is None or it < job.slow_until)
        for _ in range(job.layers):
            c = job.layer_ms * 1000.0 * speed * np.exp(0.04 * rng.standard_normal(job.world))
            c *= np.where(rng.random(job.world) < job.preempt_rate, rng.uniform(1.5, 5.0, job.world), 1.0)
            if slow:
                c[job.slow_rank] *= job.factor
            clock[:] += c
            for h in range(len(job.hosts)):
                coll(f"0x1a7a{h:012x}", job.nvlink_ms)
        for g in range(job.gpus):
            coll(f"0xd9{g:014x}", job.ring_ms)
        coll("0x7e57000000000001", job.loss_ms)
    return out


def inspector_files(job: TwoHostJob, directory: Path) -> list[Path]:
    """``<hostname>-pid<pid>.log`` per rank, verbose records (kernel timestamps)."""
    directory.mkdir(parents=True, exist_ok=True)
    comms = _comms(job)
    by_rank: dict[int, list[str]] = {r: [] for r in range(job.world)}
    for rec in records(job):
        members = comms[rec["comm"]]
        start, end = T0_US + int(rec["start_us"]), T0_US + int(rec["end_us"])
        perf = {"coll": rec["coll"], "coll_sn": rec["sn"], "coll_msg_size_bytes": 1 << 26,
                "coll_exec_time_us": end - start, "coll_timing_source": "kernel_gpu",
                "coll_algobw_gbs": 150.0, "coll_busbw_gbs": 140.0,
                "event_trace_ts": {"coll_start_ts": start - 8, "coll_stop_ts": start - 2,
                                   "kernel_events": [{"channel_id": 0, "kernel_start_ts": start,
                                                      "kernel_stop_ts": end, "kernel_record_ts": end}]}}
        line = {"header": {"id": rec["comm"], "rank": members.index(rec["rank"]), "n_ranks": len(members),
                           "nnodes": len({job.host_of(m) for m in members})},
                "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "",
                             "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": end + 250,
                             "hostname": job.host_of(rec["rank"]), "pid": 4000 + rec["rank"]},
                "coll_perf": perf}
        by_rank[rec["rank"]].append(json.dumps(line, separators=(",", ":")))
    paths = []
    for r, lines in by_rank.items():
        p = directory / f"{job.host_of(r)}-pid{4000 + r}.log"
        p.write_text("\n".join(lines) + "\n")
        paths.append(p)
    return paths
