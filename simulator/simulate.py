"""Run a scenario into a store: ``stage_latency`` per rank per iteration, its events, its truth.

Everything goes through :class:`~rankscope.store.Store` (the one write path:
its validation, its encoder, on InfluxDB its per-rank tag-prefix cache). One
writer thread posts iteration i while the model computes iteration i+1.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from rankscope import schema
from rankscope.schema import StageSet
from rankscope.store import Store
from rankscope.topology import Topology
from simulator.cluster import ClusterSimulator
from simulator.faults import EventSpec
from simulator.gpu_telemetry import health_frame, health_ranks
from simulator.kernel_windows import WINDOW, kernel_frame
from simulator.scenario import Scenario
from simulator.swaps import NodeSwap
from simulator.truth import Truth, truth_file_name


def default_truth_path(store: Store, job: str) -> Path:
    """``<job>.truth.json`` next to an embedded store's file, else in the current directory;
    always in that folder, whatever the job name (:func:`~simulator.truth.truth_file_name`)."""
    path = getattr(store, "path", None)
    folder = Path(path).parent if path is not None and str(path) != ":memory:" else Path.cwd()
    return folder / truth_file_name(job)


def events_frame(job: str, events: Sequence[EventSpec], time_ms: int, topology: Topology) -> pd.DataFrame:
    """``event`` points of out-of-band events at ``time_ms`` (on the host of their node)."""
    return pd.DataFrame({
        "time": np.full(len(events), int(time_ms), dtype=np.int64),
        "job": job,
        "name": [e.name for e in events],
        "host": ["" if e.node is None else topology.host_names([e.node])[0] for e in events],
        "node": [str(-1 if e.node is None else e.node) for e in events],
        "severity": [e.severity for e in events],
        "source": [e.source for e in events],
        "rank": np.array([-1 if e.rank is None else e.rank for e in events], dtype=np.int64),
        "text": [e.text or e.name for e in events],
        "value": np.ones(len(events), dtype=np.int64),
    })


def simulate(scenario: Scenario, store: Store, iterations: int | None = None, live: bool = False,
             speed: float = 1.0, truth_path: str | Path | None = None, start_ms: int | None = None,
             progress: bool = True, stages: StageSet | None = None, pause: Pause | None = None) -> Truth:
    """Run a scenario into ``store``; returns (and, given ``truth_path``, writes) its ground truth.

    Backfill (default): timestamps are spaced by the simulated job iteration
    times, starting at ``start_ms`` or, without it, ending at about now (the run
    is simulated twice: once to learn its length). ``live``: each iteration is
    written when its simulated time (divided by ``speed``) has passed, stamped now.
    ``pause``: once its iteration is written, its callback runs (the run waits) and the node
    swaps it returns take effect from the next iteration (what an operator did meanwhile).
    """
    if iterations is not None:
        scenario = scenario.with_overrides(iterations=iterations)
    if not (isinstance(speed, (int, float)) and np.isfinite(speed) and speed > 0):
        raise ValueError(f"speed must be a positive number, got {speed!r}")
    sim = ClusterSimulator(scenario, stages, start_ms=_begin_ms(scenario, stages, live, start_ms))
    truth = Truth.from_scenario(scenario)
    bar = tqdm(total=scenario.iterations, desc=f"simulate {scenario.job}", unit="it",
               disable=None if progress else True, leave=True, dynamic_ncols=True)
    wall0 = time.monotonic()
    if live and truth_path is not None:
        truth.write(truth_path)
    writer = _Writer(store)
    try:
        _run(sim, writer, truth, bar, wall0 if live else None, speed, pause)
    finally:
        writer.close()
        bar.close()
        truth.finalise()
        if truth_path is not None:
            truth.write(truth_path)
    return truth


def _begin_ms(scenario: Scenario, stages: StageSet | None, live: bool, start_ms: int | None) -> int:
    """Where the simulated clock starts: now (live), ``start_ms``, or the run's length before now."""
    now = int(time.time() * 1000)
    if live:
        return now
    if start_ms is not None:
        return int(start_ms)
    return now - int(round(ClusterSimulator(scenario, stages).run_length_ms()))


