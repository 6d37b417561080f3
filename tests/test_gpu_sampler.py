"""The collector's NVML sampler (collector/gpu_sampler.py).

No GPU exists here or in CI: the path without NVML runs for real (the real nvidia-ml-py binding,
installed by the test extra, finds no NVML library: one log line, nothing started, nothing
written). The sampling, decoding and writing logic is checked with a stand-in NVML *module
object* injected in place of ``pynvml``: only the NVML calls themselves are stood in for; the
points go through the real BackgroundWriter into the real embedded store and are read back and
decoded as the analyzer reads them. The stage timer starts the sampler beside its writer (its
``gpu_health`` option) with the same stand-in. The overhead on a GPU is not measured (BENCHMARKS.md)."""

from __future__ import annotations

import logging
import threading
import time
import types

import pytest

from collector.coordinates import RankCoordinates
from collector.gpu_sampler import GpuSampler, load_nvml
from collector.stage_timer import StageTimer
from collector.writer.background import BackgroundWriter
from rankscope import gpu_health as gh
from rankscope import schema

COORDS = RankCoordinates(job="j", rank=3, pp=0, dp=3, tp=0, ep_group=0, node=0, host="gpu-node-7", gpu=3)


class NvmlError(Exception):
    pass


def fake_nvml(xids: list[int], supported: bool = True) -> types.SimpleNamespace:
    """A stand-in for the pynvml module: the calls the sampler makes, with a throttling GPU."""
    events = list(xids)

    def wait(_set, _timeout):
        if not events:
            raise NvmlError("timeout")
        return types.SimpleNamespace(eventData=events.pop(0))

    def unsupported(*_):
        raise NvmlError("not supported")

    return types.SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0,
        nvmlEventTypeXidCriticalError=8,
        nvmlDeviceGetHandleByIndex=lambda i: f"handle-{i}", nvmlDeviceGetUUID=lambda h: b"GPU-1234",
        nvmlEventSetCreate=lambda: "set", nvmlDeviceRegisterEvents=lambda h, t, s: None, nvmlEventSetFree=lambda s: None,
        nvmlEventSetWait_v2=wait,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x40 | 0x4,
        nvmlDeviceGetClockInfo=lambda h, c: 1190, nvmlDeviceGetTemperature=lambda h, s: 91,
        nvmlDeviceGetPowerUsage=lambda h: 455_000,
        nvmlDeviceGetTotalEccErrors=(lambda h, a, b: 2) if supported else unsupported,
        nvmlDeviceGetRemappedRows=(lambda h: (1, 4, 0, 1)) if supported else unsupported,
        nvmlDeviceGetPcieReplayCounter=(lambda h: 17) if supported else unsupported)


def test_without_nvml_one_log_line_and_nothing_else(caplog):
    """The real binding on a machine without NVML: start() says so once and starts nothing."""
    sink: list[dict] = []
    with caplog.at_level(logging.INFO, logger="collector.gpu_sampler"):
        assert load_nvml() is None
        caplog.clear()
        s = GpuSampler(COORDS, sink.append)
        assert s.start() is False
    lines = [r for r in caplog.records if r.name == "collector.gpu_sampler"]
    assert len(lines) == 1 and lines[0].getMessage().startswith("no GPU telemetry: NVML cannot start here")
    assert s._thread is None and sink == []


def test_interval_below_one_second_is_refused():
    with pytest.raises(ValueError, match="one sample a second"):
        GpuSampler(COORDS, print, interval_s=0.5, nvml=fake_nvml([]))


def test_a_sample_decodes_reasons_and_xids():
    s = GpuSampler(COORDS, print, nvml=fake_nvml([79, 48]), wall_clock_ms=lambda: 1_000)
    assert s.open()
    p = s.sample()
    assert p["time"] == 1_000 and p["host"] == "gpu-node-7" and p["gpu"] == 3 and p["rank"] == 3
    assert p[gh.UUID_FIELD] == "GPU-1234"
    assert gh.decode_reasons(p[gh.REASONS]) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert (p[gh.SM_CLOCK], p[gh.TEMPERATURE], p[gh.POWER]) == (1190.0, 91.0, 455.0)
    assert p[gh.XID] == 48 and s.sample()[gh.XID] == 0   # the last since the previous sample, then none
    assert (p[gh.ECC_DBE], p[gh.REMAPPED_ROWS], p[gh.ROW_REMAP_FAILURE], p[gh.PCIE_REPLAYS]) == (2, 4, 1, 17)


