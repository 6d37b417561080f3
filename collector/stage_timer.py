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
``gpu`` (and the ``gpu_uuid`` field), from :class:`~collector.coordinates.RankCoordinates`.

Any order of calls is safe (see :class:`StageTimer`): ``stop()`` while paused
does nothing, :meth:`StageTimer.pause` and :meth:`StageTimer.reset` discard the
current iteration (a region opened before them is dropped when it closes), a
region still open at :meth:`StageTimer.step` is split between the two iterations.

On CPU the marks come from the ``clock`` parameter (default ``time.perf_counter``)
and the points' timestamps from ``wall_clock_ms`` (default the system time), both
injectable so that tests drive a fake clock. On GPU (``device="cuda"``) they
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


def wall_ms() -> int:
    """The system time in epoch milliseconds (the default timestamp of the points)."""
    return time.time_ns() // 1_000_000


@dataclass
class _Iteration:
    """Marks of one iteration waiting to be resolved (GPU) or resolved at once (CPU)."""

    iteration: int
    time_ms: int
    begin: Any
    end: Any
    intervals: list[tuple[int, Any, Any]]


class _Region:
    """Reusable context manager for one stage (no allocation on the hot path).

    ``_open`` holds the marks of entries not yet closed (nested entries stack);
    ``_dropped`` counts entries whose interval is discarded when they close: made
    while paused, or opened before a :meth:`StageTimer.pause` / :meth:`StageTimer.reset`.
    """

    __slots__ = ("_timer", "_index", "_stream", "_open", "_dropped")

    def __init__(self, timer: StageTimer, index: int, stream: Any = None):
        self._timer = timer
        self._index = index
        self._stream = stream
        self._open: list[Any] = []
        self._dropped = 0

    def __enter__(self) -> _Region:
        t = self._timer
        if t.paused:
            self._dropped += 1
        else:
            self._open.append(t._mark(self._stream))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._open:  # never while paused: pause() moves the open entries to _dropped
            t = self._timer
            t._intervals.append((self._index, self._open.pop(), t._mark(self._stream)))
        elif self._dropped:
            self._dropped -= 1

    def _discard(self, pool: list[Any] | None) -> None:
        """Forget the open entries: their intervals are dropped when they close."""
        if self._open:
            self._dropped += len(self._open)
            if pool is not None:  # CUDA events go back to the pool (re-recorded on reuse)
                pool.extend(self._open)
            self._open.clear()


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
    device: ``"cpu"`` (marks from ``clock``) or ``"cuda"`` (CUDA events).
    start_iteration: number of the first iteration (e.g. after a checkpoint).
    event_factory: on GPU, makes a timing event (default
        ``torch.cuda.Event(enable_timing=True)``).
    clock: on CPU, the marks: a monotonic clock in seconds (default ``time.perf_counter``).
    wall_clock_ms: the points' timestamps in epoch ms (default :func:`wall_ms`); the
        timer keeps them strictly increasing (one point per ms per rank at most).

    Calls may come in any order:

    - ``stop(name)`` while paused does nothing; without a matching ``start`` while
      timing it raises :class:`RuntimeError` (a Megatron timer's ``stop()`` never raises);
    - :meth:`pause` and :meth:`reset` discard the current iteration: its intervals are
      forgotten and a region open at that moment is dropped when it closes (its start
      belongs to the discarded time); ``start`` while paused is dropped the same way;
    - a region still open at :meth:`step` is split at the boundary: the part before
      counts in the iteration that ends, the rest in the next one;
    - :meth:`step` while paused only advances the iteration number.
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
    ):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.coords = coords
        self.sink = sink
        self.stages = stages
        self.device = device
        self.iteration = start_iteration
        self._clock = clock
        self._wall_ms = wall_clock_ms
        self._tags = {**coords.tags(), **coords.fields()}  # constant part of every point
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
        self._hook_regions: list[_Region] = []  # forward regions of the module hooks
        self.paused = False
        self._epoch = 0  # advanced when an iteration is discarded: late completions are dropped
        self._last_time_ms = 0
        self.emitted = 0
        self._event_pool: list[Any] | None = None
        if device == "cuda":
            if event_factory is None:
                import torch

                def event_factory() -> Any:
                    return torch.cuda.Event(enable_timing=True)

            self._new_event = event_factory
            self._event_pool = []
        self._begin = self._mark(None)

    # ---------------------------------------------------------------- marks
    def _mark(self, stream: Any) -> Any:
        if self._event_pool is None:
            return self._clock()
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

    def _region(self, name: str) -> _Region:
        """The reusable region of a stage name on the default stream (created on first use)."""
        region = self._regions.get((name, id(None)))
        if region is None:
            region = self._regions[(name, id(None))] = _Region(self, self.stage_index(name))
        return region

    def record(self, name: str, start: Any, end: Any) -> None:
        """Add an interval measured elsewhere (marks from :meth:`mark`), e.g. in a
        communication hook's completion callback. Ignored while paused."""
        idx = self.stage_index(name)
        if not self.paused:
            self._intervals.append((idx, start, end))

    def mark(self, stream: Any = None) -> Any:
        """A timestamp in this timer's clock (``clock`` seconds, or a recorded CUDA event)."""
        return self._mark(stream)

    def start(self, name: str) -> None:
        """Open a region by name (for frameworks with start/stop timers). While paused the
        start is remembered as dropped, so its :meth:`stop` after :meth:`resume` is a no-op."""
        self._region(name).__enter__()

    def stop(self, name: str) -> None:
        """Close the region opened by :meth:`start`.

        A no-op while paused, and for a start that :meth:`pause` / :meth:`reset` discarded.
        Raises :class:`RuntimeError` when the stage was not started (a bug in the caller).
        """
        if not self._stop(name):
            raise RuntimeError(f"stage {name!r} stopped without being started")

    def _stop(self, name: str) -> bool:
        """Close ``name``'s region; False when nothing was open or dropped (while timing)."""
        if self.paused:
            region = self._regions.get((name, id(None)))
            if region is not None:
                region.__exit__(None, None, None)  # balances a dropped start, if any
            return True
        region = self._region(name)
        if not region._open and not region._dropped:
            return False
        region.__exit__(None, None, None)
        return True

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
        self._hook_regions.append(fwd)
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
            epoch = timer._epoch

            def bwd_begin(grad: Any) -> None:
                began.append(timer._mark(None))

            def bwd_end(grad: Any) -> None:
                if began:
                    timer._late_interval(idx, began[0], epoch)

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
            t0, epoch = timer._mark(None), timer._epoch

            def done(f):
                timer._late_interval(idx, t0, epoch)
                return f.value()[0]

            return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(done)

        ddp_model.register_comm_hook(None, timed_allreduce)

    def megatron_timers(self, timers: Any = None) -> MegatronTimers:
        """A stand-in for Megatron-LM's ``Timers`` that also feeds this timer (see :class:`MegatronTimers`)."""
        return MegatronTimers(self, timers)

    def _late_interval(self, idx: int, start: Any, epoch: int) -> None:
        """An interval closed by a hook or a completion callback: dropped when the
        iteration it began in was discarded (pause/reset) or the timer is paused."""
        if self.paused or epoch != self._epoch:
            return
        self._intervals.append((idx, start, self._mark(None)))

    def remove_hooks(self) -> None:
        """Remove the module hooks (the DDP communication hook stays: DDP allows one)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._timed_modules.clear()
        self._hook_regions.clear()

    def pause(self) -> None:
        """Stop timing until :meth:`resume`, e.g. during evaluation: module hooks removed,
        regions, ``record()`` and ``stop()`` do nothing, ``step()`` only counts, the DDP hook
        passes through. The current iteration is discarded (regions open now are dropped
        when they close)."""
        if self.paused:
            return
        self._discard()
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
        for region in self._regions.values():
            if region._open:
                self._split(region, end)
        for region in self._hook_regions:
            if region._open:
                self._split(region, end)
        if self._tensor_hooks:  # gradient hooks of this iteration (they would stay on leaf inputs)
            for h in self._tensor_hooks:
                h.remove()
            self._tensor_hooks.clear()
        now = int(self._wall_ms())
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

    def _split(self, region: _Region, end: Any) -> None:
        """A region open at the iteration boundary: its part up to ``end`` counts in the
        iteration that ends, the rest in the next (each CUDA event is used once)."""
        for k, a in enumerate(region._open):
            if self._event_pool is None:
                close, reopen = end, end
            else:
                close, reopen = self._mark(region._stream), self._mark(region._stream)
            self._intervals.append((region._index, a, close))
            region._open[k] = reopen

    def _discard(self) -> None:
        """Forget the current iteration: its intervals, open regions (dropped when they
        close), gradient hooks, and completions still in flight (by the epoch)."""
        self._epoch += 1
        for region in self._regions.values():
            region._discard(self._event_pool)
        for region in self._hook_regions:
            region._discard(self._event_pool)
        for h in self._tensor_hooks:
            h.remove()
        self._tensor_hooks.clear()
        if self._event_pool is not None:
            for _, a, b in self._intervals:
                self._event_pool.extend((a, b))
        self._intervals = []

    def reset(self) -> None:
        """Forget the current iteration and restart its clock (e.g. after warm-up or an
        evaluation pause that should not count as an iteration). Regions open now are
        dropped when they close."""
        self._discard()
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
    (when given) so its own logging keeps working. Megatron calls its timers during
    evaluation too, so they follow the stage timer's state at each call: while it is
    paused ``start()``/``stop()`` only reach Megatron's timers, and ``stop()`` never
    raises on the stage timer's account (a stop without a start is Megatron's business).
    """

    def __init__(self, timer: StageTimer, timers: Any = None):
        self._timer = timer
        self._inner = timers

    def __call__(self, name: str, log_level: int | None = None) -> _MegatronTimer:
        inner = None
        if self._inner is not None:
            inner = self._inner(name, log_level) if log_level is not None else self._inner(name)
        timed = self._timer.resolves(name) is not None
        return _MegatronTimer(self._timer if timed else None, name, inner)

    def __getattr__(self, attr: str) -> Any:  # log(), write(), ... of the wrapped Timers
        if self._inner is None:
            raise AttributeError(attr)
        return getattr(self._inner, attr)


class _MegatronTimer:
    """One Megatron timer: ``start()``/``stop()`` feed the stage timer and the wrapped one."""

    def __init__(self, timer: StageTimer | None, name: str, inner: Any):
        self._timer = timer  # None: the name maps to no stage
        self._name = name
        self._inner = inner

    def start(self, barrier: bool = False) -> None:
        if self._inner is not None:
            self._inner.start(barrier=barrier)
        if self._timer is not None:
            self._timer.start(self._name)

    def stop(self, barrier: bool = False) -> None:
        if self._timer is not None:
            self._timer._stop(self._name)  # False (nothing open) is ignored: never raises
        if self._inner is not None:
            self._inner.stop(barrier=barrier)

    def __getattr__(self, attr: str) -> Any:
        if self._inner is None:
            raise AttributeError(attr)
        return getattr(self._inner, attr)
