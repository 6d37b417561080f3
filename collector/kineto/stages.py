"""Name stages: which stage every host span and device event of a trace counts for.

Host events by their name (:class:`StagePatterns`), plus the backward operators the
forward/backward flows link to a forward operator inside a named event; device events by
their own name, else their collective, else the host code that launched them, else their
model-agnostic class (:func:`kernel_class`). See :mod:`collector.kineto` for the rules.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collector.kineto.parse import MEMORY_CATS, ParsedTrace, TraceError
from rankscope import schema

#: Backend prefixes of PyTorch's collective annotations (``nccl:all_reduce``, ``gloo:send``).
_BACKEND = r"^(?:nccl|gloo|ucc|mpi|xccl|hccl):_?"
#: NCCL kernel name prefixes: ``ncclDevKernel_`` (2.19+), ``ncclKernel_`` (2.8-2.18), bare ``nccl`` (older).
_NCCL_KERNEL = r"nccl(?:DevKernel_|Kernel_)?"

#: Default stage -> name patterns (regular expressions, ``re.search``), first stage wins.
DEFAULT_PATTERNS: dict[str, tuple[str, ...]] = {
    "attention": (r"^nn\.Module: .*[Aa]ttention", r"flash_attn|scaled_dot_product|[Ff]lash[Aa]ttn"),
    "mlp": (r"^nn\.Module: .*(MLP|Mlp|mlp|[Ee]xpert|FeedForward|FFN)",),
    "dispatch": (r"^rankscope:dispatch$", _BACKEND + r"all_?to_?all", r"^c10d::_?all_?to_?all"),
    "combine": (r"^rankscope:combine$",),
    "reduce_scatter": (_BACKEND + r"(?:all_?reduce|reduce_?scatter|reduce)(?:_|$)",
                       r"^c10d::_?(?:allreduce|reduce_scatter|reduce)(?:_|$)",
                       _NCCL_KERNEL + r"(?:AllReduce|ReduceScatter|Reduce)"),
    "all_gather": (_BACKEND + r"(?:all_?gather|broadcast)(?:_|$)",
                   r"^c10d::_?(?:allgather|broadcast)(?:_|$)",
                   _NCCL_KERNEL + r"(?:AllGather|Broadcast)"),
    "pp_send": (_BACKEND + r"send(?![A-Za-z])", r"^c10d::send(?![A-Za-z])"),
    "pp_recv": (_BACKEND + r"recv(?![A-Za-z])", r"^c10d::recv(?![A-Za-z])"),
    "optimizer": (r"^Optimizer\.step#",),
    "dataloader": (r"^enumerate\(DataLoader\)#",),
}

#: A communication kernel (HTA's rule: the name says NCCL; RCCL keeps NCCL's names).
COMM_KERNEL = re.compile(r"nccl|rccl|hccl", re.IGNORECASE)
#: A memory kernel by name (AMD traces may record copies as kernels).
MEMORY_KERNEL = re.compile(r"^(?:hip)?Mem(?:cpy|set)")

_COMPUTE, _COMM, _MEMORY, _IDLE = (s.name for s in schema.TRACE_STAGES)


@dataclass(frozen=True)
class StagePatterns:
    """Stage -> compiled name patterns, in declaration order (first match wins)."""

    patterns: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...]

    @classmethod
    def build(cls, table: Mapping[str, Sequence[str] | str], stages: schema.StageSet | None = None) -> StagePatterns:
        """From ``{stage: [regex, ...]}``; stage names are checked against ``stages``."""
        out = []
        for stage, pats in table.items():
            if stages is not None and stage not in stages:
                raise TraceError(f"pattern for unknown stage {stage!r}; known: {', '.join(stages.names)}")
            pats = (pats,) if isinstance(pats, str) else tuple(pats)
            compiled = []
            for p in pats:
                try:
                    compiled.append(re.compile(p))
                except re.error as exc:
                    raise TraceError(f"stage {stage!r}: bad pattern {p!r}: {exc}") from None
            out.append((stage, tuple(compiled)))
        return cls(tuple(out))

    @classmethod
    def default(cls) -> StagePatterns:
        return cls.build(DEFAULT_PATTERNS, schema.DEFAULT_STAGES)

    def with_overrides(self, table: Mapping[str, Sequence[str]]) -> StagePatterns:
        """These patterns with the stages of ``table`` replaced (put first)."""
        new = StagePatterns.build(table)
        keep = tuple((s, p) for s, p in self.patterns if s not in dict(new.patterns))
        return StagePatterns(new.patterns + keep)

    def namer(self) -> Callable[[str], str | None]:
        """:meth:`stage_of`, cached per name (a trace repeats few names many times)."""
        cache: dict[str, str | None] = {}

        def named(name: str) -> str | None:
            st = cache.get(name, "")
            if st == "":
                st = cache[name] = self.stage_of(name)
            return st

        return named

    def stage_of(self, name: str) -> str | None:
        for stage, pats in self.patterns:
            for p in pats:
                if p.search(name):
                    return stage
        return None


def kernel_class(name: str, cat: str) -> str:
    """The model-agnostic stage of a device event: ``memcpy``, ``comm_other`` or ``compute_other``."""
    if cat in MEMORY_CATS or MEMORY_KERNEL.match(name):
        return _MEMORY
    if COMM_KERNEL.search(name):
        return _COMM
    return _COMPUTE


class _Intervals:
    """Merged intervals per (pid, tid) and stage, for 'which stage contains ts' queries."""

    def __init__(self) -> None:
        self._raw: dict[tuple[Any, Any], dict[str, list[tuple[float, float]]]] = {}
        self._merged: dict[tuple[Any, Any], list[tuple[str, list[float], list[float]]]] = {}

    def add(self, thread: tuple[Any, Any], stage: str, a: float, b: float) -> None:
        self._raw.setdefault(thread, {}).setdefault(stage, []).append((a, b))

    def freeze(self) -> None:
        for thread, by_stage in self._raw.items():
            lst = []
            for stage, iv in by_stage.items():
                starts: list[float] = []
                ends: list[float] = []
                for a, b in sorted(iv):
                    if ends and a <= ends[-1]:
                        ends[-1] = max(ends[-1], b)
                    else:
                        starts.append(a)
                        ends.append(b)
                lst.append((stage, starts, ends))
            self._merged[thread] = lst

    def stage_at(self, thread: tuple[Any, Any], ts: float,
                 exclude: frozenset[str] | set[str] = frozenset()) -> str | None:
        """The stage whose interval on ``thread`` contains ``ts``; of nested ones the innermost
        (an all-gather inside an optimizer step is the all-gather); ``exclude``: stages not
        to consider."""
        best, best_len = None, float("inf")
        for stage, starts, ends in self._merged.get(thread, ()):
            if stage in exclude:
                continue
            i = bisect.bisect_right(starts, ts) - 1
            if i >= 0 and ts <= ends[i] and ends[i] - starts[i] < best_len:
                best, best_len = stage, ends[i] - starts[i]
        return best


def host_stages(trace: ParsedTrace, named: Callable[[str], str | None], link_backward: bool = True
                ) -> tuple[_Intervals, list[tuple[str, float, float]]]:
    """The named host intervals ``(stage, start, end)`` of a trace, and them per thread.

    Events count for the stage their name matches; with ``link_backward`` so does the
    backward operator each forward/backward flow reaches from a forward point inside a
    named event (the longest ``cpu_op`` starting within 0.5 us of the flow's end).
    """
    host = _Intervals()
    host_iv: list[tuple[str, float, float]] = []
    cpu_ops: dict[tuple[Any, Any], list[tuple[float, float]]] = {}
    for name, pid, tid, ts, end, cat in trace.spans:
        if cat == "cpu_op":
            cpu_ops.setdefault((pid, tid), []).append((ts, end))
        st = named(name)
        if st is not None:
            host.add((pid, tid), st, ts, end)
            host_iv.append((st, ts, end))
    host.freeze()
    for ops in cpu_ops.values():
        ops.sort()
    for fid, pid, tid, ts in trace.flows_f if link_backward else ():
        src = trace.flows_s.get(fid)
        if src is None:
            continue
        st = host.stage_at((src[0], src[1]), src[2])
        if st is None:
            continue
        best = _longest_op_at(cpu_ops.get((pid, tid), []), ts)
        if best is not None:
            host_iv.append((st, best[0], best[1]))
            host.add((pid, tid), st, best[0], best[1])
    host.freeze()
    return host, host_iv


def _longest_op_at(ops: list[tuple[float, float]], ts: float) -> tuple[float, float] | None:
    """Of the sorted operators starting within 0.5 us of ``ts``, the one ending last."""
    i = bisect.bisect_left(ops, (ts - 0.5, float("-inf")))
    best = None
    while i < len(ops) and ops[i][0] <= ts + 0.5:
        if best is None or ops[i][1] > best[1]:
            best = ops[i]
        i += 1
    return best


@dataclass
class DeviceStages:
    """The stage (None: uncounted) and launch time of every device event, and the trace's GPU."""

    stage: list[str | None]
    launch: list[float]
    gpu: int | None


def device_stages(trace: ParsedTrace, named: Callable[[str], str | None], host: _Intervals,
                  kernel_classes: bool = True) -> DeviceStages:
    """Each device event's stage: its own name, else its collective, else the launching host
    code (never a compute or host stage for a communication kernel), else its class
    (``kernel_classes``). The GPU is the device most events ran on."""
    not_comm = frozenset(s.name for s in schema.KNOWN_STAGES if s.kind != "comm")
    out = DeviceStages([], [], None)
    devices: Counter[Any] = Counter()
    classes: dict[tuple[str, str], str] = {}
    for name, cat, corr, ts, _end, device, coll in trace.device_events:
        launch = trace.launches.get(corr)
        cls = classes.get((name, cat))
        if cls is None:
            cls = classes[(name, cat)] = kernel_class(name, cat)
        st = named(name)
        if st is None and coll:
            st = named(f"nccl:{coll}")
        if st is None and launch is not None:
            st = host.stage_at((launch[0], launch[1]), launch[2], not_comm if cls == _COMM else frozenset())
        if st is None and kernel_classes:
            st = cls
        out.stage.append(st)
        out.launch.append(launch[2] if launch is not None else ts)
        if device is not None:
            devices[device] += 1
    out.gpu = as_int(devices.most_common(1)[0][0]) if devices else None
    return out


def as_int(v: Any) -> int | None:
    """``int(v)``, None where that fails."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
