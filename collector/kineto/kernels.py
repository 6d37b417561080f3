"""Kernel windows from a trace file (``rankscope import-trace --kernels N``): the same points as the
live kernel channel (:mod:`collector.kernel_channel`), from traces already recorded.

A window is ``N`` consecutive ProfilerSteps. Its events are the trace's device events (kernels,
memory copies and sets) that start inside it or, in a trace with none (a CPU run), its
operators (``cpu_op``) and marked ranges (``user_annotation``): on a GPU the kernels, on CPU what
a gloo job runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from collector.kernel_channel import STEP_PREFIX, KernelChannel
from collector.kineto.parse import DEVICE_CATS, ParsedTrace
from rankscope import schema

#: A CPU trace's "kernels": its operators and the ranges code marks (``record_function``), as the
#: live channel sees them; not the profiler's own step marks.
HOST_CATS = ("cpu_op", "user_annotation")

#: One window: (its last step's number, its end in epoch ms, its events as (name, us, start us),
#: its steps, their starts in us).
Window = tuple[int, int, list[tuple[str, float, float]], int, list[float]]


def trace_windows(trace: ParsedTrace, end_ms: Sequence[float], steps_per_window: int) -> list[Window]:
    """The kernel windows of a parsed trace, ``steps_per_window`` steps each (the last may be
    shorter); ``end_ms``: each step's end in epoch ms, in the order of ``trace.steps``."""
    if steps_per_window < 1:
        raise ValueError(f"steps per kernel window must be >= 1, got {steps_per_window}")
    device = [(n, ts, end) for n, cat, _, ts, end, _, _ in trace.device_events if cat in DEVICE_CATS]
    events = device or [(n, ts, end) for n, _, _, ts, end, cat in trace.spans
                        if cat in HOST_CATS and not n.startswith(STEP_PREFIX)]
    if not events:
        return []
    names = np.array([e[0] for e in events], dtype=object)
    ts = np.array([e[1] for e in events], dtype=float)
    dur = np.array([e[2] - e[1] for e in events], dtype=float)
    out = []
    for k in range(0, len(trace.steps), steps_per_window):
        chunk = trace.steps[k:k + steps_per_window]
        inside = (ts >= chunk[0][0]) & (ts < chunk[-1][1])
        out.append((int(chunk[-1][2]), int(round(end_ms[k + len(chunk) - 1])),
                    list(zip(names[inside].tolist(), dur[inside].tolist(), ts[inside].tolist(), strict=True)),
                    len(chunk), [float(c[0]) for c in chunk]))
    return out


def kernel_points(windows: Mapping[int, list[Window]], rows: pd.DataFrame,
                  iteration_offset: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``kernel_stats`` and ``kernel_name`` points of every rank's windows (rank -> windows),
    tagged as that rank's ``stage_latency`` rows are."""
    tag_cols = [c for c in schema.RANK_TAGS if c in rows.columns]
    tags = rows.groupby("rank", sort=False)[tag_cols].first().drop(columns="rank", errors="ignore")
    points: list[dict[str, Any]] = []
    names: dict[str, dict[str, Any]] = {}
    for rank, wins in windows.items():
        if rank not in tags.index:
            continue
        channel = KernelChannel({"rank": int(rank), **tags.loc[rank].to_dict()})
        for it, end, events, steps, starts in wins:
            point, new = channel.window(it + iteration_offset, end, events, steps, starts)
            points.append(point)
            names.update({n["kernel"]: n for n in new})
    return pd.DataFrame(points), pd.DataFrame(list(names.values()))