class _Writer:
    """One writer thread: it posts iteration i while the model computes iteration i+1."""

    def __init__(self, store: Store):
        self.store = store
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rankscope-sim-writer")
        self.pending: list[Future] = []
        self.points = 0   # stage_latency points written

    def drain(self) -> None:
        """Wait for what was posted (raises the writer's error, if any)."""
        while self.pending:
            self.points += self.pending.pop(0).result()

    def post_iteration(self, frame: pd.DataFrame) -> None:
        self.pending.append(self.pool.submit(lambda: self.store.write_stage_latency(frame).written))

    def post_kernels(self, stats: pd.DataFrame, names: pd.DataFrame) -> None:
        def write() -> int:
            self.store.write_measurement(schema.KERNEL_NAME, names)
            self.store.write_measurement(schema.KERNEL_STATS, stats)
            return 0  # not stage_latency points
        self.pending.append(self.pool.submit(write))

    def post_health(self, frame: pd.DataFrame) -> None:
        def write() -> int:
            self.store.write_measurement(schema.GPU_HEALTH, frame)
            return 0  # not stage_latency points
        self.pending.append(self.pool.submit(write))

    def post_events(self, frame: pd.DataFrame) -> None:
        def write() -> int:
            self.store.write_measurement(schema.EVENT, frame)
            return 0  # counted as events, not stage_latency points
        self.pending.append(self.pool.submit(write))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class Pause:
    """Stop after iteration ``after`` is stored and call ``then``; the swaps it returns are done
    from the next iteration on."""

    after: int
    then: Callable[[], list[NodeSwap]]


def _pause(sim: ClusterSimulator, writer: _Writer, truth: Truth, pause: Pause | None, iteration: int) -> None:
    if pause is None or iteration != pause.after:
        return
    writer.drain()
    swaps = [NodeSwap(s.node, max(s.at, iteration + 1), s.host) for s in pause.then()]
    if swaps:
        sim.scenario = dataclasses.replace(sim.scenario, swaps=[*sim.scenario.swaps, *swaps])
        truth.swaps += [s.to_dict() for s in swaps]


def _run(sim: ClusterSimulator, writer: _Writer, truth: Truth, bar: tqdm, wall0: float | None,
         speed: float, pause: Pause | None = None) -> None:
    """Step every iteration of the scenario and post its points and events; ``wall0`` (live):
    the wall clock the run started at, each iteration waits for its simulated time."""
    scenario = sim.scenario
    events_at: dict[int, list[EventSpec]] = {}
    for ev in scenario.events:
        events_at.setdefault(ev.at, []).append(ev)
    recent: deque[np.ndarray] = deque(maxlen=WINDOW)   # the last iterations' values, for kernel windows
    gpus, counters = health_ranks(scenario.topology, scenario.faults), {}   # gpu_health of the faulty GPUs
    for _ in range(scenario.iterations):
        res = sim.step()
        stamp = res.time_ms
        if wall0 is not None:
            due = wall0 + (sim.elapsed_ms / 1000.0) / speed
            time.sleep(max(0.0, due - time.monotonic()))
            stamp = int(time.time() * 1000)
        frame = sim.frame(res, stamp) if res.reporting.any() else None
        writer.drain()
        if frame is not None:
            writer.post_iteration(frame)
        recent.append(res.values)
        if frame is not None and scenario.kernel_every and (res.iteration + 1) % scenario.kernel_every == 0:
            tags = frame[[c for c in schema.RANK_TAGS if c in frame.columns]]
            writer.post_kernels(*kernel_frame(tags, np.stack(recent), res.iteration, stamp, sim.stages,
                                              scenario.kernel_faults, [f for f in scenario.faults if f.host_side]))
        if len(gpus):
            writer.post_health(health_frame(scenario.job, scenario.topology, scenario.faults, gpus, res.iteration, stamp,
                                            float(np.median(res.iteration_ms)), scenario.seed, counters))
        if res.iteration in events_at:
            writer.post_events(events_frame(scenario.job, events_at[res.iteration], stamp, scenario.topology))
        truth.times_ms.append(stamp)
        _pause(sim, writer, truth, pause, res.iteration)
        bar.update(1)
        bar.set_postfix_str(f"{res.job_iteration_ms / 1000:.1f} s/iteration, {writer.points:,} points",
                            refresh=False)
    writer.drain()
