"""NCCL Inspector's Prometheus textfiles, written as the plugin writes them, for a simulated job.

The plugin (NVIDIA/nccl ``ext-profiler/inspector/inspector_prom.cc``, ``NCCL_INSPECTOR_PROM_DUMP=1``)
keeps one file per GPU, ``<NCCL_INSPECTOR_DUMP_DIR>/nccl_inspector_metrics_<gpu-uuid>.prom``. Its
dump thread wakes every ``NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS`` (30 s at least in
this mode), truncates the file in place and writes, for every communicator of the GPU that
completed a collective since the last dump, that latest collective's three samples, no HELP or
TYPE line::

    nccl_algorithm_bandwidth_gbs{<labels>} %.6g
    nccl_bus_bandwidth_gbs{<labels>} %.6g
    nccl_collective_exec_time_microseconds{<labels>} %.6g

with the labels ``comm_id, hostname, rank, slurm_job, slurm_job_id, nranks, n_nodes,
gpu_device_id`` (``GPU<cuda device>``), then ``collective, coll_sn, timestamp`` (the dump's UTC
second, ``%Y-%m-%dT%H:%M:%SZ``) and ``message_size`` (``64.00MB``). ``rank`` is the rank in
the communicator.

The job: 16 ranks on 2 nodes (``node-a`` ranks 0-7, ``node-b`` 8-15, one GPU each), pure data
parallel. Per iteration: compute, an AllGather on each node's communicator, compute, the
gradient AllReduce on the job-wide communicator. A collective ends for all its members when
the last one arrived plus its transfer, so each member's measured time is its wait for the
last arrival plus the transfer. From ``onset_s`` one rank computes ``factor`` times slower.
Each rank's dump thread runs on its own phase within the interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WORLD, GPUS_PER_NODE = 16, 8
HOSTS = ("node-a", "node-b")
SLOW_RANK = 11
WORLD_COMM = "0x7f8c496ae9f661"
NODE_COMMS = ("0x1d2c3b4a596877", "0x5e6f708192a3b4")
#: Sequence numbers of the first collective of each communicator (a job that ran before).
FIRST_SN = {WORLD_COMM: 5000, NODE_COMMS[0]: 9000, NODE_COMMS[1]: 9000}
#: A fixed start (2026-03-02T00:00:00Z, epoch s): the analysis does not depend on it.
T0_S = 1_772_409_600
INTERVAL_S = 30
LAYOUT = ["--dp", str(WORLD), "--gpus-per-node", str(GPUS_PER_NODE)]


def host_of(rank: int) -> str:
    return HOSTS[rank // GPUS_PER_NODE]


def gpu_uuid(rank: int) -> str:
    return f"6b3a4f52-1c0e-8a9d-2f71-{rank // GPUS_PER_NODE:06x}{rank % GPUS_PER_NODE:06x}"


@dataclass
class Run:
    """Every collective of the run: per communicator, the end (s from T0) of each collective
    and each member's execution time (us), members in communicator-rank order."""

    ends: dict[str, np.ndarray]
    exec_us: dict[str, np.ndarray]          # (collectives, members)
    members: dict[str, tuple[int, ...]]
    phase_s: np.ndarray                     # each rank's dump thread phase
    onset_s: float
    iteration_s: tuple[float, float]        # median iteration time before / after the onset


