"""The stage timer (regions, union of intervals, aliases, torch hooks) and rank coordinates."""

from __future__ import annotations

import itertools
import socket
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from collector.coordinates import CoordinatesError, RankCoordinates, detect, job_name, local_gpu
from collector.stage_timer import MEGATRON_ALIASES, StageTimer, union_length
from collector.stage_timing.cpu import CpuTiming
from collector.stage_timing.cuda import CudaTiming
from collector.stage_timing.timing import Iteration
from rankscope import schema
from rankscope.schema import SchemaError, StageSet
from rankscope.topology import Topology


class FakeClock:
    """The timer's ``clock``: seconds that move when the test advances them (and by
    ``tick_ms`` after each reading, to give every mark its own time); ``reads`` counts
    the marks taken."""

    def __init__(self, start_s: float = 1000.0, tick_ms: float = 0.0):
        self.t = start_s
        self.tick_ms = tick_ms
        self.reads = 0

    def __call__(self) -> float:
        t = self.t
        self.t += self.tick_ms / 1000.0
        self.reads += 1
        return t

    def advance(self, ms: float) -> None:
        self.t += ms / 1000.0


class FakeWall:
    """The timer's ``wall_clock_ms``: epoch milliseconds set by the test."""

    def __init__(self, ms: int = 1_700_000_000_000):
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def approx(ms: float):
    """A duration computed from the fake clock: exact up to float rounding."""
    return pytest.approx(ms, abs=1e-9)


def make_timer(host: str = "gpu-node-01", gpu: int | None = 3, gpu_uuid: str | None = None,
               **kw) -> tuple[StageTimer, list[dict], FakeClock]:
    """Rank 5 of a DP job on a fake clock (and a fixed wall clock unless given)."""
    coords = RankCoordinates.from_topology(Topology(dp=8, gpus_per_node=4), 5, "job-a", host=host,
                                           gpu=gpu, gpu_uuid=gpu_uuid)
    points: list[dict] = []
    clock = kw.setdefault("clock", FakeClock())
    kw.setdefault("wall_clock_ms", FakeWall())
    return StageTimer(coords, sink=points.append, **kw), points, clock


def test_union_length_merges_overlaps_and_adds_disjoint_intervals():
    assert union_length([(0.0, 2.0)]) == 2.0
    assert union_length([(0.0, 2.0), (5.0, 6.0)]) == 3.0
    assert union_length([(0.0, 4.0), (1.0, 2.0), (3.0, 6.0), (10.0, 11.0)]) == 7.0
    assert union_length([(3.0, 6.0), (0.0, 4.0)]) == 6.0


def test_one_point_per_step_with_tags_stages_and_iteration_time():
    wall = FakeWall()
    timer, points, clock = make_timer(gpu_uuid="GPU-5d0b8a0e-3c51-4b5f-9e1f-2a4d7c9e0b11",
                                      wall_clock_ms=wall)
    for i in range(3):
        with timer.stage("dataloader"):
            clock.advance(2)
        clock.advance(1)  # untimed work: only in iteration_ms
        with timer.stage("mlp"):
            clock.advance(10)
        with timer.stage("mlp"):  # a second layer: adds up
            clock.advance(10)
        if i < 2:
            wall.ms += 25
        timer.step()
    assert [p["iteration"] for p in points] == [0, 1, 2]
    p = points[-1]
    assert {k: p[k] for k in ("job", "rank", "pp", "dp", "tp", "ep_group", "node", "host", "gpu")} == {
        "job": "job-a", "rank": 5, "pp": 0, "dp": 5, "tp": 0, "ep_group": 5, "node": 1,
        "host": "gpu-node-01", "gpu": 3}
    assert p["gpu_uuid"] == "GPU-5d0b8a0e-3c51-4b5f-9e1f-2a4d7c9e0b11"  # a field, see schema
    for q in points:
        assert q["mlp"] == approx(20.0) and q["dataloader"] == approx(2.0)
        assert q["iteration_ms"] == approx(23.0)
    assert "attention" not in p  # a stage not entered is missing, not zero
    # the wall clock's ms; the third step came in the same ms as the second: one ms later
    start = 1_700_000_000_000
    assert [q["time"] for q in points] == [start + 25, start + 50, start + 51]
    # on CPU every step resolves at once
    assert timer.pending == 0 and timer.emitted == 3 and timer.last_point == p
    assert isinstance(timer.timing, CpuTiming)


