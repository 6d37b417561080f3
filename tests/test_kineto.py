"""The Kineto trace importer, on traces torch.profiler records here from a real gloo DDP run."""

from __future__ import annotations

import gzip
import json
import statistics

import pytest

from collector.kineto import StagePatterns, TraceError, load_trace, summarise_trace
from evaluation.torch_demo import DemoConfig, run_demo
from rankscope.cli import main as cli_main

SLOW_RANK, SLOW_FROM = 1, 4


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """One trace per rank of a 4-process run whose rank 1 is slow in mlp from iteration 4."""
    folder = tmp_path_factory.mktemp("traces")
    cfg = DemoConfig(world=4, iterations=8, instrument=False, profile_dir=str(folder),
                     slow_rank=SLOW_RANK, slow_from=SLOW_FROM, slow_factor=300)
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
    assert s.stage_ms[0] == {"mlp": 0.3, "reduce_scatter": 0.05}  # device time, not the 20 us on host


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
