"""The Kineto trace importer: on traces torch.profiler records here from a real gloo DDP run, and on
GPU traces generated in the shape Kineto writes them (kernels only, several ranks, one slowed)."""

from __future__ import annotations

import gzip
import json
import statistics

import numpy as np
import pytest

from collector.kineto import (
    StagePatterns,
    TraceError,
    grouped_union_length,
    load_trace,
    summarise_trace,
    trace_host,
)
from collector.stage_timer import union_length
from evaluation.torch_demo import DemoConfig, run_demo
from rankscope.cli import main as cli_main
from tests.kineto_gpu_traces import (
    GELU,
    GEMM,
    GPU_ITERATIONS,
    GPU_SLOW_FROM,
    GPU_SLOW_RANK,
    GPUS,
    HOSTS,
    LAYERNORM,
    WORLD,
    gpu_traces,
)
from tests.torch_alone import alone

SLOW_RANK, SLOW_FROM = 1, 4


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """One trace per rank of a 4-process run whose rank 1 is slow in mlp from iteration 4."""
    folder = tmp_path_factory.mktemp("traces")
    cfg = DemoConfig(world=4, iterations=8, instrument=False, profile_dir=str(folder),
                     slow_rank=SLOW_RANK, slow_from=SLOW_FROM, slow_factor=300)
    with alone():
        res = run_demo(cfg)
    paths = [r.trace for r in res.ranks]
    assert all(paths)
    return paths


@pytest.fixture(scope="module")
def summaries(traces):
    return [summarise_trace(load_trace(p), StagePatterns.default(), p) for p in traces]


def test_each_trace_is_one_rank_cut_into_its_profiler_steps(summaries):
    assert [s.rank for s in summaries] == [0, 1, 2, 3]
    assert all(s.world == 4 for s in summaries)
    for s in summaries:
        assert s.iterations == list(range(1, 8))  # ProfilerStep#1..7 (step 0 = profiler warm-up)
        assert all(ms > 0 for ms in s.iteration_ms)
        assert s.end_ms == sorted(s.end_ms) and s.end_ms[0] > 1.7e12  # epoch ms
        for st in s.stage_ms:
            assert {"attention", "mlp", "reduce_scatter", "optimizer"} <= set(st)
            assert sum(st.values()) <= s.iteration_ms[s.stage_ms.index(st)] * 1.01 + 1


def test_slow_rank_shows_in_mlp_and_the_others_wait_in_the_all_reduce(summaries):
    def med(rank, stage, slow):
        s = summaries[rank]
        return statistics.median(v[stage] for it, v in zip(s.iterations, s.stage_ms, strict=True)
                                 if (it >= SLOW_FROM) == slow)

    # quiet machine: ~5x; the margins leave room for a loaded one
    healthy = [r for r in range(4) if r != SLOW_RANK]
    slow_mlp = med(SLOW_RANK, "mlp", True)
    assert slow_mlp > 1.5 * max(med(r, "mlp", True) for r in healthy)
    assert slow_mlp > 1.5 * med(SLOW_RANK, "mlp", False)
    # healthy ranks wait for the slow one inside the collective; the slow one does not
    assert min(med(r, "reduce_scatter", True) for r in healthy) > 1.5 * med(SLOW_RANK, "reduce_scatter", True)


def test_backward_operators_of_a_module_count_for_its_stage(traces):
    data = load_trace(traces[0])
    linked = summarise_trace(data, StagePatterns.default(), traces[0])
    forward_only = summarise_trace(data, StagePatterns.default(), traces[0], link_backward=False)
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in data["traceEvents"]
                   if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"))
    fwd = [e for e in data["traceEvents"] if e.get("name", "").startswith("nn.Module: MoEMLP")]
    for k, (a, b) in enumerate(steps):
        # without the links: exactly the module's forward events of the step
        fwd_ms = sum(e["dur"] for e in fwd if a <= e["ts"] <= b) / 1000
        assert forward_only.stage_ms[k]["mlp"] == pytest.approx(fwd_ms, abs=1e-3)
        # with them: plus the backward operators, which run after the forward
        assert linked.stage_ms[k]["mlp"] > forward_only.stage_ms[k]["mlp"]


