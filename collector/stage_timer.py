"""Per-stage timing of a training iteration: one ``stage_latency`` point per rank per step.

Two lines in a training script::

    timer = StageTimer(coords, sink=writer.put)       # once
    with timer.stage("mlp"):                         # around a region, or
        h = model.mlp(h)
    timer.time_module(model.attention, "attention")  # forward (+backward) hooks
    ...
    timer.step()                                     # at the iteration boundary

A stage's time in an iteration is the union of its intervals (a stage entered
once per layer adds up; nested or overlapping intervals are not counted twice).
Every point carries the rank's tags, including its ``host`` and, where known, its
``gpu`` (and the ``gpu_uuid`` field), from :class:`~collector.coordinates.RankCoordinates`,
as :func:`rankscope.stage_rows.stage_rows` builds a row of them.

Any order of calls is safe (see :class:`StageTimer`): ``stop()`` while paused
does nothing, :meth:`StageTimer.pause` and :meth:`StageTimer.reset` discard the
current iteration (a region opened before them is dropped when it closes), a
region still open at :meth:`StageTimer.step` is split between the two iterations.

The marks come from a :class:`~collector.stage_timing.timing.Timing`. On CPU
(:class:`~collector.stage_timing.cpu.CpuTiming`) from the ``clock`` parameter (default
``time.perf_counter``), and the points' timestamps from ``wall_clock_ms`` (default the system
time), both injectable so that tests drive a fake clock. On GPU (``device="cuda"``,
:class:`~collector.stage_timing.cuda.CudaTiming`) they are CUDA events recorded on the stream
the work runs on (pass ``stream=`` for a collective on the communication stream);
:meth:`StageTimer.step` only records one more event and queues the iteration, which is
resolved at a later boundary once its last event has completed (``Event.query()``, never a
synchronisation), so the hot path never waits for the device. :meth:`StageTimer.close` flushes.

Names are the schema's stage names or their aliases (``Stage.aliases`` from a
``[stages]`` config, plus :data:`MEGATRON_ALIASES`), so Megatron-LM's timer
names map to stages (see :meth:`StageTimer.megatron_timers`).

GPU telemetry (``gpu_health``, :mod:`collector.gpu_sampler`): by default, when ``sink`` is a
:class:`~collector.writer.background.BackgroundWriter`'s ``put`` and the rank names its GPU (``gpu``
or ``gpu_uuid`` known), an NVML sampler of that GPU runs on a thread of its own, writing
``gpu_health`` points with the rank's tags through a second writer on the same store every
``gpu_health_interval_s`` (5 s, at least 1); close() stops it. No NVML: one log line, no thread.
``gpu_health=False``: off; ``True``: on (a sink that is no writer is an error); a callable takes
the points; ``nvml`` stands in for ``pynvml``. :meth:`StageTimer.step` is the same either way.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from collector.coordinates import RankCoordinates
from collector.gpu_sampler import DEFAULT_INTERVAL_S, GpuSampler, beside_timer
from collector.stage_timing.cpu import CpuTiming
from collector.stage_timing.cuda import CudaTiming
from collector.stage_timing.hooks import ModuleHooks, time_ddp_allreduce
from collector.stage_timing.megatron import MegatronTimers
from collector.stage_timing.regions import NULL_REGION, NullRegion, Recorder, Region
from collector.stage_timing.timing import Iteration, Timing, union_length
from rankscope import schema
from rankscope.schema import DEFAULT_STAGES, SchemaError, StageSet

__all__ = ["MEGATRON_ALIASES", "MegatronTimers", "Sink", "StageTimer", "union_length", "wall_ms"]

log = logging.getLogger(__name__)

#: Megatron-LM timer names -> default stages (a config's ``alias`` entries add to these).
MEGATRON_ALIASES: dict[str, str] = {
    "batch-generator": "dataloader",
    "forward-recv": "pp_recv",
    "backward-recv": "pp_recv",
    "forward-send": "pp_send",
    "backward-send": "pp_send",
    "grads-reduce-scatter": "reduce_scatter",
    "params-all-gather": "all_gather",
    "optimizer": "optimizer",
}

Sink = Callable[[dict[str, Any]], None]


def wall_ms() -> int:
    """The system time in epoch milliseconds (the default timestamp of the points)."""
    return time.time_ns() // 1_000_000


def _stage_index(stages: StageSet, aliases: Mapping[str, str] | None) -> dict[str, int]:
    """Column index of every stage name and alias (the stage set's, Megatron's, ``aliases``)."""
    names = stages.names
    index: dict[str, int] = {n: i for i, n in enumerate(names)}
    for i, st in enumerate(stages):
        for a in st.aliases:
            index.setdefault(a, i)
    for alias, target in {**MEGATRON_ALIASES, **(aliases or {})}.items():
        if target in stages:
            index.setdefault(alias, stages.index(target))
        elif aliases and alias in aliases:
            raise SchemaError(f"alias {alias!r} maps to unknown stage {target!r}; "
                              f"known: {', '.join(names)}")
    return index


def _point_tags(coords: RankCoordinates) -> dict[str, Any]:
    """The constant part of every point: the tags and fields of the rank's row as
    :func:`~rankscope.stage_rows.stage_rows` builds it, made once (a step adds the times)."""
    row = coords.rows(0, 0, {}).to_dict("records")[0]
    return {k: v for k, v in row.items() if k not in ("time", schema.ITERATION_FIELD)}


class StageTimer:
    """Times named stages of each iteration and emits one point per :meth:`step`.

    Parameters
    ----------
    coords: the rank's tags (:func:`collector.coordinates.detect`).
    sink: called with each point (a dict: ``time`` epoch ms, the tags,
        ``iteration``, ``iteration_ms`` and one ms value per stage seen);
        typically :meth:`collector.writer.BackgroundWriter.put`.
    stages: the job's stage set (default :data:`~rankscope.schema.DEFAULT_STAGES`).
    aliases: extra framework name -> stage name mappings.
    device: ``"cpu"`` (marks from ``clock``) or ``"cuda"`` (CUDA events).
    start_iteration: number of the first iteration (e.g. after a checkpoint).
    event_factory: on GPU, makes a timing event (default
        ``torch.cuda.Event(enable_timing=True)``).
    clock: on CPU, the marks: a monotonic clock in seconds (default ``time.perf_counter``).
    wall_clock_ms: the points' timestamps in epoch ms (default :func:`wall_ms`); the
        timer keeps them strictly increasing (one point per ms per rank at most).
    gpu_health: the rank's GPU telemetry beside the timer (see the module docstring): None
        (the default: on for a writer's sink and a rank that names its GPU, where NVML loads), True,
        False, or a callable taking each ``gpu_health`` point.
    nvml: NVML's module for that sampler (default ``pynvml``); gpu_health_interval_s: its
        period (at least 1 s).

    Calls may come in any order:

    - ``stop(name)`` while paused does nothing; without a matching ``start`` while
      timing it raises :class:`RuntimeError` (a Megatron timer's ``stop()`` never raises);
    - :meth:`pause` and :meth:`reset` discard the current iteration: its intervals are
      forgotten and a region open at that moment is dropped when it closes (its start
      belongs to the discarded time); ``start`` while paused is dropped the same way;
    - a region still open at :meth:`step` is split at the boundary: the part before
      counts in the iteration that ends, the rest in the next one;
    - :meth:`step` while paused only advances the iteration number.

    What it holds is read through properties: :attr:`paused`, :attr:`pending`,
    :attr:`emitted`, :attr:`last_point`, :attr:`timed_modules`, :attr:`hooks_attached`
    and :attr:`timing`.
    """

    def __init__(
        self,
        coords: RankCoordinates,
        sink: Sink | None = None,
        stages: StageSet = DEFAULT_STAGES,
        aliases: Mapping[str, str] | None = None,
        device: str = "cpu",
        start_iteration: int = 0,
        event_factory: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock_ms: Callable[[], int] = wall_ms,
        gpu_health: bool | Sink | None = None,
        nvml: Any = None,
        gpu_health_interval_s: float = DEFAULT_INTERVAL_S,
    ):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.coords = coords
        self.sink = sink
        self.stages = stages
        self.device = device
        self.iteration = start_iteration
        self._wall_ms = wall_clock_ms
        self._tags = _point_tags(coords)
        self._names = stages.names
        self._index = _stage_index(stages, aliases)
        self._regions: dict[tuple[str, int], Region] = {}
        self._last_time_ms = 0
        self._emitted = 0
        self._last_point: dict[str, Any] | None = None
        self._timing: Timing = CpuTiming(clock) if device == "cpu" else CudaTiming(event_factory)
        self._rec = Recorder(self._timing)
        self._hooks = ModuleHooks(self._rec)
        self._gpu = beside_timer(coords, sink, gpu_health, cuda=device == "cuda", nvml=nvml,
                                 interval_s=gpu_health_interval_s)

    # ------------------------------------------------------------ what it holds
    @property
    def paused(self) -> bool:
        """Between :meth:`pause` and :meth:`resume`."""
        return self._rec.paused

    @property
    def timing(self) -> Timing:
        """Where the marks come from (:class:`~collector.stage_timing.cpu.CpuTiming` or
        :class:`~collector.stage_timing.cuda.CudaTiming`)."""
        return self._timing

    @property
    def pending(self) -> int:
        """Iterations ended but not emitted yet (on GPU: their events have not completed)."""
        return self._timing.pending

    @property
    def emitted(self) -> int:
        """Points emitted so far."""
        return self._emitted

    @property
    def last_point(self) -> dict[str, Any] | None:
        """A copy of the last point emitted (None before the first)."""
        return None if self._last_point is None else dict(self._last_point)

    @property
    def timed_modules(self) -> list[str]:
        """The stages of the modules :meth:`time_module` times (kept while paused)."""
        return [name for _, name, _, _ in self._hooks.modules]

    @property
    def gpu_sampler(self) -> GpuSampler | None:
        """The rank's GPU sampler beside the timer (None: off, or no NVML here)."""
        return self._gpu

    @property
    def hooks_attached(self) -> int:
        """Module hooks in place now (none while paused)."""
        return self._hooks.attached

    # ---------------------------------------------------------------- names
    def stage_index(self, name: str) -> int:
        """Column index of a stage name or alias (raises naming the known stages)."""
        try:
            return self._index[name]
        except KeyError:
            raise SchemaError(f"unknown stage {name!r}; known stages: {', '.join(self._names)}") from None

    def resolves(self, name: str) -> str | None:
        """The stage a name or alias maps to, or None."""
        i = self._index.get(name)
        return None if i is None else self._names[i]

    # --------------------------------------------------------------- regions
    def stage(self, name: str, stream: Any = None) -> Region | NullRegion:
        """Context manager timing a region as stage ``name`` (or an alias of it).

        ``stream``: on GPU, the CUDA stream the region's work runs on (default the
        current stream), e.g. the communication stream of a collective.
        """
        if self._rec.paused:
            return NULL_REGION
        key = (name, id(stream))
        region = self._regions.get(key)
        if region is None:
            region = self._regions[key] = Region(self._rec, self.stage_index(name), stream)
        return region

    def _region(self, name: str) -> Region:
        """The reusable region of a stage name on the default stream (created on first use)."""
        region = self._regions.get((name, id(None)))
        if region is None:
            region = self._regions[(name, id(None))] = Region(self._rec, self.stage_index(name))
        return region

    def record(self, name: str, start: Any, end: Any) -> None:
        """Add an interval measured elsewhere (marks from :meth:`mark`), e.g. in a
        communication hook's completion callback. Ignored while paused."""
        idx = self.stage_index(name)
        if not self._rec.paused:
            self._rec.intervals.append((idx, start, end))

    def mark(self, stream: Any = None) -> Any:
        """A timestamp in this timer's clock (``clock`` seconds, or a recorded CUDA event)."""
        return self._timing.mark(stream)

    def start(self, name: str) -> None:
        """Open a region by name (for frameworks with start/stop timers). While paused the
        start is remembered as dropped, so its :meth:`stop` after :meth:`resume` is a no-op."""
        self._region(name).__enter__()

    def stop(self, name: str, missing_ok: bool = False) -> None:
        """Close the region opened by :meth:`start`.

        A no-op while paused, and for a start that :meth:`pause` / :meth:`reset` discarded.
        Raises :class:`RuntimeError` when the stage was not started (a bug in the caller),
        unless ``missing_ok`` (then nothing happens).
        """
        if self._rec.paused:
            region = self._regions.get((name, id(None)))
            if region is not None:
                region.__exit__(None, None, None)  # balances a dropped start, if any
            return
        region = self._region(name)
        if region.entered:
            region.__exit__(None, None, None)
        elif not missing_ok:
            raise RuntimeError(f"stage {name!r} stopped without being started")

    # ------------------------------------------------------------ torch hooks
    def time_module(self, module: Any, name: str, backward: bool = True) -> None:
        """Time a ``torch.nn.Module``'s forward (and, with ``backward``, its backward) as stage
        ``name`` (see :class:`~collector.stage_timing.hooks.ModuleHooks`)."""
        self._hooks.add(module, name, self.stage_index(name), backward)

    def time_ddp_allreduce(self, ddp_model: Any, name: str = "reduce_scatter") -> None:
        """Time DDP's gradient all-reduce as stage ``name`` with a communication hook.

        Each bucket's interval runs from the hook's call to the completion of its
        collective, so it includes the time spent waiting for the slowest rank.
        """
        time_ddp_allreduce(self._rec, ddp_model, self.stage_index(name))

    def megatron_timers(self, timers: Any = None) -> MegatronTimers:
        """A stand-in for Megatron-LM's ``Timers`` that also feeds this timer (see :class:`MegatronTimers`)."""
        return MegatronTimers(self, timers)

    def remove_hooks(self) -> None:
        """Remove the module hooks (the DDP communication hook stays: DDP allows one)."""
        self._hooks.remove()

    def pause(self) -> None:
        """Stop timing until :meth:`resume`, e.g. during evaluation: module hooks removed,
        regions, ``record()`` and ``stop()`` do nothing, ``step()`` only counts, the DDP hook
        passes through. The current iteration is discarded (regions open now are dropped
        when they close)."""
        if self._rec.paused:
            return
        self._discard()
        self._hooks.detach()
        self._rec.paused = True

    def resume(self) -> None:
        """Time again from here (the first iteration starts now)."""
        if not self._rec.paused:
            return
        self._rec.paused = False
        self._hooks.reattach()
        self.reset()

    # ------------------------------------------------------------ boundaries
    def step(self, iteration: int | None = None) -> None:
        """End the current iteration: emit its point (CPU) or queue it (GPU)."""
        if self._rec.paused:
            self.iteration = (self.iteration if iteration is None else iteration) + 1
            return
        end = self._timing.mark(None)
        for region in itertools.chain(self._regions.values(), self._hooks.regions):
            if region.open:
                region.split(end)
        self._hooks.clear_gradient_hooks()
        now = int(self._wall_ms())
        now = max(now, self._last_time_ms + 1)  # one point per ms per rank at most
        self._last_time_ms = now
        number = self.iteration if iteration is None else iteration
        begin, intervals = self._rec.take(end)
        self.iteration = number + 1
        self._timing.finish(Iteration(number, now, begin, end, intervals))
        self._emit_ready(block=False)

    def _discard(self) -> None:
        """Forget the current iteration: its intervals, open regions (dropped when they
        close), gradient hooks, and completions still in flight (by the epoch)."""
        self._rec.discard(itertools.chain(self._regions.values(), self._hooks.regions))
        self._hooks.clear_gradient_hooks()

    def reset(self) -> None:
        """Forget the current iteration and restart its clock (e.g. after warm-up or an
        evaluation pause that should not count as an iteration). Regions open now are
        dropped when they close."""
        self._discard()
        self._rec.restart()

    def close(self) -> None:
        """Resolve what is still pending (synchronises on GPU), remove the hooks and stop the
        GPU sampler (its own writer flushed)."""
        self._emit_ready(block=True)
        self.remove_hooks()
        if self._gpu is not None:
            self._gpu.close()

    def _emit_ready(self, block: bool) -> None:
        for it, ms in self._timing.collect(block):
            self._emit(it, ms)

    def _emit(self, it: Iteration, ms: list[float]) -> None:
        """The point of a resolved iteration (``ms``: offsets of :meth:`Iteration.marks`)."""
        spans: dict[int, list[tuple[float, float]]] = {}
        for k, (idx, _, _) in enumerate(it.intervals):
            spans.setdefault(idx, []).append((ms[1 + 2 * k], ms[2 + 2 * k]))
        point: dict[str, Any] = {"time": it.time_ms, **self._tags,
                                 schema.ITERATION_FIELD: it.iteration, schema.ITERATION_MS_FIELD: ms[0]}
        for idx, iv in spans.items():
            point[self._names[idx]] = union_length(iv)
        self._emitted += 1
        self._last_point = point
        if self.sink is not None:
            self.sink(point)
