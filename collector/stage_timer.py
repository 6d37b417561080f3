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

On CPU the marks are ``time.perf_counter()``. On GPU (``device="cuda"``) they
are CUDA events recorded on the stream the work runs on (pass ``stream=`` for a
collective on the communication stream); :meth:`StageTimer.step` only records
one more event and queues the iteration, which is resolved at a later boundary
once its last event has completed (``Event.query()``, never a synchronisation),
so the hot path never waits for the device. :meth:`StageTimer.close` flushes.

Names are the schema's stage names or their aliases (``Stage.aliases`` from a
``[stages]`` config, plus :data:`MEGATRON_ALIASES`), so Megatron-LM's timer
names map to stages (see :meth:`StageTimer.megatron_timers`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from collector.coordinates import RankCoordinates
from rankscope import schema
from rankscope.schema import DEFAULT_STAGES, SchemaError, StageSet

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


@dataclass
class _Iteration:
    """Marks of one iteration waiting to be resolved (GPU) or resolved at once (CPU)."""

    iteration: int
    time_ms: int
    begin: Any
    end: Any
    intervals: list[tuple[int, Any, Any]]


class _Region:
    """Reusable context manager for one stage (no allocation on the hot path)."""

    __slots__ = ("_timer", "_index", "_stream", "_open")

    def __init__(self, timer: StageTimer, index: int, stream: Any = None):
        self._timer = timer
        self._index = index
        self._stream = stream
        self._open: list[Any] = []

    def __enter__(self) -> _Region:
        self._open.append(self._timer._mark(self._stream))
        return self

    def __exit__(self, *exc: object) -> None:
        t = self._timer
        t._intervals.append((self._index, self._open.pop(), t._mark(self._stream)))


class _NullRegion:
    """What :meth:`StageTimer.stage` returns while the timer is paused."""

    __slots__ = ()

    def __enter__(self) -> _NullRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_REGION = _NullRegion()


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
    device: ``"cpu"`` (perf_counter) or ``"cuda"`` (CUDA events).
    start_iteration: number of the first iteration (e.g. after a checkpoint).
    event_factory: on GPU, makes a timing event (default
        ``torch.cuda.Event(enable_timing=True)``).
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
    ):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.coords = coords
        self.sink = sink
        self.stages = stages
        self.device = device
        self.iteration = start_iteration
        self._tags = coords.tags()
        self._names = stages.names
        self._index: dict[str, int] = {n: i for i, n in enumerate(self._names)}
        for i, st in enumerate(stages):
            for a in st.aliases:
                self._index.setdefault(a, i)
        for alias, target in {**MEGATRON_ALIASES, **(aliases or {})}.items():
            if target in stages:
                self._index.setdefault(alias, stages.index(target))
            elif aliases and alias in aliases:
                raise SchemaError(f"alias {alias!r} maps to unknown stage {target!r}; "
                                  f"known: {', '.join(self._names)}")
        self._regions: dict[tuple[str, int], _Region] = {}
        self._intervals: list[tuple[int, Any, Any]] = []
        self._pending: deque[_Iteration] = deque()
        self._hooks: list[Any] = []
        self._tensor_hooks: list[Any] = []
        self._timed_modules: list[tuple[Any, str, bool]] = []
        self.paused = False
        self._last_time_ms = 0
        self.emitted = 0
        if device == "cuda":
            if event_factory is None:
                import torch

                def event_factory() -> Any:
                    return torch.cuda.Event(enable_timing=True)

            self._new_event = event_factory
            self._event_pool: list[Any] = []
        self._begin = self._mark(None)

    # ---------------------------------------------------------------- marks
    def _mark(self, stream: Any) -> Any:
        if self.device == "cpu":
            return time.perf_counter()
        ev = self._event_pool.pop() if self._event_pool else self._new_event()
        ev.record(stream)
        return ev

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
    def stage(self, name: str, stream: Any = None) -> _Region | _NullRegion:
        """Context manager timing a region as stage ``name`` (or an alias of it).

        ``stream``: on GPU, the CUDA stream the region's work runs on (default the
        current stream), e.g. the communication stream of a collective.
        """
        if self.paused:
            return _NULL_REGION
        key = (name, id(stream))
        region = self._regions.get(key)
        if region is None:
            region = self._regions[key] = _Region(self, self.stage_index(name), stream)
        return region

    def record(self, name: str, start: Any, end: Any) -> None:
        """Add an interval measured elsewhere (marks from :meth:`mark`), e.g. in a
        communication hook's completion callback."""
        self._intervals.append((self.stage_index(name), start, end))

    def mark(self, stream: Any = None) -> Any:
        """A timestamp in this timer's clock (perf_counter seconds, or a recorded CUDA event)."""
        return self._mark(stream)

    def start(self, name: str) -> None:
        """Open a region by name (for frameworks with start/stop timers)."""
        self.stage(name).__enter__()

    def stop(self, name: str) -> None:
        """Close the region opened by :meth:`start`."""
        region = self.stage(name)
        if not region._open:
            raise RuntimeError(f"stage {name!r} stopped without being started")
        region.__exit__(None, None, None)

    # ------------------------------------------------------------ torch hooks
    def time_module(self, module: Any, name: str, backward: bool = True) -> None:
        """Time a ``torch.nn.Module``'s forward (and, with ``backward``, its backward) as stage ``name``.

        The forward by forward pre-/post-hooks. The backward by two gradient hooks the
        forward hook puts on the module's output (its gradient is complete: the
        module's backward starts) and on its input (its gradient is complete: the
        backward ends); cheaper than full backward hooks, which cost this demo's
        model ~8%. So a backward is timed only when the input needs gradients (not
        for a first layer fed plain data).
        """
        idx = self.stage_index(name)
        self._timed_modules.append((module, name, backward))
        # Hooks must return None: a returned value would replace the module's inputs/outputs.
        fwd = _Region(self, idx)
        timer = self

        def fwd_begin(module: Any, args: Any) -> None:
            fwd.__enter__()

        def fwd_end(module: Any, args: Any, out: Any) -> None:
            fwd.__exit__()
            if not backward:
                return
            t_in, t_out = _first_grad_tensor(args), _first_grad_tensor(out)
            if t_in is None or t_out is None:
                return
            began: list[Any] = []

            def bwd_begin(grad: Any) -> None:
                began.append(timer._mark(None))

            def bwd_end(grad: Any) -> None:
                if began:
                    timer._intervals.append((idx, began[0], timer._mark(None)))

            timer._tensor_hooks.append(t_out.register_hook(bwd_begin))
            timer._tensor_hooks.append(t_in.register_hook(bwd_end))

        self._hooks.append(module.register_forward_pre_hook(fwd_begin))
        self._hooks.append(module.register_forward_hook(fwd_end))

    def time_ddp_allreduce(self, ddp_model: Any, name: str = "reduce_scatter") -> None:
        """Time DDP's gradient all-reduce as stage ``name`` with a communication hook.

        Each bucket's interval runs from the hook's call to the completion of its
        collective, so it includes the time spent waiting for the slowest rank.
        """
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        idx = self.stage_index(name)
        timer = self

        # DDP's default hook (average = divide, then all-reduce) with the timing in its one
        # completion callback. No annotations: DDP checks them against dist.GradBucket.
        def timed_allreduce(process_group, bucket):
            if timer.paused:
                return allreduce_hook(process_group, bucket)
            group = process_group if process_group is not None else dist.group.WORLD
            tensor = bucket.buffer()
            tensor.div_(group.size())
            t0 = timer._mark(None)

            def done(f):
                timer._intervals.append((idx, t0, timer._mark(None)))
                return f.value()[0]

            return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(done)

        ddp_model.register_comm_hook(None, timed_allreduce)

    def megatron_timers(self, timers: Any = None) -> MegatronTimers:
        """A stand-in for Megatron-LM's ``Timers`` that also feeds this timer (see :class:`MegatronTimers`)."""
        return MegatronTimers(self, timers)

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._timed_modules.clear()

    def pause(self) -> None:
        """Stop timing (module hooks removed, regions and ``step()`` do nothing, the DDP
        hook passes through) until :meth:`resume`; e.g. during evaluation."""
        if self.paused:
            return
        modules = list(self._timed_modules)
        self.remove_hooks()
        self._timed_modules = modules
        self.paused = True

    def resume(self) -> None:
        """Time again from here (the first iteration starts now)."""
        if not self.paused:
            return
        self.paused = False
        modules, self._timed_modules = self._timed_modules, []
        for module, name, backward in modules:
            self.time_module(module, name, backward)
        self.reset()

    # ------------------------------------------------------------ boundaries
    def step(self, iteration: int | None = None) -> None:
        """End the current iteration: emit its point (CPU) or queue it (GPU)."""
        if self.paused:
            self.iteration = (self.iteration if iteration is None else iteration) + 1
            return
        end = self._mark(None)
        if self._tensor_hooks:  # gradient hooks of this iteration (they would stay on leaf inputs)
            for h in self._tensor_hooks:
                h.remove()
            self._tensor_hooks.clear()
        now = int(time.time() * 1000)
        now = max(now, self._last_time_ms + 1)  # one point per ms per rank at most
        self._last_time_ms = now
        it = _Iteration(self.iteration if iteration is None else iteration, now, self._begin, end,
                        self._intervals)
        self._intervals = []
        self._begin = end
        self.iteration = it.iteration + 1
        if self.device == "cpu":
            self._emit(it, _cpu_offsets)
        else:
            self._pending.append(it)
            self._drain(block=False)

    def reset(self) -> None:
        """Forget the current iteration's intervals and restart its clock (e.g. after
        warm-up or an evaluation pause that should not count as an iteration)."""
        for region in self._regions.values():
            region._open.clear()
        self._intervals = []
        self._begin = self._mark(None)

    def close(self) -> None:
        """Resolve what is still pending (synchronises on GPU) and remove the hooks."""
        self._drain(block=True)
        self.remove_hooks()

    def _drain(self, block: bool) -> None:
        while self._pending:
            it = self._pending[0]
            # every mark must be complete: some were recorded on other (communication) streams
            if not block and not (it.end.query() and all(a.query() and b.query() for _, a, b in it.intervals)):
                return
            if block:
                it.end.synchronize()
                for _, _a, b in it.intervals:
                    b.synchronize()
            self._pending.popleft()
            self._emit(it, self._gpu_offsets)

    def _gpu_offsets(self, begin: Any, marks: list[Any]) -> list[float]:
        out = [begin.elapsed_time(m) for m in marks]
        # marks[0] is this iteration's end = the next iteration's begin: keep it
        self._event_pool.append(begin)
        self._event_pool.extend(marks[1:])
        return out

    def _emit(self, it: _Iteration, offsets: Callable[[Any, list[Any]], list[float]]) -> None:
        marks = [it.end]
        for _, a, b in it.intervals:
            marks.append(a)
            marks.append(b)
        ms = offsets(it.begin, marks)
        spans: dict[int, list[tuple[float, float]]] = {}
        for k, (idx, _, _) in enumerate(it.intervals):
            spans.setdefault(idx, []).append((ms[1 + 2 * k], ms[2 + 2 * k]))
        point: dict[str, Any] = {"time": it.time_ms, **self._tags,
                                 schema.ITERATION_FIELD: it.iteration, schema.ITERATION_MS_FIELD: ms[0]}
        for idx, iv in spans.items():
            point[self._names[idx]] = union_length(iv)
        self.emitted += 1
        if self.sink is not None:
            self.sink(point)


