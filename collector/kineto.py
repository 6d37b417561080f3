"""Import PyTorch profiler (Kineto) traces as ``stage_latency`` points.

A trace written by ``torch.profiler`` (``export_chrome_trace`` or
``tensorboard_trace_handler``; ``.json`` or ``.json.gz``) holds, per rank,
``ProfilerStep#N`` annotations (the iterations: record with a profiler
``schedule`` and call ``prof.step()`` every iteration), operator events
(``cpu_op``: ``aten::addmm``, ``c10d::allreduce_``, autograd backward functions),
annotations (``user_annotation``: ``nccl:all_reduce``, ``Optimizer.step#SGD.step``;
``record_function`` regions), module events (``python_function``:
``nn.Module: MoEMLP_0`` with ``with_stack=True``) and on GPU the device events
(``kernel``, ``gpu_memcpy``, ``gpu_memset``; ``args.device`` is the GPU).

Named stages have name patterns (regular expressions, searched in event names;
:data:`DEFAULT_PATTERNS`, or a ``[trace.patterns]`` config table). A stage's
time in iteration ``N`` is the union of the intervals of

- events whose name matches one of its patterns;
- backward operators linked (the trace's ``fwdbwd`` flows) to a forward
  operator that ran inside such an event, so a module's backward counts too;
- on GPU, device events whose own name matches, else whose collective (the
  ``Collective name`` PyTorch records on NCCL kernels, matched as
  ``nccl:<collective>``) matches, else that were launched (``args.correlation``)
  from inside such an event. A communication kernel never counts for a compute
  or host stage (a tensor-parallel all-reduce launched inside an MLP module is
  communication). A stage that has device events anywhere in the trace is
  measured by them only (device time, not host launch time).

Every device event no named stage claims goes to a model-agnostic stage of
:data:`rankscope.schema.TRACE_STAGES`, classed as HolisticTraceAnalysis' temporal
breakdown classes kernels: ``comm_other`` (the name says NCCL), ``memcpy``
(copies and memsets) or ``compute_other`` (the rest); and ``host_idle`` is the
part of the iteration's window in which the rank's GPU runs nothing. So every GPU
trace yields compute and communication stages whatever its module names.

EP all-to-all: an unmarked trace cannot tell a dispatch from a combine (the
backward reverses their directions; token-count exchanges add more), so every
all-to-all (``nccl:all_to_all``, ``c10d::alltoall_base_``, and the NCCL
``SendRecv`` kernels they launch) counts for ``dispatch``; ``combine`` takes only
``record_function("rankscope:combine")`` regions or a user pattern. Both are
EP-group comm stages, so the analyzer reads them the same way. A ``SendRecv``
kernel is a pipeline ``pp_send``/``pp_recv`` only where its collective or its
launching annotation says send or recv.

Device events belong to the iteration that launched them, host intervals to the
one whose window contains their start (clipped to it); ``host_idle`` looks at
the window itself.

Where the rank ran: ``host`` from the trace's ``hostname``/``host`` metadata
entry or its ``host_name`` (recent Kineto records it), else the
``<host>_<pid>.<time>.pt.trace.json`` name ``tensorboard_trace_handler`` gives;
``gpu`` from the device events' ``device``. A ``hostname`` added with
``prof.add_metadata`` wins over Kineto's ``host_name``, a host map
(:func:`read_host_map`) over both.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.topology import Topology, TopologyError, parse_ranks

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

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
MEMORY_CATS = frozenset({"gpu_memcpy", "gpu_memset"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime"})
#: Copies of host annotations drawn on the GPU timeline: not host work, not iterations.
GPU_ANNOTATION_CAT = "gpu_user_annotation"
#: A communication kernel (HTA's rule: the name says NCCL; RCCL keeps NCCL's names).
COMM_KERNEL = re.compile(r"nccl|rccl|hccl", re.IGNORECASE)
#: A memory kernel by name (AMD traces may record copies as kernels).
MEMORY_KERNEL = re.compile(r"^(?:hip)?Mem(?:cpy|set)")
#: Trace-level keys that may carry the host name: what the user added with
#: ``prof.add_metadata("hostname", ...)`` first, Kineto's own ``host_name`` last (in a
#: container that is the container's name, not the machine's).
HOST_KEYS = ("hostname", "host", "host_name")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
#: ``tensorboard_trace_handler``'s default file name: ``<host>_<pid>.<time>.pt.trace.json[.gz]``.
_HANDLER_NAME = re.compile(r"^(?P<worker>(?P<host>.+)_\d+)\.\d+\.pt\.trace\.json(?:\.gz)?$")

_COMPUTE, _COMM, _MEMORY, _IDLE = (s.name for s in schema.TRACE_STAGES)


class TraceError(ValueError):
    """A trace file that cannot be read or mapped to iterations and ranks."""


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


@dataclass
class TraceSummary:
    """Per-iteration stage times (ms) of one rank's trace, and where the rank ran."""

    path: str
    rank: int
    world: int | None
    base_ms: float
    host: str | None = None
    gpu: int | None = None
    iterations: list[int] = field(default_factory=list)
    end_ms: list[float] = field(default_factory=list)
    iteration_ms: list[float] = field(default_factory=list)
    stage_ms: list[dict[str, float]] = field(default_factory=list)

    @property
    def stages(self) -> list[str]:
        """Every stage this trace has a time for, in first-seen order."""
        return list(dict.fromkeys(s for st in self.stage_ms for s in st))

    def frame(self, topology: Topology, job: str, iteration_offset: int = 0) -> pd.DataFrame:
        """The ``stage_latency`` rows of this rank (one per ``ProfilerStep``), with its
        ``host`` and ``gpu`` tags where known."""
        c = topology.coords_of(self.rank)
        where = {**({"host": self.host} if self.host else {}),
                 **({"gpu": self.gpu} if self.gpu is not None else {})}
        rows = []
        last = 0
        for it, end, it_ms, st in zip(self.iterations, self.end_ms, self.iteration_ms, self.stage_ms,
                                      strict=True):
            t = max(int(round(end)), last + 1)
            last = t
            rows.append({"time": t, "job": job, "rank": self.rank, "pp": c["pp"], "dp": c["dp"],
                         "tp": c["tp"], "ep_group": c["ep_group"], "node": c["node"], **where,
                         schema.ITERATION_FIELD: it + iteration_offset,
                         schema.ITERATION_MS_FIELD: it_ms, **st})
        df = pd.DataFrame(rows)
        if len(df):
            df["time"] = df["time"].astype("int64")
        return df