def simulate(duration_s: float, onset_s: float, slow_rank: int | None = SLOW_RANK, factor: float = 3.0,
             seed: int = 0) -> Run:
    """The job's collectives until ``duration_s`` (about 0.25 s per iteration while healthy)."""
    rng = np.random.default_rng(seed)
    node = np.arange(WORLD) // GPUS_PER_NODE
    ends, execs = {c: [] for c in (WORLD_COMM, *NODE_COMMS)}, {c: [] for c in (WORLD_COMM, *NODE_COMMS)}
    t, lengths, onset_at = 0.0, [], None
    while t < duration_s:
        slow = np.ones(WORLD)
        if slow_rank is not None and t >= onset_s:
            slow[slow_rank] = factor
            onset_at = len(lengths) if onset_at is None else onset_at
        arrive = t + 0.100 * (1 + 0.03 * rng.standard_normal(WORLD)) * slow
        gathered = np.array([arrive[node == n].max() for n in range(len(HOSTS))]) + 0.004
        for n, comm in enumerate(NODE_COMMS):
            ends[comm].append(gathered[n])
            execs[comm].append((gathered[n] - arrive[node == n]) * 1e6 + 20)
        arrive = gathered[node] + 0.130 * (1 + 0.03 * rng.standard_normal(WORLD)) * slow
        end = arrive.max() + 0.015 * (1 + 0.03 * rng.standard_normal())
        ends[WORLD_COMM].append(end)
        execs[WORLD_COMM].append((end - arrive) * 1e6 + 20)
        lengths.append(end - t)
        t = end
    lengths = np.asarray(lengths)
    before = float(np.median(lengths[:onset_at])) if onset_at else float(np.median(lengths))
    after = float(np.median(lengths[onset_at:])) if onset_at else before
    members = {WORLD_COMM: tuple(range(WORLD)),
               **{c: tuple(range(n * GPUS_PER_NODE, (n + 1) * GPUS_PER_NODE)) for n, c in enumerate(NODE_COMMS)}}
    return Run({c: np.asarray(v) for c, v in ends.items()}, {c: np.asarray(v) for c, v in execs.items()},
               members, rng.uniform(0, INTERVAL_S - 1, WORLD), onset_s, (before, after))


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(seconds)))


def _size(nbytes: int) -> str:
    size, unit = float(nbytes), 0
    while size >= 1024 and unit < 4:
        size, unit = size / 1024, unit + 1
    return f"{nbytes}B" if unit == 0 else f"{size:.2f}{('B', 'KB', 'MB', 'GB', 'TB')[unit]}"


def _coll_lines(run: Run, comm: str, rank: int, i: int, dump_s: float, job_id: str) -> str:
    members = run.members[comm]
    me = members.index(rank)
    us = float(run.exec_us[comm][i, me])
    coll, nbytes = ("AllReduce", 64 << 20) if comm == WORLD_COMM else ("AllGather", 8 << 20)
    algbw = nbytes / (us * 1e-6) / 1e9
    busbw = algbw * (2 if coll == "AllReduce" else 1) * (len(members) - 1) / len(members)
    labels = (f'comm_id="{comm}",hostname="{host_of(rank)}",rank="{me}",slurm_job="pretrain",'
              f'slurm_job_id="{job_id}",nranks="{len(members)}",'
              f'n_nodes="{len({host_of(m) for m in members})}",gpu_device_id="GPU{rank % GPUS_PER_NODE}",'
              f'collective="{coll}",coll_sn="{FIRST_SN[comm] + i}",timestamp="{_stamp(T0_S + dump_s)}",'
              f'message_size="{_size(nbytes)}"')
    return (f"nccl_algorithm_bandwidth_gbs{{{labels}}} {algbw:.6g}\n"
            f"nccl_bus_bandwidth_gbs{{{labels}}} {busbw:.6g}\n"
            f"nccl_collective_exec_time_microseconds{{{labels}}} {us:.6g}\n")


def snapshot(run: Run, rank: int, k: int, job_id: str = "4711") -> str:
    """Rank ``rank``'s file after its ``k``-th dump: the latest collective of each of its
    communicators (those that completed one since the previous dump)."""
    dump_s = INTERVAL_S * (k + 1) + run.phase_s[rank]
    prev_s = dump_s - INTERVAL_S
    text = ""
    for comm, members in run.members.items():
        if rank in members:
            i = int(np.searchsorted(run.ends[comm], dump_s, side="right")) - 1
            if i >= 0 and run.ends[comm][i] > prev_s:
                text += _coll_lines(run, comm, rank, i, dump_s, job_id)
    return text


def file_of(directory: Path, rank: int) -> Path:
    return directory / f"nccl_inspector_metrics_{gpu_uuid(rank)}.prom"


def write_snapshot(run: Run, dirs: dict[str, Path], k: int, job_id: str = "4711") -> int:
    """Every rank's file rewritten in place with its ``k``-th dump, in its host's directory
    (``dirs[host]``), as the plugin's dump thread does (truncate, then write). The number of
    exec-time samples written."""
    n = 0
    for rank in range(WORLD):
        text = snapshot(run, rank, k, job_id)
        with open(file_of(dirs[host_of(rank)], rank), "w") as fh:
            fh.write(text)
        n += text.count("nccl_collective_exec_time_microseconds")
    return n
