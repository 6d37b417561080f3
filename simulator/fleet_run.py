"""A cluster day (:mod:`simulator.fleet`) simulated into a store, and its ground truth.

Job by job, attempt by attempt: each attempt is one :class:`~simulator.cluster.ClusterSimulator`
run from where the job stopped plus its downtime; its points go through the simulator's writer
(one writer thread, :class:`simulator.simulate._Writer`; a small job's iterations are posted
several at a time) with the attempt's iteration numbers moved to the job's (a restart goes back
to its checkpoint) and, on the jobs that carry one, the integer field ``attempt`` (what
TORCHELASTIC_RESTART_COUNT says: 0, then 1, 2, ...). A job whose name was used before starts
at least the fleet's reuse gap after that job's last point. The truth records every attempt's
times and every fault's window, culprit ranks and hosts as written.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from rankscope.store import Store
from simulator.fleet import Fleet
from simulator.fleet_jobs import FaultPlan, FleetJob
from simulator.fleet_scenarios import lost_iterations, segment_simulator
from simulator.simulate import _Writer
from simulator.truth import write_json_file

#: A small job's iterations are posted together up to about this many points.
BATCH_ROWS = 5000
#: The field that carries the job's restart count (on the jobs that write it).
ATTEMPT_FIELD = "attempt"


@dataclass
class SegmentRun:
    """One attempt as written: ``start_ms`` when it began (after its downtime), the stamp of
    each iteration in ``times_ms``."""

    attempt: int
    cause: str
    first_iteration: int
    iterations: int
    world: int
    high_water: int
    warmup: int
    downtime_s: float
    start_ms: int
    times_ms: list[int] = field(default_factory=list)

    @property
    def end_ms(self) -> int:
        return self.times_ms[-1] if self.times_ms else self.start_ms


@dataclass
class JobRun:
    """One job of the day as written."""

    name: str
    instance: int
    world: int
    layout: dict[str, int]
    iteration_s: float
    attempt_field: bool
    checkpoint_every: int
    segments: list[SegmentRun] = field(default_factory=list)

    @property
    def iterations(self) -> int:
        """Iterations written, those run again after a rewind included."""
        return sum(s.iterations for s in self.segments)

    @property
    def start_ms(self) -> int:
        return self.segments[0].start_ms

    @property
    def end_ms(self) -> int:
        return self.segments[-1].end_ms

    def times(self) -> np.ndarray:
        """Every iteration's stamp, in order."""
        return np.concatenate([np.asarray(s.times_ms, dtype=np.int64) for s in self.segments])


@dataclass
class FaultTruth:
    """One injected fault: ``onset_ms``/``end_ms`` are the stamps of its first and last slowed
    iterations; ``onset_iteration``/``end_iteration`` (exclusive) the job's iteration numbers
    (a fault in a re-run window repeats numbers the job wrote before); ``hosts`` as written."""

    job: str
    instance: int
    world: int
    kind: str
    stage: str | None
    factor: float
    ranks: list[int]
    hosts: list[str]
    attempt: int
    placement: str
    onset_iteration: int
    end_iteration: int
    onset_ms: int
    end_ms: int
    lost: float = float("nan")


@dataclass
class FleetTruth:
    """What was written: the jobs, the faults, how many points, the lifecycle events."""

    start_ms: int
    points: int
    jobs: list[JobRun]
    faults: list[FaultTruth]
    lifecycle: dict[str, int]

    @property
    def end_ms(self) -> int:
        return max(j.end_ms for j in self.jobs)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def write(self, path: str | Path) -> Path:
        return write_json_file(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> FleetTruth:
        d: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
        jobs = [JobRun(**{**j, "segments": [SegmentRun(**s) for s in j["segments"]]}) for j in d["jobs"]]
        return cls(d["start_ms"], d["points"], jobs, [FaultTruth(**f) for f in d["faults"]], d["lifecycle"])


def write_fleet(fleet: Fleet, store: Store, start_ms: int, progress: bool = True) -> FleetTruth:
    """Simulate every job of ``fleet`` from ``start_ms`` into ``store``; the truth."""
    writer = _Writer(store)
    bar = tqdm(total=fleet.points, desc="fleet", unit="pt", unit_scale=True, disable=None if progress else True,
               dynamic_ncols=True)
    runs: dict[int, JobRun] = {}
    ended: dict[str, int] = {}
    try:
        for job in sorted(fleet.jobs, key=lambda j: (j.instance, j.index)):   # a reused name's first job first
            begin = start_ms + int(job.start_s * 1000)
            if job.name in ended:
                begin = max(begin, ended[job.name] + int(fleet.config.reuse_gap * 1000))
            runs[job.index] = run = _run_job(fleet, job, writer, begin, bar)
            ended[job.name] = run.end_ms
        writer.drain()
    finally:
        writer.close()
        bar.close()
    faults = [_fault_truth(fleet.jobs[p.job], p, runs[p.job]) for p in fleet.faults]
    jobs = [runs[j.index] for j in fleet.jobs]
    return FleetTruth(start_ms, writer.points, jobs, sorted(faults, key=lambda f: (f.job, f.onset_ms)),
                      fleet.lifecycle())


def _run_job(fleet: Fleet, job: FleetJob, writer: _Writer, begin_ms: int, bar: tqdm) -> JobRun:
    """Every attempt of ``job``, written; the job as run."""
    run = JobRun(job.name, job.instance, job.world, dataclasses.asdict(job.layout), job.iteration_s,
                 job.attempt_field, job.checkpoint_every)
    t = begin_ms
    for k, seg in enumerate(job.segments):
        t += int(seg.downtime_s * 1000)
        sim = segment_simulator(job, k, fleet.faults, fleet.config.seed, start_ms=t)
        sr = SegmentRun(seg.attempt, seg.cause, seg.first_iteration, seg.iterations, sim.world, seg.high_water,
                        seg.warmup, seg.downtime_s, t)
        batch: list[pd.DataFrame] = []
        for _ in range(seg.iterations):
            res = sim.step()
            sr.times_ms.append(res.time_ms)
            if not res.reporting.any():
                continue
            frame = sim.frame(res)
            frame["iteration"] += seg.first_iteration
            if job.attempt_field:
                frame[ATTEMPT_FIELD] = np.int64(seg.attempt)
            batch.append(frame)
            bar.update(len(frame))
            if sum(len(f) for f in batch) >= BATCH_ROWS:
                _post(writer, batch)
        _post(writer, batch)
        run.segments.append(sr)
        t = sr.end_ms
    return run


def _post(writer: _Writer, batch: list[pd.DataFrame]) -> None:
    """Post the frames held (one request), after the previous post is done; empties ``batch``."""
    if batch:
        frame = batch[0] if len(batch) == 1 else pd.concat(batch, ignore_index=True)
        writer.drain()
        writer.post_iteration(frame)
        batch.clear()


def _fault_truth(job: FleetJob, plan: FaultPlan, run: JobRun) -> FaultTruth:
    seg, sr = job.segments[plan.segment], run.segments[plan.segment]
    topo = job.layout.topology(seg.dp, seg.hosts)
    last = min(plan.end, seg.iterations) - 1
    return FaultTruth(job.name, job.instance, job.world, plan.kind, plan.stage, plan.factor, list(plan.ranks),
                      topo.hosts_of(list(plan.ranks)), seg.attempt, plan.placement, seg.first_iteration + plan.start,
                      seg.first_iteration + plan.end, sr.times_ms[plan.start], sr.times_ms[last],
                      round(lost_iterations(sr.times_ms, plan.start, min(plan.end, seg.iterations)), 3))
