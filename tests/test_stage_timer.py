"""The stage timer (regions, union of intervals, aliases, torch hooks) and rank coordinates."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from collector.coordinates import CoordinatesError, RankCoordinates, detect, job_name
from collector.stage_timer import MEGATRON_ALIASES, StageTimer, union_length
from rankscope.schema import SchemaError, StageSet
from rankscope.topology import Topology


def make_timer(**kw):
    coords = RankCoordinates.from_topology(Topology(dp=8, gpus_per_node=4), 5, "job-a")
    points: list[dict] = []
    return StageTimer(coords, sink=points.append, **kw), points


def test_union_length_merges_overlaps_and_adds_disjoint_intervals():
    assert union_length([(0.0, 2.0)]) == 2.0
    assert union_length([(0.0, 2.0), (5.0, 6.0)]) == 3.0
    assert union_length([(0.0, 4.0), (1.0, 2.0), (3.0, 6.0), (10.0, 11.0)]) == 7.0
    assert union_length([(3.0, 6.0), (0.0, 4.0)]) == 6.0


def test_one_point_per_step_with_tags_stages_and_iteration_time():
    timer, points = make_timer()
    for _ in range(3):
        with timer.stage("dataloader"):
            time.sleep(0.002)
        with timer.stage("mlp"):
            time.sleep(0.010)
        with timer.stage("mlp"):  # a second layer: adds up
            time.sleep(0.010)
        timer.step()
    assert [p["iteration"] for p in points] == [0, 1, 2]
    p = points[-1]
    assert {k: p[k] for k in ("job", "rank", "pp", "dp", "tp", "ep_group", "node")} == {
        "job": "job-a", "rank": 5, "pp": 0, "dp": 5, "tp": 0, "ep_group": 5, "node": 1}
    assert p["mlp"] >= 20.0
    assert p["dataloader"] >= 2.0
    assert p["iteration_ms"] >= p["mlp"] + p["dataloader"]
    assert "attention" not in p  # a stage not entered is missing, not zero
    times = [q["time"] for q in points]
    assert times == sorted(set(times))  # strictly increasing per rank


def test_nested_and_overlapping_regions_are_not_counted_twice():
    timer, points = make_timer()
    with timer.stage("mlp"):
        with timer.stage("mlp"):
            time.sleep(0.005)
        time.sleep(0.005)
    timer.step(iteration=41)
    p = points[0]
    assert p["iteration"] == 41 and timer.iteration == 42
    assert 10.0 <= p["mlp"] <= p["iteration_ms"]


def test_start_stop_record_reset_and_unknown_stage():
    timer, points = make_timer()
    timer.start("optimizer")
    time.sleep(0.003)
    timer.stop("optimizer")
    a = timer.mark()
    time.sleep(0.004)
    timer.record("reduce_scatter", a, timer.mark())
    timer.step()
    assert points[0]["optimizer"] >= 3.0 and points[0]["reduce_scatter"] >= 4.0
    with timer.stage("mlp"):
        time.sleep(0.002)
    timer.reset()  # e.g. an evaluation pause: forgotten
    timer.step()
    assert "mlp" not in points[1]
    with pytest.raises(SchemaError, match="unknown stage 'mpl'.*mlp"):
        timer.stage("mpl")
    with pytest.raises(RuntimeError, match="stopped without being started"):
        timer.stop("optimizer")


def test_config_aliases_and_megatron_timer_names_map_to_stages():
    stages = StageSet.from_config({
        "fwd": {"kind": "compute", "alias": ["forward-compute"]},
        "optimizer": "compute",
        "reduce_scatter": {"kind": "comm", "group": "dp"},
    })
    calls = []

    class MegatronTimersStandIn:  # the calls Megatron-LM's Timers receives
        def __call__(self, name, log_level=None):
            return SimpleNamespace(start=lambda barrier=False: calls.append(("start", name)),
                                   stop=lambda barrier=False: calls.append(("stop", name)))

        def log(self, names):
            return f"logged {names}"

    timer, points = make_timer(stages=stages, aliases={"my-sync": "reduce_scatter"})
    timers = timer.megatron_timers(MegatronTimersStandIn())
    for name in ("forward-compute", "optimizer", "grads-reduce-scatter", "interval-time"):
        t = timers(name, log_level=1)
        t.start()
        time.sleep(0.002)
        t.stop()
    with timer.stage("my-sync"):
        time.sleep(0.002)
    timer.step()
    p = points[0]
    assert p["fwd"] >= 2.0 and p["optimizer"] >= 2.0
    assert p["reduce_scatter"] >= 4.0  # Megatron's grads-reduce-scatter + the user's alias
    assert "interval-time" not in p  # unmapped Megatron timers are only forwarded
    assert calls.count(("start", "interval-time")) == 1 and len(calls) == 8
    assert timers.log(["optimizer"]) == "logged ['optimizer']"
    assert MEGATRON_ALIASES["grads-reduce-scatter"] == "reduce_scatter"
    with pytest.raises(SchemaError, match="unknown stage 'nope'"):
        make_timer(aliases={"x": "nope"})


def test_module_hooks_time_forward_and_backward_without_changing_results():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    x = torch.randn(128, 64, requires_grad=True)
    ref = model(x)
    ref.sum().backward()
    ref_grad = x.grad.clone()
    x.grad = None

    timer, points = make_timer()
    timer.time_module(model[0], "attention", backward=False)
    timer.time_module(model[2], "mlp")
    out = model(x)
    out.sum().backward()
    timer.step()
    assert torch.equal(out, ref) and torch.equal(x.grad, ref_grad)
    assert points[0]["mlp"] > 0 and points[0]["attention"] > 0
    timer.close()  # removes the hooks
    model(x).sum().backward()
    timer.step()
    assert "mlp" not in points[1] and "attention" not in points[1]


class DeviceClock:
    """A stand-in for a GPU: events complete when the test advances the device."""

    def __init__(self):
        self.now = 0.0  # device time of the work enqueued so far (ms)
        self.done = 0.0  # device time completed
        self.syncs = 0
        self.created = 0

    def event(self):
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    """The part of torch.cuda.Event the timer uses."""

    def __init__(self, clock):
        self.clock, self.t = clock, None

    def record(self, stream=None):
        self.t = self.clock.now

    def query(self):
        return self.t is not None and self.t <= self.clock.done

    def synchronize(self):
        self.clock.syncs += 1
        self.clock.done = max(self.clock.done, self.t)

    def elapsed_time(self, other):
        assert self.query() and other.query(), "elapsed_time on an incomplete event"
        return other.t - self.t


def test_gpu_marks_are_resolved_later_without_synchronising_the_step():
    clock = DeviceClock()
    timer, points = make_timer(device="cuda", event_factory=clock.event)
    for _ in range(3):
        with timer.stage("mlp"):
            clock.now += 5.0  # 5 ms of kernels enqueued
        clock.now += 1.0
        timer.step()
    assert points == [] and clock.syncs == 0  # the device is behind: nothing resolved yet
    clock.done = 6.0  # the first iteration's work has completed
    with timer.stage("mlp"):
        clock.now += 5.0
    timer.step()
    assert [p["iteration"] for p in points] == [0] and clock.syncs == 0
    assert points[0]["mlp"] == 5.0 and points[0]["iteration_ms"] == 6.0
    timer.close()  # the only synchronisation
    assert clock.syncs >= 1
    assert [p["iteration"] for p in points] == [0, 1, 2, 3]
    assert all(p["mlp"] == 5.0 for p in points)
    assert [p["iteration_ms"] for p in points] == [6.0, 6.0, 6.0, 5.0]
    created, syncs = clock.created, clock.syncs
    for _ in range(20):  # a device that keeps up: resolved one step late, events reused
        with timer.stage("mlp"):
            clock.now += 5.0
        timer.step()
        clock.done = clock.now
    assert len(points) == 4 + 19 and clock.syncs == syncs
    assert clock.created - created <= 3


def test_pause_detaches_hooks_and_resume_brings_them_back():
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    timer, points = make_timer()
    timer.time_module(model, "mlp")
    timer.pause()
    assert not model._forward_hooks and not model._forward_pre_hooks
    with timer.stage("dataloader"):
        model(x).sum().backward()
    timer.step()
    assert points == [] and timer.iteration == 1
    timer.resume()
    model(x).sum().backward()
    timer.step()
    assert [p["iteration"] for p in points] == [1] and "mlp" in points[0]
    assert "dataloader" not in points[0]


def test_cuda_device_needs_cuda_and_device_is_checked():
    with pytest.raises(ValueError, match="device must be"):
        make_timer(device="tpu")


# ------------------------------------------------------------------ coordinates
def test_detect_from_environment_and_topology():
    topo = Topology(tp=2, pp=2, dp=2, gpus_per_node=4)
    coords, t = detect(topo, env={"RANK": "6", "WORLD_SIZE": "8", "RANKSCOPE_JOB": "j1"})
    assert t is topo
    assert coords == RankCoordinates("j1", 6, pp=1, dp=1, tp=0, ep_group=5, node=1)
    coords, t = detect(env={"RANK": "3", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "run9"})
    assert (coords.job, coords.dp, t.dp, t.world) == ("run9", 3, 4, 4)
    with pytest.raises(CoordinatesError, match="describes 8 ranks.*world of 4"):
        detect(topo, env={"RANK": "0", "WORLD_SIZE": "4", "RANKSCOPE_JOB": "j"})
    with pytest.raises(CoordinatesError, match="RANKSCOPE_JOB"):
        job_name(None, env={})
    with pytest.raises(CoordinatesError, match="outside a world"):
        detect(env={"RANK": "4", "WORLD_SIZE": "4", "RANKSCOPE_JOB": "j"})
    with pytest.raises(ValueError, match="job name"):
        RankCoordinates.from_topology(topo, 0, "bad\njob")


def test_detect_from_megatron_parallel_state():
    # The functions of megatron.core.parallel_state that detect() calls, for rank 5 of
    # tp=2 x pp=2 x dp=2 in Megatron's default order.
    ps = SimpleNamespace(
        get_tensor_model_parallel_world_size=lambda: 2, get_pipeline_model_parallel_world_size=lambda: 2,
        get_data_parallel_world_size=lambda: 2, get_expert_model_parallel_world_size=lambda: 1,
        get_tensor_model_parallel_rank=lambda: 1, get_pipeline_model_parallel_rank=lambda: 1,
        get_data_parallel_rank=lambda: 0)
    env = {"RANK": "5", "WORLD_SIZE": "8", "RANKSCOPE_JOB": "mega", "LOCAL_WORLD_SIZE": "4"}
    coords, topo = detect(env=env, parallel_state=ps)
    assert (topo.tp, topo.pp, topo.dp, topo.gpus_per_node) == (2, 2, 2, 4)
    assert (coords.tp, coords.pp, coords.dp, coords.node) == (1, 1, 0, 1)
    ps.get_data_parallel_rank = lambda: 1
    with pytest.raises(CoordinatesError, match="Megatron-LM says"):
        detect(env=env, parallel_state=ps)