def test_import_trace_cli_writes_stage_latency(traces, summaries, influx_store, capsys):
    rc = cli_main(["import-trace", *traces, "--job", "traced", "--store", influx_store.url,
                   "--bucket", influx_store.bucket, "--gpus-per-node", "2", "--dp", "4"])
    assert rc == 0
    out = capsys.readouterr()
    assert "imported 28 point(s)" in out.out and "[4/4]" in out.err
    df = influx_store.read_stage_latency("traced")
    assert len(df) == 28 and sorted(set(df["rank"])) == [0, 1, 2, 3]
    assert sorted(set(df["node"])) == [0, 1]
    row = df[(df["rank"] == SLOW_RANK) & (df["iteration"] == 5)].iloc[0]
    want = summaries[SLOW_RANK].stage_ms[summaries[SLOW_RANK].iterations.index(5)]
    assert row["mlp"] == pytest.approx(want["mlp"], rel=1e-6)


def test_patterns_from_the_command_line_and_a_config_file(traces, influx_store, tmp_path, capsys):
    conf = tmp_path / "trace.toml"
    conf.write_text('[trace.patterns]\nmlp = ["^aten::gelu"]\n')
    args = ["import-trace", traces[0], "--job", "gelu", "--store", influx_store.url,
            "--bucket", influx_store.bucket, "--config", str(conf)]
    assert cli_main(args) == 0
    gelu = influx_store.read_stage_latency("gelu")
    full = summarise_trace(load_trace(traces[0]), StagePatterns.default(), traces[0])
    assert (gelu["mlp"].to_numpy() < [st["mlp"] for st in full.stage_ms]).all()
    assert cli_main(["import-trace", traces[0], "--job", "x", "--store", influx_store.url,
                     "--pattern", "mlp=("]) == 1
    assert "bad pattern" in capsys.readouterr().err
    assert cli_main(["import-trace", traces[0], "--job", "x", "--store", influx_store.url,
                     "--pattern", "nope=x"]) == 1
    assert "unknown stage 'nope'" in capsys.readouterr().err


