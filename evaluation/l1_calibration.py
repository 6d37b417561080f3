"""L1 calibration: false alarms and power of the step and spike detectors over a threshold grid.

Healthy iteration-time series come from the simulator (rank-level: every
rank's ``iteration_ms``; job-level: their median per iteration, as
:class:`~analyzer.detect.l1.L1Monitor` sees them). In a synchronous job a rank's
iteration ends with its DP group's all-gather, so the ranks of one DP group
share one series; :func:`healthy_series` keeps each distinct series once. Each setting is run over all
series at once (the detectors are vectorised); the average run length (ARL)
is armed series-iterations per false alarm. Power is measured on the same
series with a multiplicative step injected, so a setting is chosen from what
it misses as well as from what it invents.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.detect.spike import SpikeDetector
from analyzer.detect.step import StepDetector
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario


@dataclass(frozen=True)
class L1Setting:
    """One point of the grid (``persist`` is the step detector's; the spike detector ignores it)."""

    threshold: float
    min_change: float
    persist: int = 2
    window: int = 20
    min_history: int = 8


@dataclass
class AlarmRate:
    """False alarms of one setting on healthy series."""

    setting: L1Setting
    detector: str           # step | spike
    series: int
    armed: int              # series-iterations after min_history
    alarms: int

    @property
    def arl(self) -> float:
        """Armed series-iterations per false alarm (inf when none)."""
        return self.armed / self.alarms if self.alarms else float("inf")


@dataclass
class StepPower:
    """Detection of an injected step of ``factor`` at ``at`` in every series."""

    setting: L1Setting
    factor: float
    series: int
    detected: int
    onset_exact: int
    delay_median: float

    @property
    def recall(self) -> float:
        return self.detected / self.series if self.series else float("nan")


def healthy_iteration_ms(topology: dict[str, int], iterations: int, seed: int,
                         model: dict[str, Any] | None = None) -> np.ndarray:
    """``iteration_ms[iteration, rank]`` of a healthy simulated run (no analyzer)."""
    data: dict[str, Any] = {"topology": dict(topology), "run": {"job": "calib", "iterations": iterations,
                                                                 "seed": seed}}
    if model:
        data["model"] = copy.deepcopy(model)
    sim = ClusterSimulator(Scenario.from_dict(data))
    out = np.empty((iterations, sim.world))
    for i in range(iterations):
        out[i] = sim.step().iteration_ms
    return out


def healthy_series(topology: dict[str, int], iterations: int, seed: int,
                   model: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(job series ``[time, 1]``, distinct rank series ``[time, k]``) of one healthy run."""
    x = healthy_iteration_ms(topology, iterations, seed, model)
    return np.median(x, axis=1)[:, None], np.unique(x, axis=1)


def _step(s: L1Setting, n: int) -> StepDetector:
    return StepDetector(n, window=s.window, min_history=s.min_history, threshold=s.threshold,
                        min_change=s.min_change, persist=s.persist)


def _spike(s: L1Setting, n: int) -> SpikeDetector:
    return SpikeDetector(n, window=s.window, min_history=s.min_history, threshold=s.threshold,
                         min_change=s.min_change, max_len=1)


def false_alarms(series: np.ndarray, setting: L1Setting, detector: str) -> AlarmRate:
    """Alarms of ``detector`` over ``series[time, n]`` (all healthy: every alarm is false)."""
    t, n = series.shape
    det = _step(setting, n) if detector == "step" else _spike(setting, n)
    alarms = 0
    for i in range(t):
        u = det.update(series[i])
        alarms += int(u.confirmed.sum()) if detector == "step" else int(u.spike.sum())
    armed = max(t - setting.min_history, 0) * n
    return AlarmRate(setting, detector, n, armed, alarms)


def step_power(series: np.ndarray, setting: L1Setting, factor: float, at: int) -> StepPower:
    """Inject ``x *= factor`` from ``at`` into every series; count steps confirmed from ``at`` on."""
    t, n = series.shape
    x = series.copy()
    x[at:] *= factor
    det = _step(setting, n)
    first = np.full(n, -1, dtype=np.int64)
    onset = np.full(n, -1, dtype=np.int64)
    for i in range(t):
        u = det.update(x[i])
        new = u.confirmed & (first < 0) & (i >= at)
        first[new] = i
        onset[new] = u.onset_index[new]
    hit = first >= 0
    delay = float(np.median(first[hit] - at)) if hit.any() else float("nan")
    return StepPower(setting, factor, n, int(hit.sum()), int((onset[hit] == at).sum()), delay)


def grid(thresholds: tuple[float, ...], min_changes: tuple[float, ...],
         persists: tuple[int, ...] = (1,)) -> list[L1Setting]:
    """Every combination, in order."""
    return [L1Setting(t, m, p) for t in thresholds for m in min_changes for p in persists]