def _first_grad_tensor(value: Any) -> Any:
    """The first tensor in a module's inputs/outputs that takes part in autograd, or None."""
    if getattr(value, "requires_grad", False) and hasattr(value, "register_hook"):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_grad_tensor(v)
            if t is not None:
                return t
    elif isinstance(value, dict):
        return _first_grad_tensor(list(value.values()))
    return None


def _cpu_offsets(begin: float, marks: list[float]) -> list[float]:
    return [(m - begin) * 1000.0 for m in marks]


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping ``(start, end)`` intervals."""
    if len(intervals) == 1:
        a, b = intervals[0]
        return max(b - a, 0.0)
    total = 0.0
    cur_a, cur_b = None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


class MegatronTimers:
    """Drop-in for Megatron-LM's ``Timers`` (``timers(name, log_level).start()/.stop()``).

    Names that map to a stage (aliases, :data:`MEGATRON_ALIASES`) are timed by the
    :class:`StageTimer`; every call is forwarded to the wrapped Megatron ``Timers``
    (when given) so its own logging keeps working.
    """

    def __init__(self, timer: StageTimer, timers: Any = None):
        self._timer = timer
        self._inner = timers

    def __call__(self, name: str, log_level: int | None = None) -> _MegatronTimer:
        inner = None
        if self._inner is not None:
            inner = self._inner(name, log_level) if log_level is not None else self._inner(name)
        stage = self._timer.resolves(name)
        return _MegatronTimer(None if stage is None else self._timer.stage(name), inner)

    def __getattr__(self, attr: str) -> Any:  # log(), write(), ... of the wrapped Timers
        if self._inner is None:
            raise AttributeError(attr)
        return getattr(self._inner, attr)


class _MegatronTimer:
    def __init__(self, region: _Region | None, inner: Any):
        self._region = region
        self._inner = inner

    def start(self, barrier: bool = False) -> None:
        if self._inner is not None:
            self._inner.start(barrier=barrier)
        if self._region is not None:
            self._region.__enter__()

    def stop(self, barrier: bool = False) -> None:
        if self._region is not None and self._region._open:
            self._region.__exit__(None, None, None)
        if self._inner is not None:
            self._inner.stop(barrier=barrier)

    def __getattr__(self, attr: str) -> Any:
        if self._inner is None:
            raise AttributeError(attr)
        return getattr(self._inner, attr)