def test_points_without_a_known_gpu_have_no_gpu_tag_or_uuid():
    timer, points, _ = make_timer(gpu=None)
    timer.step()
    assert points[0]["host"] == "gpu-node-01"
    assert "gpu" not in points[0] and "gpu_uuid" not in points[0]


def test_nested_and_overlapping_regions_are_not_counted_twice():
    timer, points, clock = make_timer()
    with timer.stage("mlp"):
        with timer.stage("mlp"):
            clock.advance(5)
        clock.advance(5)
    clock.advance(1)
    timer.step(iteration=41)
    p = points[0]
    assert p["iteration"] == 41 and timer.iteration == 42
    assert p["mlp"] == approx(10.0) and p["iteration_ms"] == approx(11.0)


def test_start_stop_record_reset_and_unknown_stage():
    timer, points, clock = make_timer()
    timer.start("optimizer")
    clock.advance(3)
    timer.stop("optimizer")
    a = timer.mark()
    clock.advance(4)
    timer.record("reduce_scatter", a, timer.mark())
    timer.step()
    assert points[0]["optimizer"] == approx(3.0) and points[0]["reduce_scatter"] == approx(4.0)
    assert points[0]["iteration_ms"] == approx(7.0)
    clock.advance(50)
    with timer.stage("mlp"):
        clock.advance(2)
    timer.reset()  # e.g. after warm-up: forgotten, and the iteration's clock restarts
    clock.advance(6)
    timer.step()
    assert "mlp" not in points[1] and points[1]["iteration_ms"] == approx(6.0)
    with pytest.raises(SchemaError, match="unknown stage 'mpl'.*mlp"):
        timer.stage("mpl")
    with pytest.raises(SchemaError, match="unknown stage 'mpl'"):
        timer.start("mpl")
    with pytest.raises(RuntimeError, match="stage 'optimizer' stopped without being started"):
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

    timer, points, clock = make_timer(stages=stages, aliases={"my-sync": "reduce_scatter"})
    timers = timer.megatron_timers(MegatronTimersStandIn())
    for name, ms in (("forward-compute", 2), ("optimizer", 3), ("grads-reduce-scatter", 4),
                     ("interval-time", 5)):
        t = timers(name, log_level=1)
        t.start()
        clock.advance(ms)
        t.stop()
    with timer.stage("my-sync"):
        clock.advance(6)
    timer.step()
    p = points[0]
    assert p["fwd"] == approx(2.0) and p["optimizer"] == approx(3.0)
    assert p["reduce_scatter"] == approx(10.0)  # Megatron's grads-reduce-scatter + the user's alias
    assert p["iteration_ms"] == approx(20.0)
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

    # every mark 1 ms after the previous one: marks are timer start, attention forward
    # begin/end, mlp forward begin/end, mlp backward begin/end, step
    timer, points, _ = make_timer(clock=FakeClock(tick_ms=1.0))
    timer.time_module(model[0], "attention", backward=False)
    timer.time_module(model[2], "mlp")
    out = model(x)
    out.sum().backward()
    timer.step()
    assert torch.equal(out, ref) and torch.equal(x.grad, ref_grad)
    assert points[0]["attention"] == approx(1.0)  # forward only
    assert points[0]["mlp"] == approx(2.0)  # forward + backward
    assert points[0]["iteration_ms"] == approx(7.0)
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
    timer, points, _ = make_timer(device="cuda", event_factory=clock.event)
    for _ in range(3):
        with timer.stage("mlp"):
            clock.now += 5.0  # 5 ms of kernels enqueued
        clock.now += 1.0
        timer.step()
    assert points == [] and clock.syncs == 0  # the device is behind: nothing resolved yet
    assert timer.pending == 3 and timer.emitted == 0 and timer.last_point is None
    clock.done = 6.0  # the first iteration's work has completed
    with timer.stage("mlp"):
        clock.now += 5.0
    timer.step()
    assert [p["iteration"] for p in points] == [0] and clock.syncs == 0
    assert points[0]["mlp"] == 5.0 and points[0]["iteration_ms"] == 6.0
    assert timer.pending == 3 and timer.last_point == points[0]
    timer.close()  # the only synchronisation
    assert clock.syncs >= 1 and timer.pending == 0 and timer.emitted == 4
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


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_cpu_and_cuda_timing_resolve_an_iteration_through_the_timing_interface(kind):
    """The end first, then each interval's start and end, in ms from the begin; CUDA only
    once the device has completed the events, without synchronising."""
    if kind == "cpu":
        clock = FakeClock()
        timing, advance = CpuTiming(clock), clock.advance
    else:
        device = DeviceClock()
        timing = CudaTiming(device.event)

        def advance(ms: float) -> None:
            device.now += ms

    begin = timing.mark()
    advance(2)
    a = timing.mark()
    advance(3)
    b = timing.mark()
    advance(1)
    end = timing.mark()
    close, _reopen = timing.split(None, end)  # a region open at the boundary
    it = Iteration(7, 1_000, begin, end, [(0, a, b), (1, b, close)])
    timing.finish(it)
    assert timing.pending == 1
    if kind == "cuda":
        assert list(timing.collect()) == [] and timing.pending == 1  # the device is behind
        device.done = device.now
    [(got, ms)] = list(timing.collect())
    assert got is it and timing.pending == 0
    assert ms == [approx(v) for v in (6.0, 2.0, 5.0, 5.0, 6.0)]
    if kind == "cuda":
        assert device.syncs == 0


