"""The analyzer's incidents over a cluster day, scored against the day's truth (the fleet benchmark).

A fault is **found** when an incident of its job names one of its culprit hosts (or, an
incident without hosts, one of its ranks) with an onset from ``BEFORE_ITERATIONS`` iterations
before the fault's first slowed iteration to ``AFTER_ITERATIONS`` after its last. The
**delay** is the earliest such incident's onset minus the fault's, in seconds and in the job's
iterations written between them. An incident that matches no fault is **false**; false
incidents are counted per job-size bucket (the job's first size) per 1,000 iterations written
(re-runs included), each with where in the job's lifecycle its onset fell.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from evaluation.accuracy import EXPECTED_CLASS
from rankscope import schema
from rankscope.incident import Incident
from rankscope.store import Store
from simulator.fleet_run import FaultTruth, FleetTruth, JobRun

BEFORE_ITERATIONS = 3
AFTER_ITERATIONS = 10
BUCKETS = (("8-64", 8, 64), ("65-512", 65, 512), ("513-4,096", 513, 4096), (">4,096", 4097, 10**9))


def bucket(world: int) -> str:
    return next(name for name, lo, hi in BUCKETS if lo <= world <= hi) if world >= 8 else BUCKETS[0][0]


@dataclass
class FaultResult:
    """One fault and the incidents that name it."""

    fault: FaultTruth
    incidents: list[Incident] = field(default_factory=list)
    delay_s: float | None = None
    delay_it: int | None = None

    @property
    def found(self) -> bool:
        return bool(self.incidents)

    @property
    def class_ok(self) -> bool:
        want = EXPECTED_CLASS[self.fault.kind]
        return any(i.cls == want for i in self.incidents)


@dataclass
class FalseIncident:
    incident: Incident
    instance: int
    world: int
    where: str


@dataclass
class FleetScore:
    faults: list[FaultResult]
    false: list[FalseIncident]
    iterations: dict[str, int]
    incidents: int

    @property
    def found(self) -> int:
        return sum(r.found for r in self.faults)

    def false_rate(self, name: str) -> tuple[int, float]:
        """(false incidents, per 1,000 job-iterations) of a size bucket."""
        n = sum(bucket(f.world) == name for f in self.false)
        its = self.iterations.get(name, 0)
        return n, (1000.0 * n / its if its else float("nan"))


def read_incidents(store: Store) -> list[Incident]:
    """Every incident stored, each (job, id, onset) once in its latest version."""
    df = store.read(schema.INCIDENT)
    if not len(df):
        return []
    sort = ["time", "updated_ms"] if "updated_ms" in df.columns else ["time"]
    df = df.sort_values(sort, kind="stable").drop_duplicates(["job", "id", "time"], keep="last")
    return [Incident.from_row(r) for r in df.to_dict("records")]


def _names(inc: Incident, fault: FaultTruth) -> bool:
    if inc.hosts:
        return bool(set(inc.hosts) & set(fault.hosts))
    return bool(set(inc.ranks) & set(fault.ranks))


def score(truth: FleetTruth, incidents: list[Incident]) -> FleetScore:
    """Match the incidents to the faults; the rest are false."""
    runs = {(j.name, j.instance): j for j in truth.jobs}
    used: set[int] = set()
    results = []
    for f in truth.faults:
        run = runs[(f.job, f.instance)]
        step = run.iteration_s * 1000
        lo, hi = f.onset_ms - BEFORE_ITERATIONS * step, f.end_ms + AFTER_ITERATIONS * step
        hits = sorted((i for i in incidents if i.job == f.job and lo <= i.onset_ms <= hi and _names(i, f)),
                      key=lambda i: i.onset_ms)
        used.update(id(i) for i in hits)
        res = FaultResult(f, hits)
        if hits:
            times = run.times()
            res.delay_s = (hits[0].onset_ms - f.onset_ms) / 1000
            res.delay_it = int(np.searchsorted(times, hits[0].onset_ms, "right")
                               - np.searchsorted(times, f.onset_ms, "right"))
        results.append(res)
    false = [_false(i, truth.jobs) for i in incidents if id(i) not in used]
    its: dict[str, int] = {}
    for j in truth.jobs:
        its[bucket(j.world)] = its.get(bucket(j.world), 0) + j.iterations
    return FleetScore(results, false, its, len(incidents))


def _false(inc: Incident, jobs: list[JobRun]) -> FalseIncident:
    """A false incident, put on the job instance it fell in, with where in its lifecycle."""
    mine = [j for j in jobs if j.name == inc.job] or jobs[:1]
    run = next((j for j in reversed(mine) if j.start_ms <= inc.onset_ms), mine[0])
    return FalseIncident(inc, run.instance, run.world, where(run, inc.onset_ms))


def where(run: JobRun, t_ms: int) -> str:
    """Where ``t_ms`` falls in a job's life: warm-up, re-run window, after a restart, ..."""
    if t_ms > run.end_ms:
        return f"after the job's last point ({(t_ms - run.end_ms) / 1000:.0f} s)"
    seg = next((s for s in reversed(run.segments) if s.start_ms <= t_ms), run.segments[0])
    i = int(np.searchsorted(np.asarray(seg.times_ms), t_ms))   # the segment's iteration at t
    what = "job start" if seg.attempt == 0 else f"{seg.cause} (attempt {seg.attempt})"
    if i < seg.warmup:
        return f"warm-up after the {what}, its iteration {i}"
    if seg.first_iteration + i < seg.high_water:
        return f"re-run window after the {what}, its iteration {i} (iteration {seg.first_iteration + i})"
    return f"{i} iterations after the {what}"
