"""Kernel windows as the kernel channel writes them (``kernel_stats``), made from the simulated run.

Every stage that runs on the device (compute and comm, not host) is one kernel launched
``LAUNCHES`` times an iteration: a compute stage ``<stage>_gemm``, a collective ``nccl:<stage>``.
A window of the last ``WINDOW`` iterations before every ``kernel_every``-th becomes one mode per
rank and kernel: count = launches, p50 = the median over the window of the stage's time /
launches, p99 = the largest such time widened by the kernels' own spread (``SPREAD``, log-normal).
So a fault in the stages shows in the kernels too, as it does on a GPU.

A ``transient_stall`` fault with ``host_side = true`` is a stall on the host (a JIT compile, GC,
a data loader): the stage timer sees the stage long, but the kernels run as usual and the GPU
idles between them: the window's ``gap_max_us`` holds the stall.

A :class:`KernelFault` slows one kernel of some ranks *without* changing their stage times:
the collective of one group degrading while compute overlaps it, the case ARGUS found only at
the kernel level (its PCIe fault: iteration time flat, AllReduce 100x apart from the other
groups). ``[[kernel_fault]]`` in a scenario: ``ranks``/``node``/``pp``, ``stage``, ``factor``,
``start``, optional ``end``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.kernel_mixture import Z99
from rankscope.kernel_names import kernel_id, mode_field, name_point
from rankscope.schema import StageSet

LAUNCHES = 8
WINDOW = 2
SPREAD = 0.03
#: The longest gap between kernels of a healthy window (us): launches are queued ahead.
LAUNCH_GAP_US = 40.0


@dataclass(frozen=True)
class KernelFault:
    """One kernel (that of ``stage``) of ``ranks`` ``factor`` x slower from ``start`` (to ``end``),
    the ranks' stage times unchanged (hidden by overlap)."""

    ranks: np.ndarray
    stage: str
    factor: float
    start: int
    end: int | None = None

    def active(self, iteration: int) -> bool:
        return iteration >= self.start and (self.end is None or iteration < self.end)


def kernel_names(stages: StageSet) -> dict[str, tuple[str, str, str]]:
    """Stage -> (kernel name, kind, the collective's group kind or "") of the device stages."""
    return {s.name: (f"nccl:{s.name}" if s.kind == "comm" else f"{s.name}_gemm", s.kind, s.group or "")
            for s in stages.stages if s.kind != "host"}


def host_gaps(values: np.ndarray, iteration: int, stages: StageSet, stalls: list) -> tuple[np.ndarray, np.ndarray]:
    """Host-side stalls (``transient_stall`` faults with ``host_side``) in a window: the stage times
    without them (the kernels ran as usual) and each rank's longest launch gap (us), the stall's
    excess: the GPU idled while the host compiled, collected garbage or loaded data."""
    values, gap = values.copy(), np.zeros(values.shape[1])
    first = iteration - len(values) + 1
    for f in stalls:
        s = stages.index(f.stage)
        for t in range(len(values)):
            if f.active(first + t):
                excess = values[t, f.ranks, s] * (1 - 1 / f.factor)
                gap[f.ranks] = np.fmax(gap[f.ranks], excess * 1000.0)
                values[t, f.ranks, s] -= excess
    return values, gap


def kernel_frame(tags: pd.DataFrame, values: np.ndarray, iteration: int, time_ms: int, stages: StageSet,
                 faults: list[KernelFault], stalls: list | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``kernel_stats`` points of one window (``values`` ``[T, R, S]`` ms of its iterations,
    ``tags`` the ``stage_latency`` tag columns of its ranks, one row per rank of ``R`` that
    reported; ``stalls``: host-side stalls, :func:`host_gaps`) and the ``kernel_name`` points."""
    ranks = tags["rank"].to_numpy(np.int64)
    values, gap = host_gaps(values, iteration, stages, stalls or [])
    out = {"time": np.full(len(ranks), int(time_ms)), **{c: tags[c].to_numpy() for c in tags.columns},
           schema.ITERATION_FIELD: int(iteration), "steps": len(values), "events": 0,
           "gap_max_us": gap[ranks] + LAUNCH_GAP_US}
    names = []
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # a rank that reported none of the window
        for stage, (name, kind, group) in kernel_names(stages).items():
            per = values[:, ranks, stages.index(stage)] * (1000.0 / LAUNCHES)   # us a launch, [T, R]
            factor = np.ones(len(ranks))
            for f in faults:
                if f.stage == stage and f.active(iteration):
                    factor[np.isin(ranks, f.ranks)] *= f.factor
            seen = np.isfinite(per).any(axis=0)
            kid = kernel_id(name)
            out[mode_field(kid, 0, "n")] = np.where(seen, float(LAUNCHES * len(per)), np.nan)
            out[mode_field(kid, 0, "p50")] = np.nanmedian(per, axis=0) * factor
            out[mode_field(kid, 0, "p99")] = np.nanmax(per, axis=0) * factor * np.exp(Z99 * SPREAD)
            out["events"] = out["events"] + np.where(seen, LAUNCHES * len(per), 0)
            names.append(name_point(tags["job"].iloc[0], kid, name, kind, group, time_ms))
    return pd.DataFrame(out), pd.DataFrame(names)