def test_unsupported_calls_leave_their_fields_out():
    s = GpuSampler(COORDS, print, nvml=fake_nvml([], supported=False))
    assert s.open()
    p = s.sample()
    assert gh.ECC_DBE not in p and gh.PCIE_REPLAYS not in p and gh.REMAPPED_ROWS not in p
    assert p[gh.SM_CLOCK] == 1190.0


def test_off_thread_through_the_background_writer_into_the_store(embedded_store):
    writer = BackgroundWriter(embedded_store, measurement=schema.GPU_HEALTH, flush_interval_s=0.1)
    s = GpuSampler(COORDS, writer.put, interval_s=1.0, nvml=fake_nvml([]))
    assert s.start()
    deadline = time.monotonic() + 10
    while s.samples < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    s.close()
    writer.close()
    assert s.samples >= 2 and s._thread is not None and not s._thread.is_alive()
    got = embedded_store.read(schema.GPU_HEALTH, "j")
    assert len(got) >= 2 and set(got["host"]) == {"gpu-node-7"} and set(got["gpu"]) == {3}
    assert (got[gh.REASONS] == 0x44).all() and (got[gh.TEMPERATURE] == 91.0).all()
    gaps = got["time"].diff().dropna()
    assert (gaps >= 900).all()   # at most one sample a second


# ---------------------------------------------------------------- beside the stage timer
SAMPLER_THREADS = ("rankscope-gpu-sampler", "rankscope-gpu-health")


def _sampler_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in SAMPLER_THREADS]


def test_the_stage_timer_samples_its_gpu_off_the_training_thread_until_close(embedded_store):
    """A training script passes its writer's put and nothing else: the timer's sampler writes
    gpu_health with the rank's stage_latency tags, from its own thread, and close() stops it."""
    nv = fake_nvml([79])
    calls: list[str] = []
    clock = nv.nvmlDeviceGetClockInfo
    nv.nvmlDeviceGetClockInfo = lambda h, c: calls.append(threading.current_thread().name) or clock(h, c)
    writer = BackgroundWriter(embedded_store, flush_interval_s=0.1)
    timer = StageTimer(COORDS, sink=writer.put, nvml=nv, gpu_health_interval_s=1.0)
    sampler = timer.gpu_sampler
    assert sampler is not None and sampler.running and sampler.writer is not None
    deadline = time.monotonic() + 10
    while sampler.samples < 2 and time.monotonic() < deadline:
        with timer.stage("mlp"):
            time.sleep(0.01)
        timer.step()
    timer.close()
    assert not sampler.running and _sampler_threads() == []
    n = sampler.samples
    assert n >= 2 and sampler.writer.stats().written == n    # its own writer flushed and closed
    timer.close()                                            # a second close does nothing more
    writer.close()
    assert calls and threading.main_thread().name not in calls and set(calls) == {"rankscope-gpu-sampler"}
    health = embedded_store.read(schema.GPU_HEALTH, "j")
    stages = embedded_store.read_stage_latency("j")
    assert len(health) == n and len(stages) >= 1
    tags = [t for t in schema.RANK_TAGS if t in stages.columns]
    assert {"job", "rank", "host", "gpu"} <= set(tags)
    assert {tuple(r) for r in health[tags].to_numpy()} == {tuple(r) for r in stages[tags].to_numpy()}
    assert (health[gh.TEMPERATURE] == 91.0).all() and health[gh.XID].max() == 79
    assert set(health[gh.UUID_FIELD]) == {"GPU-1234"}


def test_without_nvml_the_stage_timer_logs_one_line_and_starts_no_thread(embedded_store, caplog):
    writer = BackgroundWriter(embedded_store, flush_interval_s=0.1)
    with caplog.at_level(logging.INFO, logger="collector.gpu_sampler"):
        caplog.clear()
        timer = StageTimer(COORDS, sink=writer.put)
        timer.step()
        timer.close()
    writer.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "collector.gpu_sampler"]
    assert len(lines) == 1 and lines[0].startswith("no GPU telemetry: NVML cannot start here")
    assert timer.gpu_sampler is None and _sampler_threads() == []
    assert len(embedded_store.read_stage_latency("j")) == 1 and not len(embedded_store.read(schema.GPU_HEALTH, "j"))


