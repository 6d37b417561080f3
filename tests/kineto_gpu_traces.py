"""GPU traces in the shape Kineto writes them, for tests/test_kineto.py.

Kernels only: no module annotations, no collective annotations; what a user gets from
torch.profiler on a model whose modules no pattern names.
"""

from __future__ import annotations

import gzip
import json

import numpy as np

WORLD, GPUS = 8, 4
HOSTS = ("trn-h100-017", "trn-h100-018")
GPU_SLOW_RANK, GPU_SLOW_FROM, GPU_ITERATIONS, GPU_SLOW_FACTOR = 5, 16, 30, 3.0
BASE_NS = 1_790_000_000_000_000_000
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
LAYERNORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
             "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
             "c10::BFloat16*)")
GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::"
        "{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl("
        "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::"
        "operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)")
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
COMPUTE_STREAM, COMM_STREAM = 7, 20




def _kernel_args(kind: str, gpu: int, stream: int, corr: int) -> dict:
    """The ``args`` Kineto writes on a device event."""
    args = {"External id": corr, "device": gpu, "context": 1, "stream": stream, "correlation": corr}
    if kind == "kernel":
        args.update({"queued": 0, "registers per thread": 128, "shared memory": 49152, "blocks per SM": 1.0,
                     "warps per SM": 8.0, "grid": [132, 1, 1], "block": [384, 1, 1],
                     "est. achieved occupancy %": 12})
    else:
        args.update({"bytes": 4194304, "memory bandwidth (GB/s)": 20.0})
    return args


def gpu_traces(folder, *, world=WORLD, iterations=GPU_ITERATIONS, slow_rank=GPU_SLOW_RANK,
               slow_from=GPU_SLOW_FROM, host_in_trace=True, handler_names=False, seed=7):
    """One Kineto-shaped trace per rank of a synchronous data-parallel job on H100s.

    Per iteration: the host prepares the batch (the GPU idles), then launches a copy, a memset,
    12 compute kernels on stream 7, a gradient all-reduce and an unannotated send/recv on stream
    20, and waits (``cudaStreamSynchronize``) until the GPU is done. The all-reduce of every rank
    ends when the last rank arrives: ``slow_rank``'s compute kernels run ``GPU_SLOW_FACTOR`` times
    longer from ``slow_from`` on, so the others wait. Returns the paths and the truth: every
    rank's compute time (ms) per iteration.
    """
    rng = np.random.default_rng(seed)
    pid = [41000 + r for r in range(world)]
    events: list[list[dict]] = [_metadata(pid[r], r % GPUS) for r in range(world)]
    compute_ms = np.zeros((world, iterations))
    corr = 100_000
    t = 1000.0
    for k in range(iterations):
        prep = 3000.0 * (1 + 0.02 * rng.standard_normal())
        plan = []   # per rank: [(cat, name, stream, launch_ts, start, dur)]
        compute_end = np.zeros(world)
        for r in range(world):
            slow = GPU_SLOW_FACTOR if (r == slow_rank and k >= slow_from) else 1.0
            rows, launch, compute_ms[r, k], compute_end[r] = _compute_rows(rng, t + prep, slow)
            plan.append((rows, launch))
        reduced = compute_end.max() + 4000.0 * (1 + 0.02 * rng.standard_normal())
        ends = np.zeros(world)
        for r in range(world):
            rows, launch = plan[r]
            rows.append(("kernel", ALLREDUCE, COMM_STREAM, launch, compute_end[r], reduced - compute_end[r]))
            p2p = 1500.0 * (1 + 0.02 * rng.standard_normal())
            rows.append(("kernel", SENDRECV, COMM_STREAM, launch + 12.0, reduced, p2p))
            copy = 50.0 * (1 + 0.02 * rng.standard_normal())
            rows.append(("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", COMPUTE_STREAM, launch + 24.0,
                         reduced + p2p, copy))
            gpu_done = reduced + p2p + copy
            ends[r] = gpu_done + 200.0
            corr = _iteration_events(events[r], pid[r], r % GPUS, k, t, ends[r], gpu_done, rows, corr)
        t = ends.max() + 100.0
    paths = [_write(folder, r, world, pid[r], events[r], host_in_trace, handler_names) for r in range(world)]
    return paths, compute_ms


