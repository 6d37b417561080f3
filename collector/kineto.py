"""Import PyTorch profiler (Kineto) traces as ``stage_latency`` points.

A trace written by ``torch.profiler`` (``export_chrome_trace`` or
``tensorboard_trace_handler``; ``.json`` or ``.json.gz``) holds, per rank,
``ProfilerStep#N`` annotations (the iterations: record with a profiler
``schedule`` and call ``prof.step()`` every iteration), operator events
(``cpu_op``: ``aten::addmm``, autograd backward functions), annotations
(``user_annotation``: ``gloo:all_reduce``, ``Optimizer.step#SGD.step``;
``record_function`` regions), module events (``python_function``:
``nn.Module: MoEMLP_0`` with ``with_stack=True``) and on GPU the kernels.

Each stage has name patterns (regular expressions, searched in event names;
:data:`DEFAULT_PATTERNS`, or a ``[trace.patterns]`` config table). A stage's
time in iteration ``N`` is the union of the intervals of

- events whose name matches one of its patterns;
- backward operators linked (the trace's ``fwdbwd`` flows) to a forward
  operator that ran inside such an event, so a module's backward counts too;
- on GPU, kernels launched (``args.correlation``) from inside such an event,
  or whose own name matches. A stage that has kernels anywhere in the trace is
  measured by its kernels only (device time, not host launch time).

CPU intervals belong to the step whose window contains their start (clipped
to it); kernels to the step that launched them.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from collector.stage_timer import union_length
from rankscope import schema
from rankscope.topology import Topology

#: Default stage -> name patterns (regular expressions, ``re.search``).
DEFAULT_PATTERNS: dict[str, tuple[str, ...]] = {
    "attention": (r"^nn\.Module: .*[Aa]ttention", r"flash_attn|scaled_dot_product|[Ff]lash[Aa]ttn"),
    "mlp": (r"^nn\.Module: .*(MLP|Mlp|mlp|[Ee]xpert|FeedForward|FFN)",),
    "dispatch": (r"^rankscope:dispatch$",),
    "combine": (r"^rankscope:combine$",),
    "reduce_scatter": (r"^(gloo|nccl):(reduce_scatter|all_reduce)", r"ncclDevKernel_(ReduceScatter|AllReduce)",
                       r"ncclKernel_(ReduceScatter|AllReduce)"),
    "all_gather": (r"^(gloo|nccl):all_gather", r"ncclDevKernel_AllGather", r"ncclKernel_AllGather"),
    "pp_send": (r"^(gloo|nccl):send",),
    "pp_recv": (r"^(gloo|nccl):recv",),
    "optimizer": (r"^Optimizer\.step#",),
    "dataloader": (r"^enumerate\(DataLoader\)#",),
}

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime"})
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


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


@dataclass
class TraceSummary:
    """Per-iteration stage times (ms) of one rank's trace."""

    path: str
    rank: int
    world: int | None
    base_ms: float
    iterations: list[int] = field(default_factory=list)
    end_ms: list[float] = field(default_factory=list)
    iteration_ms: list[float] = field(default_factory=list)
    stage_ms: list[dict[str, float]] = field(default_factory=list)

    def frame(self, topology: Topology, job: str, iteration_offset: int = 0) -> pd.DataFrame:
        """The ``stage_latency`` rows of this rank (one per ``ProfilerStep``)."""
        c = topology.coords_of(self.rank)
        rows = []
        last = 0
        for it, end, it_ms, st in zip(self.iterations, self.end_ms, self.iteration_ms, self.stage_ms,
                                      strict=True):
            t = max(int(round(end)), last + 1)
            last = t
            rows.append({"time": t, "job": job, "rank": self.rank, "pp": c["pp"], "dp": c["dp"],
                         "tp": c["tp"], "ep_group": c["ep_group"], "node": c["node"],
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

    def stage_at(self, thread: tuple[Any, Any], ts: float) -> str | None:
        for stage, starts, ends in self._merged.get(thread, ()):
            i = bisect.bisect_right(starts, ts) - 1
            if i >= 0 and ts <= ends[i]:
                return stage
        return None


def summarise_trace(data: Mapping[str, Any], patterns: StagePatterns, path: str | Path = "<trace>",
                    rank: int | None = None, link_backward: bool = True) -> TraceSummary:
    """Per-iteration stage times of one trace (see the module docstring for the rules).

    ``link_backward=False`` leaves out the backward operators reached through the
    forward/backward flows (only events matched by name, and their kernels).
    """
    r, world = trace_rank(data, path, rank)
    events = data["traceEvents"]
    steps: list[tuple[float, float, int]] = []
    spans: list[tuple[str, Any, Any, float, float, str]] = []  # name, pid, tid, ts, end, cat
    flows_s: dict[Any, tuple[Any, Any, float]] = {}
    flows_f: list[tuple[Any, Any, Any, float]] = []
    launches: dict[Any, tuple[Any, Any, float]] = {}
    device_events: list[tuple[str, Any, float, float]] = []  # name, correlation, ts, end
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            name = e.get("name", "")
            ts = float(e.get("ts", 0.0))
            end = ts + float(e.get("dur", 0.0))
            m = _STEP.match(name)
            if m:
                steps.append((ts, end, int(m.group(1))))
                continue
            cat = e.get("cat", "")
            if cat in DEVICE_CATS:
                device_events.append((name, (e.get("args") or {}).get("correlation"), ts, end))
                continue
            spans.append((name, e.get("pid"), e.get("tid"), ts, end, cat))
            if cat in LAUNCH_CATS and "correlation" in (e.get("args") or {}):
                launches[e["args"]["correlation"]] = (e.get("pid"), e.get("tid"), ts)
        elif ph in ("s", "f") and e.get("cat") == "fwdbwd":
            if ph == "s":
                flows_s[e.get("id")] = (e.get("pid"), e.get("tid"), float(e["ts"]))
            else:
                flows_f.append((e.get("id"), e.get("pid"), e.get("tid"), float(e["ts"])))
    if not steps:
        raise TraceError(f"{path}: no ProfilerStep#N events; record the trace with a torch.profiler "
                         f"schedule and call prof.step() once per iteration")
    steps.sort()
    step_starts = [s[0] for s in steps]

    def step_of(ts: float) -> int | None:
        i = bisect.bisect_right(step_starts, ts) - 1
        return i if i >= 0 and ts <= steps[i][1] else None

    cache: dict[str, str | None] = {}
    host = _Intervals()
    host_iv: list[tuple[str, float, float]] = []
    device_iv: list[tuple[str, float, float, float]] = []  # stage, start, end, launch ts
    cpu_ops: dict[tuple[Any, Any], list[tuple[float, float]]] = {}
    for name, pid, tid, ts, end, cat in spans:
        if cat == "cpu_op":
            cpu_ops.setdefault((pid, tid), []).append((ts, end))
        st = cache[name] if name in cache else cache.setdefault(name, patterns.stage_of(name))
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
    # kernels: by their own name, else by the stage of the host code that launched them
    for name, corr, ts, end in device_events:
        launch = launches.get(corr)
        st = cache[name] if name in cache else cache.setdefault(name, patterns.stage_of(name))
        if st is None and launch is not None:
            st = host.stage_at((launch[0], launch[1]), launch[2])
        if st is not None:
            device_iv.append((st, ts, end, launch[2] if launch is not None else ts))
    on_device = {s for s, *_ in device_iv}
    per_step: list[dict[str, list[tuple[float, float]]]] = [{} for _ in steps]
    for st, a, b in host_iv:
        if st in on_device:
            continue
        i = step_of(a)
        if i is not None:
            per_step[i].setdefault(st, []).append((a, min(b, steps[i][1])))
    for st, a, b, launch_ts in device_iv:
        i = step_of(launch_ts)
        if i is not None:
            per_step[i].setdefault(st, []).append((a, b))
    base_us = float(data.get("baseTimeNanoseconds", 0)) / 1000.0
    out = TraceSummary(str(path), r, world, base_us / 1000.0)
    for (ts, end, n), ivs in zip(steps, per_step, strict=True):
        out.iterations.append(n)
        out.end_ms.append((base_us + end) / 1000.0)
        out.iteration_ms.append((end - ts) / 1000.0)
        out.stage_ms.append({st: union_length(iv) / 1000.0 for st, iv in ivs.items()})
    return out


@dataclass
class ImportReport:
    """What an import wrote."""

    files: int
    ranks: list[int]
    iterations: int
    points: int
    stages: list[str]


def import_traces(paths: Iterable[str | Path], store: Any, job: str, topology: Topology | None = None,
                  patterns: StagePatterns | None = None, iteration_offset: int = 0,
                  rank: int | None = None, progress: Any = None) -> ImportReport:
    """Summarise every trace and write its ``stage_latency`` points to ``store``.

    ``topology`` defaults to a pure data-parallel job of the traces' world size.
    """
    patterns = patterns or StagePatterns.default()
    paths = [Path(p) for p in paths]
    if not paths:
        raise TraceError("no trace files given")
    summaries = []
    for i, p in enumerate(paths):
        s = summarise_trace(load_trace(p), patterns, p, rank)
        summaries.append(s)
        if progress is not None:
            progress(f"[{i + 1}/{len(paths)}] {p}: rank {s.rank}, {len(s.iterations)} iteration(s)")
    seen: dict[int, str] = {}
    for s in summaries:
        if s.rank in seen:
            raise TraceError(f"{s.path} and {seen[s.rank]} are both rank {s.rank}")
        seen[s.rank] = s.path
    if topology is None:
        world = max([s.world or 0 for s in summaries] + [max(seen) + 1])
        topology = Topology(dp=world, gpus_per_node=min(8, world) if world % min(8, world) == 0 else 1)
    frames = [s.frame(topology, job, iteration_offset) for s in summaries]
    frames = [f for f in frames if len(f)]
    if not frames:
        raise TraceError("the traces hold no complete ProfilerStep")
    df = pd.concat(frames, ignore_index=True)
    store.write_stage_latency(df)
    stages = schema.stage_fields(df.columns)
    return ImportReport(len(paths), sorted(seen), int(df[schema.ITERATION_FIELD].nunique()), len(df), stages)