def test_the_gpu_health_option(embedded_store, caplog):
    points: list[dict] = []
    writer = BackgroundWriter(embedded_store, flush_interval_s=0.1)
    cpu_rank = RankCoordinates(job="j", rank=0, pp=0, dp=0, tp=0, ep_group=0, node=0, host="h")
    with caplog.at_level(logging.INFO, logger="collector.gpu_sampler"):
        caplog.clear()
        assert StageTimer(COORDS, sink=writer.put, gpu_health=False, nvml=fake_nvml([])).gpu_sampler is None
        assert StageTimer(COORDS, sink=points.append, nvml=fake_nvml([])).gpu_sampler is None   # no writer: off
        assert StageTimer(cpu_rank, sink=writer.put, nvml=fake_nvml([])).gpu_sampler is None    # no GPU to watch
    assert not caplog.records and _sampler_threads() == []
    with pytest.raises(ValueError, match="gpu_health=True writes through the stage timer's BackgroundWriter"):
        StageTimer(COORDS, sink=points.append, gpu_health=True, nvml=fake_nvml([]))
    with pytest.raises(TypeError, match="gpu_health must be"):
        StageTimer(COORDS, sink=writer.put, gpu_health="yes")
    with pytest.raises(ValueError, match="one sample a second"):
        StageTimer(COORDS, sink=writer.put, nvml=fake_nvml([]), gpu_health_interval_s=0.2)
    # a callable takes the points (asked for outright: a rank that names no GPU samples NVML's device 0)
    timer = StageTimer(cpu_rank, sink=points.append, gpu_health=points.append, nvml=fake_nvml([]))
    deadline = time.monotonic() + 10
    while not points and time.monotonic() < deadline:
        time.sleep(0.02)
    timer.close()
    writer.close()
    assert points[0]["host"] == "h" and "gpu" not in points[0] and points[0][gh.TEMPERATURE] == 91.0
    assert timer.gpu_sampler._handle == "handle-0"
    assert timer.gpu_sampler.writer is None and not timer.gpu_sampler.running


def test_the_sampler_finds_the_ranks_gpu_as_nvml_numbers_it():
    def by_uuid(u: str) -> str:
        if not u.startswith("GPU-"):
            raise NvmlError(f"no GPU {u}")
        return f"handle-{u}"

    nv = fake_nvml([])
    nv.nvmlDeviceGetHandleByUUID = by_uuid
    uuid = RankCoordinates(job="j", rank=1, pp=0, dp=1, tp=0, ep_group=0, node=0, host="h", gpu=1, gpu_uuid="GPU-ab")
    found = {}
    for name, coords, env, device in [("uuid", uuid, {}, None), ("visible", COORDS, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, None),
                                      ("visible-uuid", COORDS, {"CUDA_VISIBLE_DEVICES": "0,1,2,GPU-cd"}, None),
                                      ("index", COORDS, {}, None), ("given", COORDS, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 2)]:
        s = GpuSampler(coords, print, nvml=nv, env=env, device=device)
        assert s.open() and s.open()
        found[name] = s._handle
    assert found == {"uuid": "handle-GPU-ab", "visible": "handle-7", "visible-uuid": "handle-GPU-cd",
                     "index": "handle-3", "given": "handle-2"}


def test_a_cuda_rank_that_names_no_gpu_is_not_sampled_by_default(embedded_store, caplog):
    """NVML numbers the machine's GPUs: a CUDA rank that names neither its index nor its UUID would
    sample device 0 under its own tags, another rank's GPU; by default it gets one line instead."""
    from collector.gpu_sampler import beside_timer

    writer = BackgroundWriter(embedded_store, flush_interval_s=0.1)
    unnamed = RankCoordinates(job="j", rank=6, pp=0, dp=6, tp=0, ep_group=0, node=0, host="h")
    try:
        with caplog.at_level(logging.INFO, logger="collector.gpu_sampler"):
            assert beside_timer(unnamed, writer.put, cuda=True, nvml=fake_nvml([])) is None
        assert [r.getMessage() for r in caplog.records] == [
            "no GPU telemetry: rank 6 names no GPU (RankCoordinates gpu or gpu_uuid); gpu_health=True samples index 0"]
        named = RankCoordinates(job="j", rank=6, pp=0, dp=6, tp=0, ep_group=0, node=0, host="h", gpu_uuid="GPU-ab")
        sampler = beside_timer(named, writer.put, cuda=True, nvml=fake_nvml([]))
        assert sampler is not None
        sampler.close()
    finally:
        writer.close()