def test_gpu_kernels_are_attributed_by_launch_and_measured_on_the_device(tmp_path):
    """A minimal GPU-shaped trace: kernels run after their launch, linked by correlation."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "python_function", "name": "nn.Module: ExpertMLP_0", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12, "dur": 2,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 50, "dur": 2,
         "args": {"correlation": 8}},
        {"ph": "X", "cat": "kernel", "name": "sm80_gemm", "pid": 0, "tid": 7, "ts": 60, "dur": 300,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 9,
         "ts": 400, "dur": 50, "args": {"correlation": 8}},
    ]
    path = tmp_path / "rank3.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": ev, "baseTimeNanoseconds": 10**18}).encode()))
    s = summarise_trace(load_trace(path), StagePatterns.default(), path)
    assert s.rank == 3 and s.iterations == [3]
    # device time, not the 20 us on host; the GPU ran only 60-100 of the 0-100 window: idle 60 us
    assert s.stage_ms[0] == pytest.approx({"mlp": 0.3, "reduce_scatter": 0.05, "host_idle": 0.06})


def test_unusable_traces_are_refused_with_a_reason(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(TraceError, match="not a JSON trace"):
        load_trace(bad)
    nosteps = tmp_path / "rank0.json"
    nosteps.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 0, "dur": 1}]}))
    with pytest.raises(TraceError, match="no ProfilerStep"):
        summarise_trace(load_trace(nosteps), StagePatterns.default(), nosteps)
    norank = tmp_path / "trace.json"
    norank.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(TraceError, match="no rank"):
        summarise_trace(load_trace(norank), StagePatterns.default(), norank)


# ------------------------------------------------------------------ GPU traces in Kineto's shape


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    return gpu_traces(tmp_path_factory.mktemp("gpu_traces"))


def test_kernel_only_traces_yield_compute_and_comm_stages_with_host_and_gpu(gpu_run):
    paths, compute_ms = gpu_run
    for r, p in enumerate(paths):
        s = summarise_trace(load_trace(p), StagePatterns.default(), p)
        assert (s.rank, s.world, s.host, s.gpu) == (r, WORLD, HOSTS[r // GPUS], r % GPUS)
        # the GPU copies of ProfilerStep annotations are not iterations of their own
        assert s.iterations == list(range(GPU_ITERATIONS))
        for k, st in enumerate(s.stage_ms):
            assert set(st) == {"compute_other", "memcpy", "reduce_scatter", "comm_other", "host_idle"}
            # one compute stream: the union is the sum of the kernels generated
            assert st["compute_other"] == pytest.approx(compute_ms[r, k], abs=1e-6)
            assert st["memcpy"] == pytest.approx(0.455, rel=0.1)           # 400 + 5 + 50 us
            assert st["comm_other"] == pytest.approx(1.5, rel=0.1)          # the send/recv
            assert st["host_idle"] == pytest.approx(3.2, rel=0.1)          # batch preparation + tail
            busy = st["compute_other"] + st["memcpy"] + st["reduce_scatter"] + st["comm_other"]
            assert busy + st["host_idle"] == pytest.approx(s.iteration_ms[k], rel=0.01)


def test_kernel_only_traces_show_the_slow_rank_and_its_waiting_peers(gpu_run):
    paths, _ = gpu_run
    s = [summarise_trace(load_trace(p), StagePatterns.default(), p) for p in paths]

    def med(r, stage, slow):
        return statistics.median(v[stage] for it, v in zip(s[r].iterations, s[r].stage_ms, strict=True)
                                 if (it >= GPU_SLOW_FROM) == slow)

    healthy = [r for r in range(WORLD) if r != GPU_SLOW_RANK]
    assert med(GPU_SLOW_RANK, "compute_other", True) > 2.5 * max(med(r, "compute_other", True) for r in healthy)
    assert med(GPU_SLOW_RANK, "compute_other", True) > 2.5 * med(GPU_SLOW_RANK, "compute_other", False)
    # the others wait for it inside the all-reduce kernel; it does not
    assert min(med(r, "reduce_scatter", True) for r in healthy) > 5 * med(GPU_SLOW_RANK, "reduce_scatter", True)


def test_a_slowed_rank_in_kernel_only_traces_is_named_with_its_host(gpu_run, influx_store, capsys):
    from analyzer.service.run_once import run_once

    paths, _ = gpu_run
    rc = cli_main(["import-trace", *map(str, paths), "--job", "kernels", "--store", influx_store.url,
                   "--bucket", influx_store.bucket])
    assert rc == 0
    out = capsys.readouterr()
    assert f"imported {WORLD * GPU_ITERATIONS} point(s)" in out.out
    assert f"hosts {HOSTS[0]}, {HOSTS[1]}" in out.out and "host trn-h100-018, gpu 1" in out.err
    df = influx_store.read_stage_latency("kernels")
    tags = df.groupby("rank")[["host", "gpu", "node"]].first()
    assert tags["host"].tolist() == [HOSTS[r // GPUS] for r in range(WORLD)]
    assert tags["gpu"].tolist() == [r % GPUS for r in range(WORLD)]
    assert tags["node"].tolist() == [r // GPUS for r in range(WORLD)]
    incidents = run_once(influx_store, job="kernels")
    named = [i for i in incidents if i["class"] == "compute_straggler"]
    assert named, [(i["class"], i["ranks"], i["stage"]) for i in incidents]
    first = named[0]
    assert first["ranks"] == [GPU_SLOW_RANK] and first["hosts"] == [HOSTS[1]]
    assert first["stage"] == "compute_other"
    assert GPU_SLOW_FROM <= first["onset_iteration"] < GPU_ITERATIONS
    # nothing else is blamed: the waiting peers' all-reduce is a symptom, not an incident
    assert all(i["ranks"] == [GPU_SLOW_RANK] for i in incidents)


@pytest.mark.parametrize("name, stage", [
    # kernels of NCCL >= 2.19, 2.8-2.18 and older
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_SIMPLE(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
    ("ncclDevKernel_Reduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "reduce_scatter"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "all_gather"),
    ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", "reduce_scatter"),
    ("ncclAllGatherRingLLKernel_copy_i8(ncclColl)", "all_gather"),
    # a SendRecv kernel is an all-to-all or a p2p transfer: its launch or collective decides
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", None),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", None),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", None),
    # PyTorch's annotations and c10d operators
    ("nccl:all_to_all", "dispatch"), ("c10d::alltoall_base_", "dispatch"), ("c10d::alltoall_", "dispatch"),
    ("nccl:all_reduce", "reduce_scatter"), ("c10d::allreduce_", "reduce_scatter"),
    ("nccl:_reduce_scatter_base", "reduce_scatter"), ("nccl:reduce_scatter_tensor_coalesced", "reduce_scatter"),
    ("c10d::_reduce_scatter_base_", "reduce_scatter"), ("gloo:all_reduce", "reduce_scatter"),
    ("nccl:_all_gather_base", "all_gather"), ("nccl:all_gather_into_tensor_coalesced", "all_gather"),
    ("c10d::_allgather_base_", "all_gather"), ("nccl:broadcast", "all_gather"), ("c10d::broadcast_", "all_gather"),
    ("nccl:send 0->1", "pp_send"), ("c10d::send", "pp_send"), ("nccl:recv 1<-0", "pp_recv"),
    ("c10d::recv_", "pp_recv"), ("rankscope:combine", "combine"),
    ("record_param_comms", None), ("nccl:barrier", None), ("aten::mm", None),
])
def test_nccl_names_map_to_their_stages(name, stage):
    assert StagePatterns.default().stage_of(name) == stage


def test_send_recv_kernels_follow_their_launch_or_collective_and_never_count_as_compute(tmp_path):
    """One step; four SendRecv kernels: launched inside an all-to-all, inside a send, carrying
    the collective 'recv', and launched inside an MLP module (communication, not the MLP's)."""
    sendrecv = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 9, "tid": 9, "ts": 0, "dur": 1000}]
    hosts = [("nccl:all_to_all", 10), ("nccl:send 0->1", 200), (None, 400), ("nn.Module: ParallelMLP_0", 600)]
    for j, (annotation, at) in enumerate(hosts):
        if annotation:
            ev.append({"ph": "X", "cat": "user_annotation", "name": annotation, "pid": 9, "tid": 9, "ts": at,
                       "dur": 50})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9, "ts": at + 10,
                   "dur": 5, "args": {"correlation": j}})
        args = {"correlation": j, "device": 2, "stream": 20}
        if annotation is None:
            args["Collective name"] = "recv"
        ev.append({"ph": "X", "cat": "kernel", "name": sendrecv, "pid": 2, "tid": 20, "ts": at + 20,
                   "dur": 10 * (j + 1), "args": args})
    # the MLP module's own compute kernel counts for it
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9, "ts": 615,
               "dur": 5, "args": {"correlation": 9}})
    ev.append({"ph": "X", "cat": "kernel", "name": GEMM, "pid": 2, "tid": 7, "ts": 700, "dur": 70,
               "args": {"correlation": 9, "device": 2, "stream": 7}})
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    s = summarise_trace(load_trace(path), StagePatterns.default(), path)
    assert s.gpu == 2 and s.host is None
    got = s.stage_ms[0]
    assert got.pop("host_idle") == pytest.approx((1000 - 10 - 20 - 30 - 40 - 70) / 1000)
    assert got == pytest.approx({"dispatch": 0.01, "pp_send": 0.02, "pp_recv": 0.03, "comm_other": 0.04,
                                 "mlp": 0.07})


