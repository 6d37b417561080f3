"""The kernel channel: per window of profiled steps, each kernel's modes as one ``kernel_stats`` point.

A window's kernel events (name, duration) come from torch.profiler (:func:`profiler_events`: on a
GPU the CUDA kernels Kineto records, on CPU the operators, so the same path runs in a gloo job)
or from a trace file. Per kernel they are compressed to their modes (count, p50, p99:
:func:`collector.kernel_modes.compress`). The point is bounded whatever the model runs:

- the ``top_k`` kernels by total time in the window keep their own fields; the others are pooled
  into one ``other`` kernel;
- a kernel's fields are named by a 10-hex-digit hash of its name (``k1a2b3c4d5e_m0_p50``), so
  the series stay one per rank (as ``stage_latency``): a kernel is a field, never a tag;
- its name is written by each rank once an hour (a name lost on the way comes again), in
  ``kernel_name`` (job, kernel -> name, kind; stamped at the hour, so the ranks' points
  coincide), cut to ``MAX_NAME`` characters (a templated CUDA kernel's name runs to thousands).
  Until its name is in, the analyzer calls a kernel's kind ``unknown`` and confirms nothing of it.

At ``top_k`` = 16 and 3 modes that is at most 17 x 3 x 3 numbers a rank a window: about 2 KB as
line protocol (docs/schema.md).

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> events = [("aten::mm", float(d)) for d in rng.lognormal(np.log(120), 0.05, 50)]
    >>> ch = KernelChannel({"job": "j", "rank": 0}, top_k=4)
    >>> point, names = ch.window(7, 1_000, events)
    >>> kid = kernel_id("aten::mm")   # rankscope.kernel_names
    >>> point[f"{kid}_m0_n"], round(point[f"{kid}_m0_p50"], -1), names[0]["name"], names[0]["kind"]
    (50.0, 120.0, 'aten::mm', 'compute')
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from collector.kernel_modes import compress
from rankscope import schema
from rankscope.kernel_names import (
    HOUR_MS,
    OTHER,
    kernel_id,
    kernel_kind,
    mode_field,
    name_point,
    step_field,
)

#: The quantile over a window's steps of a kernel's time in each that is its time per step: a
#: slowed call moves every step's, a call preempted by a busy host one step's, and a quarter of
#: the steps preempted at once is rare where a half is not (10% of calls preempted, three a step:
#: 1 window in 2,500 against 1 in 10).
STEP_QUANTILE = 0.25


class KernelChannel:
    """One rank's kernel windows, compressed, to ``sink`` (e.g. the background writer of
    ``kernel_stats``) and, for kernels not seen before, ``names_sink`` (of ``kernel_name``).

    Parameters
    ----------
    tags: the rank's tags (:meth:`collector.coordinates.RankCoordinates.tags`).
    top_k: kernels with fields of their own, by total time in the window (default 16).
    max_modes: modes kept per kernel, the most frequent (default 3).
    """

    def __init__(self, tags: dict[str, Any], sink: Callable[[dict], None] | None = None,
                 names_sink: Callable[[dict], None] | None = None, top_k: int = 16, max_modes: int = 3):
        if top_k < 1 or max_modes < 1:
            raise ValueError(f"top_k ({top_k}) and max_modes ({max_modes}) must be >= 1")
        self.tags, self.sink, self.names_sink = dict(tags), sink, names_sink
        self.top_k, self.max_modes = top_k, max_modes
        self._named: dict[str, int] = {}   # kernel -> the hour its name went last: again each hour

    def window(self, iteration: int, time_ms: int, events: Iterable[tuple], steps: int = 1,
               step_starts: Sequence[float] | None = None) -> tuple[dict, list[dict]]:
        """The ``kernel_stats`` point of a window of ``steps`` steps ending at ``iteration`` and the
        ``kernel_name`` points of kernels new to this rank (this hour); both also handed to the
        sinks. ``events``: (name, duration us) or (name, duration us, start us); with starts,
        ``gap_max_us`` is the longest time the device ran none of them (the host not launching:
        a JIT compile, GC, a data loader), and given the steps' starts (us, in order) each kernel's
        time per step: the :data:`STEP_QUANTILE` over the steps of its events' durations summed in
        each (one call of several of the same name slowed moves it whole; an event a busy host
        preempted moves one step's). Events with a duration that is not a positive finite number are left out."""
        rows = list(events)
        frame = pd.DataFrame(rows, columns=["name", "us", "start"][: len(rows[0]) if rows else 2])
        frame = frame[np.isfinite(frame["us"].to_numpy(float)) & (frame["us"].to_numpy(float) > 0)]
        point: dict[str, Any] = {"time": int(time_ms), **self.tags, schema.ITERATION_FIELD: int(iteration),
                                 "steps": int(steps), "events": len(frame)}
        if "start" in frame.columns and len(frame) > 1:
            point["gap_max_us"] = longest_gap(frame["start"].to_numpy(float), frame["us"].to_numpy(float))
        totals = frame.groupby("name", sort=False)["us"].sum().sort_values(ascending=False, kind="stable")
        top = list(totals.index[: self.top_k])
        names = []
        for name in top:
            kid = kernel_id(name)
            self._fields(point, kid, frame["us"].to_numpy(float)[frame["name"].to_numpy() == name])
            if self._named.get(kid) != int(time_ms) // HOUR_MS:
                self._named[kid] = int(time_ms) // HOUR_MS
                names.append(name_point(self.tags.get("job"), kid, name, kernel_kind(name), "", time_ms))
        if step_starts is not None and len(step_starts) and "start" in frame.columns:
            self._per_step(point, frame[frame["name"].isin(top)], np.asarray(step_starts, dtype=float))
        rest = frame["us"].to_numpy(float)[~frame["name"].isin(top).to_numpy()]
        if rest.size:
            self._fields(point, OTHER, rest)
        if self.sink is not None:
            self.sink(point)
        if self.names_sink is not None:
            for n in names:
                self.names_sink(n)
        return point, names

    @staticmethod
    def _per_step(point: dict[str, Any], frame: pd.DataFrame, starts: np.ndarray) -> None:
        """Each kernel's :data:`STEP_QUANTILE` over the steps of its summed durations in each step
        (a step without the kernel counts 0: it ran less there)."""
        step = np.searchsorted(starts, frame["start"].to_numpy(float), side="right") - 1
        inside = step >= 0
        sums = (pd.DataFrame({"name": frame["name"].to_numpy()[inside], "step": step[inside],
                              "us": frame["us"].to_numpy(float)[inside]})
                .pivot_table(index="name", columns="step", values="us", aggfunc="sum", fill_value=0.0)
                .reindex(columns=range(len(starts)), fill_value=0.0))
        for name, row in sums.iterrows():
            point[step_field(kernel_id(str(name)))] = float(np.quantile(row.to_numpy(float), STEP_QUANTILE))

    def _fields(self, point: dict[str, Any], kid: str, durations: np.ndarray) -> None:
        modes = sorted(compress(durations), key=lambda m: -m.count)[: self.max_modes]
        for j, m in enumerate(sorted(modes, key=lambda m: m.p50_us)):
            point[mode_field(kid, j, "n")] = float(m.count)   # float: a batch of points with other kernels holds NaN
            point[mode_field(kid, j, "p50")] = m.p50_us
            point[mode_field(kid, j, "p99")] = m.p99_us


def longest_gap(start: np.ndarray, dur: np.ndarray) -> float:
    """The longest stretch (us) between events during which none ran (nested and overlapping
    events count once): the device idle between kernels."""
    order = np.argsort(start, kind="stable")
    s = start[order]
    busy_until = np.maximum.accumulate(s + dur[order])
    return float(np.max(s[1:] - busy_until[:-1], initial=0.0))


def profiler_events(prof: Any, device: str = "cpu") -> list[tuple[str, float, float]]:
    """(name, duration us, start us) of a torch.profiler window's events: CUDA kernels with
    ``device="cuda"``, CPU operators with ``"cpu"`` (a gloo job's "kernels"); not the profiler's
    own ``ProfilerStep#N`` annotations (:func:`profiler_steps`)."""
    want = device.upper()
    out = []
    for e in prof.events():
        if str(getattr(e, "device_type", "")).rsplit(".", 1)[-1] != want or str(e.name).startswith(STEP_PREFIX):
            continue
        out.append((str(e.name), float(e.time_range.elapsed_us()), float(e.time_range.start)))
    return out


#: The name torch.profiler gives each step's annotation.
STEP_PREFIX = "ProfilerStep#"


def profiler_steps(prof: Any) -> list[float]:
    """The start (us) of each step of a torch.profiler window, in order (its ``ProfilerStep#N``)."""
    return sorted(float(e.time_range.start) for e in prof.events() if str(e.name).startswith(STEP_PREFIX))


class ProfilerWindows:
    """torch.profiler sampled in a training loop: ``active`` steps of every ``every``, each window
    handed to a :class:`KernelChannel` (CUDA kernels where ``device`` is ``cuda``, the CPU
    operators otherwise). Call :meth:`step` after every step, :meth:`close` at the end."""

    def __init__(self, channel: KernelChannel, every: int = 100, active: int = 2, device: str | None = None):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        if active < 1 or every < active + 1:
            raise ValueError(f"kernel windows: need 1 <= active ({active}) < every ({every})")
        self.channel, self.iteration, self.windows, self.active = channel, 0, 0, active
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        self._prof = profile(activities=acts, on_trace_ready=self._ready,
                             schedule=schedule(wait=every - active - 1, warmup=1, active=active))
        self._prof.__enter__()

    def _ready(self, prof: Any) -> None:
        steps = profiler_steps(prof)
        self.channel.window(self.iteration, int(time.time() * 1000), profiler_events(prof, self.device),
                            steps=self.active, step_starts=steps or None)
        self.windows += 1

    def step(self, iteration: int) -> None:
        """The step ``iteration`` ended."""
        self.iteration = int(iteration)
        self._prof.step()

    def close(self) -> None:
        self._prof.__exit__(None, None, None)