def load_trace(path: str | Path) -> dict[str, Any]:
    """The JSON object of a Kineto trace file (``.json`` or ``.json.gz``)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc}") from None
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise TraceError(f"{p} is not a JSON trace: {exc}") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{p} has no traceEvents list: not a Chrome/Kineto trace")
    return data


def trace_rank(data: Mapping[str, Any], path: str | Path, rank: int | None = None) -> tuple[int, int | None]:
    """``(rank, world)``: from ``distributedInfo``, else ``rank``, else ``rankN`` in the file name."""
    info = data.get("distributedInfo") or {}
    world = info.get("world_size")
    if "rank" in info:
        return int(info["rank"]), None if world is None else int(world)
    if rank is not None:
        return rank, world
    m = _RANK_IN_NAME.search(Path(path).name)
    if m:
        return int(m.group(1)), world
    raise TraceError(f"{path}: no rank in the trace (distributedInfo) or the file name (rankN); pass --rank")


def trace_host(data: Mapping[str, Any], path: str | Path) -> str | None:
    """The host the trace was recorded on: the trace's ``hostname`` / ``host`` entry (added with
    ``prof.add_metadata``) or Kineto's ``host_name``, else the ``<host>_<pid>.<time>.pt.trace.json``
    file name of ``tensorboard_trace_handler``'s default worker name; None when neither says."""
    for key in HOST_KEYS:
        v = data.get(key)
        if isinstance(v, str) and v.strip():
            return v.strip()
    m = _HANDLER_NAME.match(Path(path).name)
    # a worker name such as "rank_3" or "rank3_<pid>" names a rank, not a host
    if m and not any(_RANK_IN_NAME.fullmatch(m.group(g)) for g in ("worker", "host")):
        return m.group("host")
    return None