def test_host_from_the_handler_file_name_and_a_host_map_that_wins(tmp_path, influx_store, capsys):
    named_dir, bare_dir = tmp_path / "named", tmp_path / "bare"
    named_dir.mkdir()
    bare_dir.mkdir()
    # tensorboard_trace_handler's default names (<host>_<pid>.<time>.pt.trace.json.gz), no host_name
    named, _ = gpu_traces(named_dir, world=4, iterations=3, slow_rank=-1, host_in_trace=False,
                          handler_names=True)
    assert [summarise_trace(load_trace(p), StagePatterns.default(), p).host for p in named] == \
        [HOSTS[0]] * 4
    # traces with Kineto's host_name, and a map (JSON) that overrides two ranks of them
    bare, _ = gpu_traces(bare_dir, world=4, iterations=3, slow_rank=-1)
    hmap = tmp_path / "hosts.json"
    hmap.write_text(json.dumps({"0-1": "node-a", "2,3": "node-b"}))
    assert cli_main(["import-trace", *map(str, bare), "--job", "mapped", "--store", influx_store.url,
                     "--bucket", influx_store.bucket, "--host-map", str(hmap)]) == 0
    assert "hosts node-a, node-b" in capsys.readouterr().out
    df = influx_store.read_stage_latency("mapped")
    tags = df.groupby("rank")[["host", "node", "gpu"]].first()
    assert tags["host"].tolist() == ["node-a", "node-a", "node-b", "node-b"]
    assert tags["node"].tolist() == [0, 0, 1, 1]      # node tags follow the hosts: 2 ranks each
    assert tags["gpu"].tolist() == [0, 1, 2, 3]       # the GPU still comes from the trace
    # TOML, a [hosts] table, partial: rank 3 keeps the host its trace records
    toml = tmp_path / "hosts.toml"
    toml.write_text('[hosts]\n0-2 = "node-c"\n')
    assert cli_main(["import-trace", *map(str, bare), "--job", "partial", "--store", influx_store.url,
                     "--bucket", influx_store.bucket, "--host-map", str(toml)]) == 0
    err = capsys.readouterr().err
    assert "do not hold" in err   # 3 + 1 ranks per host: node tags stay the block placement
    df = influx_store.read_stage_latency("partial")
    assert df.groupby("rank")["host"].first().tolist() == ["node-c"] * 3 + [HOSTS[0]]
    # a rank mapped to two hosts is refused with the reason
    bad = tmp_path / "bad.toml"
    bad.write_text('0-1 = "x"\n1 = "y"\n')
    assert cli_main(["import-trace", *map(str, bare), "--job", "bad", "--store", influx_store.url,
                     "--host-map", str(bad)]) == 1
    assert "rank 1 is mapped to 'x' and 'y'" in capsys.readouterr().err