def _metadata(pid: int, gpu: int) -> list[dict]:
    """The process and thread names a rank's trace starts with."""
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "process_name", "pid": gpu, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_labels", "pid": gpu, "tid": 0, "args": {"labels": f"GPU {gpu}"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": f"thread {pid} (python3)"}},
        *({"ph": "M", "name": "thread_name", "pid": gpu, "tid": s, "args": {"name": f"stream {s} "}}
          for s in (COMPUTE_STREAM, COMM_STREAM)),
    ]


def _compute_rows(rng, launch: float, slow: float) -> tuple[list[tuple], float, float, float]:
    """One rank's copy, memset and compute kernels of an iteration launched from ``launch``:
    ``(rows, next launch, compute ms, end of the compute on the GPU)``."""
    gpu_free = launch + 8.0
    items = [("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 400.0),
             ("gpu_memset", "Memset (Device)", 5.0)]
    items += [("kernel", name, dur) for _ in range(4)
              for name, dur in ((GEMM, 3000.0), (LAYERNORM, 300.0), (GELU, 400.0))]
    rows = []
    busy = 0.0
    for cat, name, dur in items:
        d = dur * (1 + 0.02 * rng.standard_normal()) * (slow if cat == "kernel" else 1.0)
        start = max(gpu_free, launch + 5.0)
        rows.append((cat, name, COMPUTE_STREAM, launch, start, d))
        gpu_free = start + d
        launch += 12.0
        if cat == "kernel":
            busy += d
    return rows, launch, busy / 1000.0, gpu_free


def _iteration_events(ev: list[dict], pid: int, gpu: int, k: int, t: float, end: float, gpu_done: float,
                      rows: list[tuple], corr: int) -> int:
    """Append iteration ``k`` of one rank to its events; returns the next correlation id."""
    ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": pid,
               "tid": pid, "ts": t, "dur": end - t, "args": {"External id": corr}})
    ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{k}", "pid": gpu,
               "tid": COMPUTE_STREAM, "ts": rows[0][4], "dur": gpu_done - rows[0][4],
               "args": {"External id": corr}})
    corr += 1
    for cat, name, stream, launch_ts, start, dur in rows:
        api = {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync", "gpu_memset": "cudaMemsetAsync"}[cat]
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": pid, "tid": pid,
                   "ts": launch_ts, "dur": 4.0, "args": {"External id": corr, "cbid": 211, "correlation": corr}})
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": gpu, "tid": stream, "ts": start, "dur": dur,
                   "args": _kernel_args(cat, gpu, stream, corr)})
        ev.append({"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": launch_ts, "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "f", "id": corr, "pid": gpu, "tid": stream, "ts": start, "cat": "ac2g",
                   "name": "ac2g", "bp": "e"})
        corr += 1
    last_launch = rows[-1][3] + 4.0
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": pid,
               "tid": pid, "ts": last_launch, "dur": gpu_done - last_launch,
               "args": {"External id": corr, "cbid": 131, "correlation": corr}})
    return corr + 1


def _write(folder, r: int, world: int, pid: int, events: list[dict], host_in_trace: bool,
           handler_names: bool):
    """Rank ``r``'s trace file, gzip JSON as Kineto writes it."""
    host = HOSTS[r // GPUS]
    doc = {"schemaVersion": 1,
           "deviceProperties": [{"id": i, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045870592,
                                 "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
                                 "warpSize": 32, "numSms": 132} for i in range(GPUS)],
           "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world, "pg_count": 1,
                               "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
                                              "backend_config": "cuda:nccl", "pg_size": world,
                                              "ranks": list(range(world))}],
                               "nccl_version": "2.21.5"},
           "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS, "traceEvents": events}
    if host_in_trace:
        doc["host_name"] = host
    name = (f"{host}_{pid}.{BASE_NS + r}.pt.trace.json.gz" if handler_names
            else f"rank{r}.{BASE_NS + r}.pt.trace.json.gz")
    path = folder / name
    doc["traceName"] = str(path)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path