def read_host_map(path: str | Path) -> dict[int, str]:
    """Rank -> host from a small file: JSON (``.json``) or TOML (anything else).

    Keys are ranks or rank ranges (``"0-7"``, ``"8,10-11"``), values host names;
    the mapping may stand at the top level or in a ``hosts`` table::

        [hosts]
        0-7 = "gpu-node-017"
        8-15 = "gpu-node-018"
    """
    p = Path(path)
    try:
        text = p.read_text()
        table = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:   # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise TraceError(f"cannot read host map {p}: {exc}") from None
    if isinstance(table, dict) and isinstance(table.get("hosts"), dict):
        table = table["hosts"]
    if not isinstance(table, dict) or not table:
        raise TraceError(f"host map {p}: expected a table of rank (or 'N-M') = host name")
    out: dict[int, str] = {}
    for spec, host in table.items():
        if not isinstance(host, str) or not host.strip():
            raise TraceError(f"host map {p}: ranks {spec!r} need a host name, got {host!r}")
        try:
            ranks = parse_ranks(spec)
        except ValueError as exc:
            raise TraceError(f"host map {p}: {exc}") from None
        for r in ranks.tolist():
            if out.get(r, host.strip()) != host.strip():
                raise TraceError(f"host map {p}: rank {r} is mapped to {out[r]!r} and {host.strip()!r}")
            out[r] = host.strip()
    return out


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


def grouped_union_length(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int) -> np.ndarray:
    """Length covered by the union of each group's intervals (``[n_groups]``, vectorised).

    Overlapping intervals of one group count once; intervals of different groups never
    merge. Sorted by (group, start), each interval adds what lies beyond the furthest
    end before it; the groups are laid end to end on one axis so a single running
    maximum serves them all.
    """
    if group.size == 0:
        return np.zeros(n_groups)
    start = np.asarray(start, dtype=float)
    end = np.maximum(np.asarray(end, dtype=float), start)
    order = np.lexsort((start, group))
    g, a, b = group[order], start[order], end[order]
    lo = a.min()
    span = b.max() - lo + 1.0
    a = a - lo + g * span
    b = b - lo + g * span
    reach = np.maximum.accumulate(b)
    before = np.concatenate(([-np.inf], reach[:-1]))
    covered = np.maximum(b - np.maximum(a, before), 0.0)
    return np.bincount(g, weights=covered, minlength=n_groups)


