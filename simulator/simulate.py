"""Run a scenario into a store: ``stage_latency`` per rank per iteration, its events, its truth.

Everything goes through :class:`~rankscope.store.Store` (the one write path:
its validation, its encoder, on InfluxDB its per-rank tag-prefix cache). One
writer thread posts iteration i while the model computes iteration i+1.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from rankscope import schema
from rankscope.schema import DEFAULT_STAGES, StageSet
from rankscope.store import Store
from rankscope.topology import Topology
from simulator.cluster import ClusterSimulator
from simulator.scenario import EventSpec, Scenario
from simulator.truth import Truth


def default_truth_path(store: Store, job: str) -> Path:
    """``<job>.truth.json`` next to an embedded store's file, else in the current directory."""
    path = getattr(store, "path", None)
    folder = Path(path).parent if path is not None and str(path) != ":memory:" else Path.cwd()
    return folder / f"{job}.truth.json"


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
             progress: bool = True, stages: StageSet = DEFAULT_STAGES) -> Truth:
    """Run a scenario into ``store``; returns (and, given ``truth_path``, writes) its ground truth.

    Backfill (default): timestamps are spaced by the simulated job iteration
    times, starting at ``start_ms`` or, without it, ending at about now (the run
    is simulated twice: once to learn its length). ``live``: each iteration is
    written when its simulated time (divided by ``speed``) has passed, stamped now.
    """
    if iterations is not None:
        scenario = scenario.with_overrides(iterations=iterations)
    if not (isinstance(speed, (int, float)) and np.isfinite(speed) and speed > 0):
        raise ValueError(f"speed must be a positive number, got {speed!r}")
    now = int(time.time() * 1000)
    if live:
        begin = now
    elif start_ms is not None:
        begin = int(start_ms)
    else:
        begin = now - int(round(ClusterSimulator(scenario, stages).run_length_ms()))
    sim = ClusterSimulator(scenario, stages, start_ms=begin)
    truth = Truth.from_scenario(scenario)
    events_at: dict[int, list[EventSpec]] = {}
    for ev in scenario.events:
        events_at.setdefault(ev.at, []).append(ev)
    bar = tqdm(total=scenario.iterations, desc=f"simulate {scenario.job}", unit="it",
               disable=None if progress else True, leave=True, dynamic_ncols=True)
    wall0 = time.monotonic()
    if live and truth_path is not None:
        truth.write(truth_path)
    def post_iteration(frame: pd.DataFrame) -> int:
        return store.write_stage_latency(frame).written

    def post_events(frame: pd.DataFrame) -> int:
        store.write_measurement(schema.EVENT, frame)
        return 0  # counted as events, not stage_latency points

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rankscope-sim-writer")
    pending: list[Future] = []
    points = 0
    try:
        for _ in range(scenario.iterations):
            res = sim.step()
            stamp = res.time_ms
            if live:
                due = wall0 + (sim.elapsed_ms / 1000.0) / speed
                time.sleep(max(0.0, due - time.monotonic()))
                stamp = int(time.time() * 1000)
            frame = sim.frame(res, stamp) if res.reporting.any() else None
            while pending:
                points += pending.pop(0).result()  # raises the writer's error, if any
            if frame is not None:
                pending.append(pool.submit(post_iteration, frame))
            if res.iteration in events_at:
                ev = events_frame(scenario.job, events_at[res.iteration], stamp, scenario.topology)
                pending.append(pool.submit(post_events, ev))
            truth.times_ms.append(stamp)
            bar.update(1)
            bar.set_postfix_str(f"{res.job_iteration_ms / 1000:.1f} s/iteration, {points:,} points",
                                refresh=False)
        while pending:
            points += pending.pop(0).result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
        truth.finalise()
        if truth_path is not None:
            truth.write(truth_path)
    return truth