def test_host_added_as_metadata_wins_over_kinetos_own():
    """In a container Kineto's host_name is the container's; prof.add_metadata("hostname", ...) names
    the machine. Neither: the handler's default file name; a rank-style worker name is no host."""
    both = {"traceEvents": [], "host_name": "trainer-pod-7f9c", "hostname": "gpu-node-017"}
    assert trace_host(both, "rank0.json") == "gpu-node-017"
    assert trace_host({"traceEvents": [], "host_name": "vm"}, "x.json") == "vm"
    assert trace_host({"traceEvents": []}, "dgx-a_4242.1790000000000000000.pt.trace.json.gz") == "dgx-a"
    assert trace_host({"traceEvents": []}, "rank_3.1790000000000000000.pt.trace.json") is None
    assert trace_host({"traceEvents": []}, "sampled_rank-0.json.gz") is None


def test_grouped_union_matches_a_plain_union_per_group():
    rng = np.random.default_rng(3)
    n, groups = 2000, 37
    g = rng.integers(0, groups, n)
    a = rng.uniform(0, 1e4, n) + 1.7e15          # epoch microseconds, as in real traces
    b = a + rng.exponential(50, n)
    got = grouped_union_length(g, a, b, groups + 2)
    want = [union_length([(x, y) for x, y, gg in zip(a, b, g, strict=True) if gg == k]) if (g == k).any() else 0.0
            for k in range(groups + 2)]
    assert got == pytest.approx(want, abs=1e-3)
    assert got[-2:].tolist() == [0.0, 0.0]


def test_import_trace_kernels_feed_l3_which_names_the_slow_rank_and_kernel(gpu_run, influx_store, capsys):
    """``--kernels 10``: three windows a rank, compressed as the live channel does; L3 names rank 5's
    compute kernels (all 3x from step 16) on its host, confirmed in two windows, and not the peers
    that wait in the all-reduce."""
    from analyzer.service.analyzer_service import AnalyzerService
    from rankscope import schema
    from rankscope.kernel_names import kernel_id

    paths, _ = gpu_run
    rc = cli_main(["import-trace", *map(str, paths), "--job", "k", "--kernels", "10", "--store", influx_store.url,
                   "--bucket", influx_store.bucket])
    assert rc == 0 and f"{3 * WORLD} kernel window(s)" in capsys.readouterr().out
    stats = influx_store.read(schema.KERNEL_STATS, "k")
    assert sorted(stats["iteration"].unique()) == [9, 19, 29] and set(stats["host"]) == set(HOSTS)
    assert (stats[f"{kernel_id(GEMM)}_m0_n"] > 0).all()
    AnalyzerService(influx_store, jobs=["k"]).cycle(final=True)
    found = influx_store.read(schema.L3_KERNEL, "k")
    confirmed = found[found["confirmed"] == 1]
    assert set(confirmed["rank"]) == {GPU_SLOW_RANK} and set(confirmed["cause"]) == {"own"}, found
    assert set(confirmed["name"]) == {GEMM, LAYERNORM, GELU} and set(confirmed["kind"]) == {"compute"}
    assert set(confirmed["host"]) == {HOSTS[1]} and (confirmed["ratio"] > 1.5).all()
    assert GPU_SLOW_RANK not in set(found[found["kind"] == "comm"]["rank"])   # it waited least


def test_import_trace_kernels_of_a_trace_without_kernel_events_says_so(tmp_path, influx_store, capsys):
    trace = tmp_path / "rank0.trace.json"
    steps = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "ts": 1000.0 * k, "dur": 900.0,
              "pid": 1, "tid": 1} for k in range(4)]
    trace.write_text(json.dumps({"traceEvents": steps, "distributedInfo": {"rank": 0, "world_size": 1}}))
    rc = cli_main(["import-trace", str(trace), "--job", "nok", "--kernels", "2", "--store", influx_store.url,
                   "--bucket", influx_store.bucket])
    out = capsys.readouterr()
    assert rc == 0 and "0 kernel window(s) of 2 step(s)" in out.out and "no kernel or operator events" in out.err
    assert len(influx_store.read_stage_latency("nok")) == 4      # the stage latencies are in, nothing lost
    assert cli_main(["import-trace", str(trace), "--job", "nok", "--kernels", "-1", "--store", influx_store.url,
                     "--bucket", influx_store.bucket]) != 0
    assert "--kernels -1" in capsys.readouterr().err