def test_pause_detaches_hooks_and_resume_brings_them_back():
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    clock = FakeClock(tick_ms=1.0)
    timer, points, _ = make_timer(clock=clock)
    timer.time_module(model, "mlp")
    assert timer.hooks_attached == 2 and timer.timed_modules == ["mlp"]  # forward pre- and post-hook
    timer.pause()
    assert timer.paused and timer.hooks_attached == 0 and timer.timed_modules == ["mlp"]
    reads = clock.reads
    with timer.stage("dataloader"):
        model(x).sum().backward()
    timer.step()
    assert clock.reads == reads  # no hook, region or step took a mark
    assert points == [] and timer.iteration == 1 and timer.last_point is None
    timer.resume()
    assert not timer.paused and timer.hooks_attached == 2
    model(x).sum().backward()
    timer.step()
    assert [p["iteration"] for p in points] == [1] and points[0]["mlp"] == approx(2.0)
    assert "dataloader" not in points[0]


def test_cuda_device_needs_cuda_and_device_is_checked():
    with pytest.raises(ValueError, match="device must be"):
        make_timer(device="tpu")


# ----------------------------------------------- start/stop/pause/resume/step/reset in any order
class MegatronStandIn:
    """Megatron-LM's ``Timers`` as far as the wrapper uses it: records every call."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def __call__(self, name, log_level=None):
        return SimpleNamespace(start=lambda barrier=False: self.calls.append(("start", name)),
                               stop=lambda barrier=False: self.calls.append(("stop", name)))


def test_stop_while_paused_is_a_no_op_for_stage_and_megatron_timers():
    """Megatron calls its timers during evaluation, exactly when the timer is paused."""
    timer, points, clock = make_timer()
    inner = MegatronStandIn()
    timers = timer.megatron_timers(inner)
    timer.pause()
    timer.stop("optimizer")  # never started: nothing to do while paused
    timers("optimizer").stop()
    timers("forward-recv").start()  # an evaluation step
    clock.advance(5)
    timers("forward-recv").stop()
    with timer.stage("mlp"):
        clock.advance(5)
    timer.record("reduce_scatter", timer.mark(), timer.mark())
    timer.step()
    assert points == [] and timer.iteration == 1
    assert inner.calls == [("stop", "optimizer"), ("start", "forward-recv"), ("stop", "forward-recv")]
    timer.resume()
    clock.advance(2)
    timer.step()
    assert points[0]["iteration_ms"] == approx(2.0)
    assert set(points[0]) & {"optimizer", "pp_recv", "mlp", "reduce_scatter"} == set()


def test_a_region_opened_before_pause_or_reset_is_dropped_when_it_closes():
    timer, points, clock = make_timer()
    timers = timer.megatron_timers()
    # opened before pause, closed after resume: pause discarded its start
    timer.start("optimizer")
    timers("forward-recv").start()
    clock.advance(3)
    timer.pause()
    clock.advance(3)
    timer.resume()
    clock.advance(4)
    timer.stop("optimizer")  # no error: its start was discarded
    timers("forward-recv").stop()
    # opened before reset, closed after it
    with timer.stage("mlp"):
        clock.advance(1)
        timer.reset()
        clock.advance(2)
    timer.step()
    assert points[0]["iteration_ms"] == approx(2.0)  # since the reset
    assert set(points[0]) & {"optimizer", "pp_recv", "mlp"} == set()
    # the dropped starts are used up: a stop without a start raises again
    with pytest.raises(RuntimeError, match="stopped without being started"):
        timer.stop("optimizer")
    timers("forward-recv").stop()  # a Megatron timer never raises


def test_a_region_open_across_step_is_split_between_the_iterations():
    timer, points, clock = make_timer()
    timers = timer.megatron_timers()
    clock.advance(1)
    timer.start("optimizer")
    timers("forward-recv").start()
    clock.advance(4)
    timer.step()
    clock.advance(6)
    timer.stop("optimizer")
    timers("forward-recv").stop()
    clock.advance(1)
    timer.step()
    assert [p["optimizer"] for p in points] == [approx(4.0), approx(6.0)]
    assert [p["pp_recv"] for p in points] == [approx(4.0), approx(6.0)]
    assert [p["iteration_ms"] for p in points] == [approx(5.0), approx(7.0)]


def test_pause_and_resume_are_idempotent_and_step_while_paused_only_counts():
    timer, points, clock = make_timer()
    timer.resume()  # not paused: nothing happens (no reset)
    timer.start("mlp")
    clock.advance(5)
    timer.stop("mlp")
    timer.pause()
    timer.pause()
    timer.step(iteration=10)
    assert timer.iteration == 11 and points == []
    timer.resume()
    timer.resume()
    clock.advance(3)
    timer.step()
    assert [(p["iteration"], p["iteration_ms"]) for p in points] == [(11, approx(3.0))]
    assert "mlp" not in points[0]  # pause discarded the iteration it was in


def test_backward_straddling_a_reset_is_dropped():
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    timer, points, _ = make_timer(clock=FakeClock(tick_ms=1.0))
    timer.time_module(model, "mlp")
    loss = model(x).sum()
    timer.reset()  # e.g. the end of warm-up between forward and backward
    loss.backward()
    timer.step()
    assert "mlp" not in points[0]
    model(x).sum().backward()
    timer.step()
    assert points[1]["mlp"] == approx(2.0)


ORDER_OPS = ("start", "stop", "pause", "resume", "step", "reset")


def expected_outcome(order: tuple[str, ...]) -> tuple[bool, dict | None]:
    """What the documented rules give for one order of the six calls, op k made at
    ``2**(k+1) - 1`` ms after the timer began: (does a plain ``stop`` raise, the point's
    ``iteration_ms`` and ``optimizer`` or None when no point)."""
    t = {op: 2 ** (k + 1) - 1 for k, op in enumerate(order)}

    def paused_at(x: int) -> bool:
        return t["pause"] < x and not t["pause"] < t["resume"] < x

    stop_raises = not paused_at(t["stop"]) and t["start"] > t["stop"]
    if paused_at(t["step"]):
        return stop_raises, None
    begin = max([0] + [t["reset"]] * (t["reset"] < t["step"])
                + [t["resume"]] * (t["pause"] < t["resume"] < t["step"]))
    point: dict = {"iteration_ms": t["step"] - begin, "optimizer": None}
    closes = t["stop"] if t["stop"] > t["start"] else float("inf")
    until = min(closes, t["step"])
    # pause and reset discard the iteration so far: what was timed since the start too
    live = (t["start"] < t["step"] and not paused_at(t["start"])
            and not any(t["start"] < t[op] < t["step"] for op in ("pause", "reset")))
    if live:
        point["optimizer"] = until - t["start"]
    return stop_raises, point


@pytest.mark.parametrize("api", ["stage_timer", "megatron"])
def test_every_order_of_start_stop_pause_resume_step_and_reset(api):
    """All 720 orders of the six calls on one stage, each with exact expected values."""
    checked = {"raised": 0, "points": 0, "timed": 0}
    for order in itertools.permutations(ORDER_OPS):
        timer, points, clock = make_timer()
        inner = MegatronStandIn()
        timers = timer.megatron_timers(inner)
        stop_raises, want = expected_outcome(order)
        for k, op in enumerate(order):
            clock.advance(2 ** k)
            if op in ("start", "stop") and api == "megatron":
                getattr(timers("optimizer"), op)()
            elif op == "stop" and stop_raises:
                with pytest.raises(RuntimeError, match="stopped without being started"):
                    timer.stop("optimizer")
                checked["raised"] += 1
            elif op in ("start", "stop"):
                getattr(timer, op)("optimizer")
            else:
                getattr(timer, op)()
        got = None if not points else {"iteration_ms": points[0]["iteration_ms"],
                                        "optimizer": points[0].get("optimizer")}
        assert len(points) <= 1 and timer.iteration == 1, order
        if want is None:
            assert got is None, order
        else:
            checked["points"] += 1
            checked["timed"] += want["optimizer"] is not None
            assert got is not None, order
            assert got["iteration_ms"] == approx(want["iteration_ms"]), order
            if want["optimizer"] is None:
                assert got["optimizer"] is None, order
            else:
                assert got["optimizer"] == approx(want["optimizer"]), order
        if api == "megatron":  # every call reached Megatron's own timers
            assert sorted(inner.calls) == [("start", "optimizer"), ("stop", "optimizer")], order
        # whatever came before, resume + reset give a clean iteration
        timer.resume()
        timer.reset()
        clock.advance(1)
        timer.step()
        assert points[-1]["iteration_ms"] == approx(1.0) and "optimizer" not in points[-1], order
    # the oracle exercised every outcome (guards against a vacuous loop)
    assert checked["points"] > 100 and checked["timed"] > 20
    assert (checked["raised"] > 0) == (api == "stage_timer")


# ------------------------------------------------------------------ coordinates
def test_detect_from_environment_and_topology():
    topo = Topology(tp=2, pp=2, dp=2, gpus_per_node=4)
    env = {"RANK": "6", "WORLD_SIZE": "8", "RANKSCOPE_JOB": "j1", "RANKSCOPE_HOST": "gpu-node-07"}
    coords, t = detect(topo, env=env)
    assert t is topo
    assert coords == RankCoordinates("j1", 6, pp=1, dp=1, tp=0, ep_group=5, node=1, host="gpu-node-07")
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


def test_torchrun_s_restart_count_is_every_point_s_attempt_field():
    env = {"RANK": "1", "WORLD_SIZE": "2", "RANKSCOPE_JOB": "j", "RANKSCOPE_HOST": "h1"}
    coords, _ = detect(env=env)
    assert coords.attempt is None and schema.ATTEMPT_FIELD not in coords.fields()
    coords, _ = detect(env={**env, "TORCHELASTIC_RESTART_COUNT": "2"})
    assert coords.attempt == 2
    row = coords.rows(7, 1_000, {"mlp": 1.0}).iloc[0]
    assert row[schema.ATTEMPT_FIELD] == 2 and row["iteration"] == 7
    timer = StageTimer(coords, sink=(points := []).append)
    timer.step()
    assert points[0][schema.ATTEMPT_FIELD] == 2                   # a field, not a tag
    assert schema.ATTEMPT_FIELD not in coords.tags()
    for bad in ("two", "-1"):
        with pytest.raises(CoordinatesError, match="TORCHELASTIC_RESTART_COUNT"):
            detect(env={**env, "TORCHELASTIC_RESTART_COUNT": bad})


def test_detect_names_the_machine_host_argument_env_then_hostname():
    env = {"RANK": "1", "WORLD_SIZE": "2", "RANKSCOPE_JOB": "j"}
    coords, _ = detect(env=env)
    assert coords.host == socket.gethostname() and coords.tags()["host"] == socket.gethostname()
    coords, _ = detect(env={**env, "RANKSCOPE_HOST": "gpu-node-07"})
    assert coords.host == "gpu-node-07"
    coords, _ = detect(env={**env, "RANKSCOPE_HOST": "gpu-node-07"}, host="gpu-node-08")
    assert coords.host == "gpu-node-08"
    # the machine's name, not the one the topology expects for the rank's node: the
    # analyzer follows what the ranks report
    topo = Topology(dp=2, gpus_per_node=1, host_pattern="gpu-node-{node:02d}")
    coords, _ = detect(topo, env=env, host="spare-03")
    assert (coords.node, coords.host) == (1, "spare-03")
    with pytest.raises(CoordinatesError, match="host name"):
        RankCoordinates("j", 0, 0, 0, 0, 0, 0, host="")
    with pytest.raises(ValueError, match="host name"):
        RankCoordinates("j", 0, 0, 0, 0, 0, 0, host="bad\nhost")


def test_from_topology_takes_the_topologys_host_names_else_this_machines():
    named = Topology(dp=8, gpus_per_node=4, host_pattern="gpu-node-{node:05d}")
    assert RankCoordinates.from_topology(named, 5, "j").host == "gpu-node-00001"
    assert RankCoordinates.from_topology(named, 5, "j", host="x1").host == "x1"
    plain = RankCoordinates.from_topology(Topology(dp=8, gpus_per_node=4), 5, "j")
    assert plain.host == socket.gethostname() and plain.gpu is None and plain.gpu_uuid is None
    assert "gpu" not in plain.tags() and plain.fields() == {}


def fake_cuda(device: int = 2, initialised: bool = True, uuid: str | None = "9c1f1a2e-77d4-4e0e",
              fail: str | None = None) -> SimpleNamespace:
    """The calls of ``torch.cuda`` that local_gpu makes (this machine has no GPU);
    ``fail`` names one that raises, as a broken driver would."""

    def call(name: str, value):
        def f(*args):
            if fail == name:
                raise RuntimeError(f"CUDA error in {name}")
            return value
        return f

    return SimpleNamespace(is_available=call("is_available", True),
                           is_initialized=call("is_initialized", initialised),
                           current_device=call("current_device", device),
                           get_device_properties=call("get_device_properties", SimpleNamespace(uuid=uuid)))


def test_local_gpu_from_local_rank_and_the_initialised_cuda_device():
    # on this CPU machine (real torch): no GPU, unless torchrun says which local slot
    assert local_gpu(env={}) == (None, None)
    assert local_gpu(env={"LOCAL_RANK": "3"}) == (3, None)
    # CUDA initialised: its current device, and that device's UUID
    assert local_gpu(env={}, cuda=fake_cuda()) == (2, "GPU-9c1f1a2e-77d4-4e0e")
    assert local_gpu(env={"LOCAL_RANK": "1"}, cuda=fake_cuda()) == (1, "GPU-9c1f1a2e-77d4-4e0e")
    assert local_gpu(env={}, cuda=fake_cuda(uuid="GPU-abc")) == (2, "GPU-abc")
    # never initialises CUDA itself; every failing call leaves the value unknown
    assert local_gpu(env={"LOCAL_RANK": "1"}, cuda=fake_cuda(initialised=False)) == (1, None)
    assert local_gpu(env={}, cuda=fake_cuda(fail="is_available")) == (None, None)
    assert local_gpu(env={}, cuda=fake_cuda(fail="current_device")) == (None, None)
    assert local_gpu(env={}, cuda=fake_cuda(fail="get_device_properties")) == (2, None)
    with pytest.raises(CoordinatesError, match="LOCAL_RANK='x'"):
        local_gpu(env={"LOCAL_RANK": "x"})
    env = {"RANK": "1", "WORLD_SIZE": "2", "RANKSCOPE_JOB": "j", "LOCAL_RANK": "1"}
    coords, _ = detect(env=env, host="h1", cuda=fake_cuda())
    assert (coords.gpu, coords.gpu_uuid) == (1, "GPU-9c1f1a2e-77d4-4e0e")
    assert coords.tags() == {"job": "j", "rank": 1, "pp": 0, "dp": 1, "tp": 0, "ep_group": 1,
                             "node": 0, "host": "h1", "gpu": 1}
    assert coords.fields() == {"gpu_uuid": "GPU-9c1f1a2e-77d4-4e0e"}


def test_stage_timer_points_keep_host_and_gpu_tags_in_influxdb(influx_store):
    timer, points, clock = make_timer(host="gpu-node-07", gpu=3, gpu_uuid="GPU-5d0b8a0e-3c51")
    for _ in range(3):
        with timer.stage("mlp"):
            clock.advance(4)
        timer.step()
    influx_store.write_stage_latency(pd.DataFrame(points))
    df = influx_store.read_stage_latency("job-a")
    assert df["host"].tolist() == ["gpu-node-07"] * 3
    assert df["gpu"].astype(int).tolist() == [3] * 3
    assert df["gpu_uuid"].tolist() == ["GPU-5d0b8a0e-3c51"] * 3      # a string field, kept as one
    assert df["mlp"].tolist() == [approx(4.0)] * 3


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
