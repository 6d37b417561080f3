"""L3 from recorded traces, by default: a real 4-process gloo job profiled with torch.profiler, whose
rank 2 does the work of one of its four calls of a repeated operator (``moe.expert_ffn``, one per
expert, each step) ten times over from step 10 (nine extra passes of that expert: the operator's
time per step about 3x its peers'; with three extra passes, 1.75x, four processes on two shared
cores blurred it into their own spread of +-30% and two runs in three named nothing). Its traces go through ``rankscope
import-trace`` with no ``--kernels`` (windows of 10 steps are the default) into the real InfluxDB,
and the analyzer's kernel level names rank 2 and that operator.

One call in four slowed moves a quarter of the operator's events: its distribution over the window
turns bimodal, which the distance over its body reads as a part of the move; the operator's time
per step carries it whole (:mod:`analyzer.score.kernel_step_totals`).
"""

from __future__ import annotations

import glob
import uuid

import pytest

from rankscope import schema
from tests.torch_alone import alone

SLOW_RANK, SLOW_FROM, ITERATIONS, WORLD, OPERATOR = 2, 10, 60, 4, "moe.expert_ffn"
#: what runs inside one expert's call: the mark, its linear layers (aten::addmm on two shapes) and GELU,
#: and their backward (the extra passes are differentiated too: autograd's AddmmBackward0 and GeluBackward0,
#: as the profiler names each node and the engine's call of it, with the matrix products under them)
_BACKWARD = ("AddmmBackward0", "GeluBackward0")
IN_THE_CALL = {OPERATOR, "aten::linear", "aten::addmm", "aten::gelu", "DistributedDataParallel.forward",
               "aten::mm", "aten::t", *_BACKWARD, *(f"autograd::engine::evaluate_function: {b}" for b in _BACKWARD)}


@pytest.fixture(scope="module")
def analyzed(influx_url, tmp_path_factory):
    from analyzer.service.analyzer_service import AnalyzerService
    from evaluation.torch_demo import DemoConfig, run_demo
    from rankscope.cli import main as cli_main
    from rankscope.store import InfluxStore

    folder = tmp_path_factory.mktemp("one_call")
    cfg = DemoConfig(job="one-call", world=WORLD, iterations=ITERATIONS, instrument=False, profile_dir=str(folder),
                     slow_rank=SLOW_RANK, slow_from=SLOW_FROM, slow_factor=9, slow_call=1)
    store = InfluxStore(influx_url, bucket=f"onecall_{uuid.uuid4().hex[:8]}", api="v1")
    try:
        with alone():
            run_demo(cfg)
        traces = sorted(glob.glob(str(folder / "rank*.trace.json")))
        assert cli_main(["import-trace", *traces, "--job", cfg.job, "--store", influx_url,
                         "--bucket", store.bucket]) == 0
        AnalyzerService(store, jobs=[cfg.job]).cycle(final=True)
        yield cfg, store
    finally:
        store.drop_database()
        store.close()


def test_import_writes_kernel_windows_with_times_per_step_by_default(analyzed):
    cfg, store = analyzed
    stats = store.read(schema.KERNEL_STATS, cfg.job)
    names = store.read(schema.KERNEL_NAME, cfg.job)
    assert set(stats["rank"]) == set(range(WORLD))
    assert sorted(stats["iteration"].unique()) == [10, 20, 30, 40, 50, 59]   # ProfilerStep#1..59, 10 a window
    kid = names.loc[names["name"] == OPERATOR, "kernel"].iloc[0]
    per_step = stats.set_index(["iteration", "rank"])[f"{kid}_step_us"]
    assert (per_step > 0).all(), per_step[~(per_step > 0)]
    # rank 2's time per step in the operator, after the onset, stands above its peers'
    late = per_step.loc[[20, 30, 40, 50, 59]].unstack("rank")
    assert (late[SLOW_RANK] > 1.1 * late.drop(columns=SLOW_RANK).median(axis=1)).mean() >= 0.8, late


def test_l3_names_the_rank_and_the_operator_whose_one_call_slowed(analyzed):
    cfg, store = analyzed
    found = store.read(schema.L3_KERNEL, cfg.job)
    confirmed = found[found["confirmed"] == 1] if len(found) else found
    shown = found[["iteration", "rank", "name", "ratio", "step_ratio", "confirmed"]] if len(found) else found
    ours = confirmed[confirmed["rank"] == SLOW_RANK]
    assert len(ours) and (ours["iteration"] > SLOW_FROM).all(), shown
    # the operators it names there are the slowed call's: the mark or what runs inside it, and at
    # least one of the expert's own (not only the forward's wrapper, which holds every call, nor
    # aten::mm or aten::t alone, which every linear layer runs)
    assert set(ours["name"]) <= IN_THE_CALL, shown
    assert set(ours["name"]) & {OPERATOR, "aten::addmm", "aten::linear", "aten::gelu"}, shown
    assert (ours["step_ratio"] > 1.1).any() and ours["host"].all()
    # a process the 2 shared cores starved for a while may be confirmed too: never as often
    others = confirmed[confirmed["rank"] != SLOW_RANK]
    assert (others.groupby("rank").size() < len(ours)).all(), shown