def _step_index(step_start: np.ndarray, step_end: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Index of the step whose window contains each ``ts`` (-1 for none)."""
    i = np.searchsorted(step_start, ts, side="right") - 1
    ok = (i >= 0) & (ts <= step_end[np.maximum(i, 0)])
    return np.where(ok, i, -1)


def _busy_in_windows(step_start: np.ndarray, step_end: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per step, how much of its window the intervals ``[a, b)`` cover (vectorised; an
    interval that spans several windows counts in each)."""
    n = len(step_start)
    if a.size == 0:
        return np.zeros(n)
    first = np.searchsorted(step_end, a, side="right")      # first window ending after a
    last = np.searchsorted(step_start, b, side="left") - 1  # last window starting before b
    count = np.maximum(last - first + 1, 0)
    rep = np.repeat(np.arange(a.size), count)
    k = np.repeat(first, count) + (np.arange(rep.size) - np.repeat(np.cumsum(count) - count, count))
    lo = np.maximum(a[rep], step_start[k])
    hi = np.minimum(b[rep], step_end[k])
    return grouped_union_length(k, lo, hi, n)


def _per_step(s_start: np.ndarray, s_end: np.ndarray,
              device: tuple[list[str], np.ndarray, np.ndarray, np.ndarray],
              host: tuple[list[str], np.ndarray, np.ndarray]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Stage names, union time ``[stage, step]`` and whether the stage ran ``[stage, step]``.

    ``device``: (stage, start, end, launch) of device events, counted in the step that
    launched them, unclipped; ``host``: (stage, start, end) of host intervals, counted in
    the step containing their start, clipped to its end.
    """
    names = list(dict.fromkeys([*device[0], *host[0]]))
    index = {n: i for i, n in enumerate(names)}
    n_steps, n_stage = len(s_start), len(names)
    groups, starts, ends = [], [], []
    for stages, a, b, at, clip in ((*device, False), (*host[:3], host[1], True)):
        if not stages:
            continue
        st = np.array([index[x] for x in stages], dtype=np.int64)
        k = _step_index(s_start, s_end, at)
        ok = k >= 0
        groups.append(st[ok] * n_steps + k[ok])
        starts.append(a[ok])
        ends.append(np.minimum(b[ok], s_end[k[ok]]) if clip else b[ok])
    if not groups:
        return names, np.zeros((n_stage, n_steps)), np.zeros((n_stage, n_steps), dtype=bool)
    g = np.concatenate(groups)
    total = grouped_union_length(g, np.concatenate(starts), np.concatenate(ends), n_stage * n_steps)
    present = np.bincount(g, minlength=n_stage * n_steps) > 0
    return names, total.reshape(n_stage, n_steps), present.reshape(n_stage, n_steps)


def summarise_trace(data: Mapping[str, Any], patterns: StagePatterns, path: str | Path = "<trace>",
                    rank: int | None = None, link_backward: bool = True,
                    kernel_classes: bool = True) -> TraceSummary:
    """Per-iteration stage times of one trace (see the module docstring for the rules).

    ``link_backward=False`` leaves out the backward operators reached through the
    forward/backward flows (only events matched by name, and their kernels).
    ``kernel_classes=False`` leaves out the model-agnostic stages (device events no
    named stage claims are then not counted, and there is no ``host_idle``).
    """
    r, world = trace_rank(data, path, rank)
    events = data["traceEvents"]
    steps: list[tuple[float, float, int]] = []
    spans: list[tuple[str, Any, Any, float, float, str]] = []  # name, pid, tid, ts, end, cat
    flows_s: dict[Any, tuple[Any, Any, float]] = {}
    flows_f: list[tuple[Any, Any, Any, float]] = []
    launches: dict[Any, tuple[Any, Any, float]] = {}
    # name, cat, correlation, ts, end, device, collective
    device_events: list[tuple[str, str, Any, float, float, Any, str | None]] = []
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            cat = e.get("cat", "")
            if cat == GPU_ANNOTATION_CAT:
                continue
            name = e.get("name", "")
            ts = float(e.get("ts", 0.0))
            end = ts + float(e.get("dur", 0.0))
            m = _STEP.match(name)
            if m:
                steps.append((ts, end, int(m.group(1))))
                continue
            args = e.get("args") or {}
            if cat in DEVICE_CATS:
                device_events.append((name, cat, args.get("correlation"), ts, end, args.get("device"),
                                      args.get("Collective name")))
                continue
            spans.append((name, e.get("pid"), e.get("tid"), ts, end, cat))
            if cat in LAUNCH_CATS and "correlation" in args:
                launches[args["correlation"]] = (e.get("pid"), e.get("tid"), ts)
        elif ph in ("s", "f") and e.get("cat") == "fwdbwd":
            if ph == "s":
                flows_s[e.get("id")] = (e.get("pid"), e.get("tid"), float(e["ts"]))
            else:
                flows_f.append((e.get("id"), e.get("pid"), e.get("tid"), float(e["ts"])))
    if not steps:
        raise TraceError(f"{path}: no ProfilerStep#N events; record the trace with a torch.profiler "
                         f"schedule and call prof.step() once per iteration")
    steps.sort()

    cache: dict[str, str | None] = {}

    def named(name: str) -> str | None:
        st = cache.get(name, "")
        if st == "":
            st = cache[name] = patterns.stage_of(name)
        return st

    host = _Intervals()
    host_iv: list[tuple[str, float, float]] = []
    cpu_ops: dict[tuple[Any, Any], list[tuple[float, float]]] = {}
    for name, pid, tid, ts, end, cat in spans:
        if cat == "cpu_op":
            cpu_ops.setdefault((pid, tid), []).append((ts, end))
        st = named(name)
        if st is not None:
            host.add((pid, tid), st, ts, end)
            host_iv.append((st, ts, end))
    host.freeze()
    # backward operators of forward operators that ran inside a stage
    for ops in cpu_ops.values():
        ops.sort()
    for fid, pid, tid, ts in flows_f if link_backward else ():
        src = flows_s.get(fid)
        if src is None:
            continue
        st = host.stage_at((src[0], src[1]), src[2])
        if st is None:
            continue
        ops = cpu_ops.get((pid, tid), [])
        i = bisect.bisect_left(ops, (ts - 0.5, float("-inf")))
        best = None
        while i < len(ops) and ops[i][0] <= ts + 0.5:
            if best is None or ops[i][1] > best[1]:
                best = ops[i]
            i += 1
        if best is not None:
            host_iv.append((st, best[0], best[1]))
            host.add((pid, tid), st, best[0], best[1])
    host.freeze()

    # device events: own name, else collective, else the launching host code, else their class
    not_comm = {s.name for s in schema.KNOWN_STAGES if s.kind != "comm"}
    dev_stage: list[str | None] = []
    dev_launch: list[float] = []
    devices: Counter[Any] = Counter()
    classes: dict[tuple[str, str], str] = {}
    for name, cat, corr, ts, _end, device, coll in device_events:
        launch = launches.get(corr)
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
        dev_stage.append(st)
        dev_launch.append(launch[2] if launch is not None else ts)
        if device is not None:
            devices[device] += 1
    gpu = _as_int(devices.most_common(1)[0][0]) if devices else None

    on_device = {st for st in dev_stage if st is not None}
    keep = [i for i, st in enumerate(dev_stage) if st is not None]
    host_kept = [(st, a, b) for st, a, b in host_iv if st not in on_device]
    s_start = np.array([s[0] for s in steps])
    s_end = np.array([s[1] for s in steps])
    names, total, present = _per_step(
        s_start, s_end,
        device=([dev_stage[i] for i in keep], np.array([device_events[i][3] for i in keep]),
                np.array([device_events[i][4] for i in keep]), np.array([dev_launch[i] for i in keep])),
        host=([x[0] for x in host_kept], np.array([x[1] for x in host_kept]),
              np.array([x[2] for x in host_kept])))
    n_stage = len(names)
    idle = None
    if kernel_classes and device_events:
        on_gpu = [i for i, e in enumerate(device_events) if gpu is None or _as_int(e[5]) in (gpu, None)]
        a = np.array([device_events[i][3] for i in on_gpu])
        b = np.array([device_events[i][4] for i in on_gpu])
        idle = (s_end - s_start) - _busy_in_windows(s_start, s_end, a, b)

    base_us = float(data.get("baseTimeNanoseconds", 0)) / 1000.0
    out = TraceSummary(str(path), r, world, base_us / 1000.0, host=trace_host(data, path), gpu=gpu)
    for k, (ts, end, n) in enumerate(steps):
        out.iterations.append(n)
        out.end_ms.append((base_us + end) / 1000.0)
        out.iteration_ms.append((end - ts) / 1000.0)
        st_ms = {names[s]: float(total[s, k]) / 1000.0 for s in range(n_stage) if present[s, k]}
        if idle is not None:
            st_ms[_IDLE] = max(float(idle[k]), 0.0) / 1000.0
        out.stage_ms.append(st_ms)
    return out


def _as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


@dataclass
class ImportReport:
    """What an import wrote."""

    files: int
    ranks: list[int]
    iterations: int
    points: int
    stages: list[str]
    hosts: list[str] = field(default_factory=list)


def host_placement(topology: Topology, hosts: Mapping[int, str]) -> Topology | None:
    """``topology`` with its ranks placed on the nodes their hosts say (node ids in order of
    each host's lowest rank, as the analyzer numbers them); None when the hosts do not
    cover every rank or hold other than ``gpus_per_node`` ranks each."""
    if len(hosts) != topology.world or set(hosts) != set(range(topology.world)):
        return None
    ranks = np.arange(topology.world)
    names = np.array([hosts[int(r)] for r in ranks], dtype=object)
    uniq, first, inverse = np.unique(names.astype(str), return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    node_of_host = np.empty(len(uniq), dtype=np.int64)
    node_of_host[order] = np.arange(len(uniq))
    try:
        return topology.with_placement(node_of_host[inverse], tuple(uniq[order].tolist()))
    except TopologyError:
        return None


def import_traces(paths: Iterable[str | Path], store: Any, job: str, topology: Topology | None = None,
                  patterns: StagePatterns | None = None, iteration_offset: int = 0,
                  rank: int | None = None, progress: Callable[[str], Any] | None = None,
                  hosts: Mapping[int, str] | None = None) -> ImportReport:
    """Summarise every trace and write its ``stage_latency`` points to ``store``.

    ``topology`` defaults to a pure data-parallel job of the traces' world size, with
    as many ranks per node as each host holds when every rank's host is known.
    ``hosts`` (rank -> host name, e.g. from :func:`read_host_map`) wins over the
    host a trace records. Where the hosts fit the topology, the ``node`` tags follow
    them; else they are the topology's block placement.
    """
    patterns = patterns or StagePatterns.default()
    paths = [Path(p) for p in paths]
    if not paths:
        raise TraceError("no trace files given")
    summaries = []
    for i, p in enumerate(paths):
        s = summarise_trace(load_trace(p), patterns, p, rank)
        if hosts and s.rank in hosts:
            s.host = hosts[s.rank]
        summaries.append(s)
        if progress is not None:
            where = ", ".join(x for x in (f"host {s.host}" if s.host else "",
                                          f"gpu {s.gpu}" if s.gpu is not None else "") if x)
            progress(f"[{i + 1}/{len(paths)}] {p}: rank {s.rank}{', ' + where if where else ''}, "
                     f"{len(s.iterations)} iteration(s)")
    seen: dict[int, str] = {}
    for s in summaries:
        if s.rank in seen:
            raise TraceError(f"{s.path} and {seen[s.rank]} are both rank {s.rank}")
        seen[s.rank] = s.path
    host_of = {s.rank: s.host for s in summaries if s.host}
    if topology is None:
        world = max([s.world or 0 for s in summaries] + [max(seen) + 1])
        per_host = Counter(host_of.values())
        if len(host_of) == world and len(set(per_host.values())) == 1:
            gpus = world // len(per_host)
        else:
            gpus = min(8, world) if world % min(8, world) == 0 else 1
        topology = Topology(dp=world, gpus_per_node=gpus)
    placed = host_placement(topology, host_of) if host_of else None
    if placed is not None:
        topology = placed
    elif host_of and len(host_of) == topology.world and progress is not None:
        progress(f"the traces' hosts do not hold {topology.gpus_per_node} rank(s) each; node tags follow "
                 f"the topology's block placement, host tags what the traces say")
    frames = [s.frame(topology, job, iteration_offset) for s in summaries]
    frames = [f for f in frames if len(f)]
    if not frames:
        raise TraceError("the traces hold no complete ProfilerStep")
    df = pd.concat(frames, ignore_index=True)
    if "host" in df.columns:
        df["host"] = df["host"].fillna("")
    if "gpu" in df.columns:
        gpu = df["gpu"]
        df["gpu"] = gpu.astype("int64") if gpu.notna().all() else \
            gpu.map(lambda v: "" if pd.isna(v) else str(int(v))).astype(object)
    store.write_stage_latency(df)
    stages = schema.stage_fields(df.columns)
    return ImportReport(len(paths), sorted(seen), int(df[schema.ITERATION_FIELD].nunique()), len(df), stages,
                        sorted(set(host_of.values())))
