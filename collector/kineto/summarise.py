"""Summarise a trace: per iteration, the union time of every stage's intervals.

Device events count in the iteration that launched them, unclipped; host intervals in
the one whose window contains their start, clipped to its end; ``host_idle`` is the
part of each iteration's window in which the rank's GPU runs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import collector.kineto.event_fields as ef
from collector.kineto.parse import ParsedTrace, TraceError, parse_events, trace_host, trace_rank
from collector.kineto.rows import TraceSummary
from collector.kineto.stages import (
    _IDLE,
    DeviceStages,
    StagePatterns,
    as_int,
    device_stages,
    host_stages,
)


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
    """Per-iteration stage times of one trace (see :mod:`collector.kineto` for the rules).

    ``link_backward=False`` leaves out the backward operators reached through the
    forward/backward flows (only events matched by name, and their kernels).
    ``kernel_classes=False`` leaves out the model-agnostic stages (device events no
    named stage claims are then not counted, and there is no ``host_idle``).
    """
    r, world = trace_rank(data, path, rank)
    trace = parse_events(data, path)
    named = patterns.namer()
    host, host_iv = host_stages(trace, named, link_backward)
    dev = device_stages(trace, named, host, kernel_classes)
    events = trace.device_events
    on_device = {st for st in dev.stage if st is not None}
    keep = [i for i, st in enumerate(dev.stage) if st is not None]
    host_kept = [(st, a, b) for st, a, b in host_iv if st not in on_device]
    s_start = np.array([s[0] for s in trace.steps])
    s_end = np.array([s[1] for s in trace.steps])
    names, total, present = _per_step(
        s_start, s_end,
        device=([dev.stage[i] for i in keep], np.array([events[i][3] for i in keep]),
                np.array([events[i][4] for i in keep]), np.array([dev.launch[i] for i in keep])),
        host=([x[0] for x in host_kept], np.array([x[1] for x in host_kept]),
              np.array([x[2] for x in host_kept])))
    idle = _idle(trace, dev, s_start, s_end) if kernel_classes and events else None
    base_us = _base_us(data, s_end, path)
    out = TraceSummary(str(path), r, world, base_us / 1000.0, host=trace_host(data, path), gpu=dev.gpu,
                       refused=trace.refused, first_refused=trace.first_refused)
    for k, (ts, end, n) in enumerate(trace.steps):
        out.iterations.append(n)
        out.end_ms.append((base_us + end) / 1000.0)
        out.iteration_ms.append((end - ts) / 1000.0)
        st_ms = {names[s]: float(total[s, k]) / 1000.0 for s in range(len(names)) if present[s, k]}
        if idle is not None:
            st_ms[_IDLE] = max(float(idle[k]), 0.0) / 1000.0
        out.stage_ms.append(st_ms)
    return out


def _base_us(data: Mapping[str, Any], s_end: np.ndarray, path: str | Path) -> float:
    """The trace's base time (us), once every iteration's end lies where a store can hold it."""
    try:
        base_us = ef.base_time_us(data)
    except ef.BadField as bad:
        raise TraceError(f"{path}: {bad}") from None
    ends_ms = (base_us + s_end) / 1000.0
    if len(ends_ms) and (ends_ms.min() < 0 or ends_ms.max() > ef.MAX_TS_US / 1000.0):
        raise TraceError(f"{path}: iterations end at {ends_ms.min():.0f}..{ends_ms.max():.0f} epoch ms, outside "
                         f"the times a store holds (1970 to 2262): check ts and baseTimeNanoseconds")
    return base_us


def _idle(trace: ParsedTrace, dev: DeviceStages, s_start: np.ndarray, s_end: np.ndarray) -> np.ndarray:
    """Per step, the part of its window in which the trace's GPU runs no device event."""
    events = trace.device_events
    on_gpu = [i for i, e in enumerate(events) if dev.gpu is None or as_int(e[5]) in (dev.gpu, None)]
    a = np.array([events[i][3] for i in on_gpu])
    b = np.array([events[i][4] for i in on_gpu])
    return (s_end - s_start) - _busy_in_windows(s_start, s_end, a, b)
