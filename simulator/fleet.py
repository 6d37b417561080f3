"""A cluster day: a fleet of jobs, their lifecycles and their faults, drawn from a seed (pure).

:func:`build_fleet` turns a :class:`FleetConfig` into a :class:`Fleet`: job sizes drawn
log-uniformly from 8 ranks to ``max_ranks`` (one job of exactly ``max_ranks``), scaled so the
sizes add up to about ``ranks``; larger jobs run longer iterations (2 s at 8 ranks, 30 s at
12,960). Each job lives part or all of the day as *segments* (one per attempt of the job):

- a **restart** stops the job for 60-600 s; it comes back from its last checkpoint (every
  ``checkpoint_every`` iterations), so its iteration numbers go back and count up again
  with later timestamps (the *re-run window* runs up to the old high-water iteration);
- a **shrink** is a restart with fewer data-parallel replicas (the highest ranks never
  write again); a **node swap** a restart with one node on another host;
- jobs **start** mid-day and **end** (stop writing) before the day does; one job's name is
  used again by a later job, long after the first ended.

The first 2-4 iterations of every segment are warm-up: every rank slower, unevenly by node.
Faults (:mod:`simulator.fleet_scenarios`) are placed in segments by iteration. Nothing here
writes or reads: :mod:`simulator.fleet_run` simulates the fleet into a store.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from simulator.fleet_jobs import FaultPlan, FleetJob, Layout, Segment
from simulator.fleet_scenarios import measured_iteration_s, plan_faults

__all__ = ["FaultPlan", "Fleet", "FleetConfig", "FleetJob", "Layout", "Segment", "build_fleet"]

#: The IL-0477 layout, used for a ``max_ranks`` of 12,960.
IL_LAYOUT = (1, 9, 1440, 32)
#: Each segment must run at least this many iterations (warm-up, faults and their detection).
MIN_SEGMENT = 80
_ENV = {"jobs": "RANKSCOPE_FLEET_JOBS", "ranks": "RANKSCOPE_FLEET_RANKS", "max_ranks": "RANKSCOPE_FLEET_MAX_RANKS",
        "hours": "RANKSCOPE_FLEET_HOURS", "faults": "RANKSCOPE_FLEET_FAULTS", "seed": "RANKSCOPE_FLEET_SEED",
        "reuse_gap_s": "RANKSCOPE_FLEET_REUSE_GAP_S"}


@dataclass(frozen=True)
class FleetConfig:
    """The fleet's scale: jobs, total and largest ranks, simulated hours, faults (0: one per
    job), seed, and the idle gap before a job name is used again (at most 60% of the day)."""

    jobs: int = 60
    ranks: int = 100_000
    max_ranks: int = 12_960
    hours: float = 4.0
    faults: int = 0
    seed: int = 2030
    reuse_gap_s: float = 7200.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> FleetConfig:
        """The defaults, each overridden by its ``RANKSCOPE_FLEET_*`` variable when set."""
        kw: dict[str, float | int] = {}
        for key, name in _ENV.items():
            if env.get(name, "").strip():
                kw[key] = (float if key in ("hours", "reuse_gap_s") else int)(env[name])
        return cls(**kw)

    @property
    def seconds(self) -> float:
        return self.hours * 3600.0

    @property
    def reuse_gap(self) -> float:
        """Seconds between a job's end and the start of the later job with its name."""
        return min(self.reuse_gap_s, 0.6 * self.seconds)


@dataclass
class Fleet:
    """The day: its jobs and faults."""

    config: FleetConfig
    jobs: list[FleetJob]
    faults: list[FaultPlan]

    @property
    def ranks(self) -> int:
        return sum(j.world for j in self.jobs)

    @property
    def points(self) -> int:
        return sum(j.points for j in self.jobs)

    def lifecycle(self) -> dict[str, int]:
        """How many of each lifecycle event: late starts, restarts, shrinks, swaps, ends, reused names."""
        causes = [s.cause for j in self.jobs for s in j.segments[1:]]
        return {"start": sum(j.start_s > 0 for j in self.jobs), "restart": causes.count("restart"),
                "shrink": causes.count("shrink"), "swap": causes.count("swap"),
                "end": sum(j.ends for j in self.jobs), "reuse": sum(j.instance > 0 for j in self.jobs)}


# ------------------------------------------------------------------ sizes and layouts
def iteration_target_s(world: int) -> float:
    """The healthy iteration time a job of ``world`` ranks is given: 2 s at 8, 30 s at 12,960."""
    return 2.0 * (max(world, 8) / 8.0) ** (np.log(15.0) / np.log(1620.0))


def _sizes(rng: np.random.Generator, cfg: FleetConfig) -> np.ndarray:
    """Job sizes: log-uniform in 8..max_ranks, scaled to add up to about ``ranks``, the
    largest exactly ``max_ranks`` (at a random position)."""
    n, top = cfg.jobs, cfg.max_ranks
    u = np.exp(rng.uniform(np.log(8), np.log(top), n - 1))
    rest = max(cfg.ranks - top, 8 * (n - 1))
    lo, hi = 1e-6, 1e6
    for _ in range(100):   # bisection on the scale
        mid = np.sqrt(lo * hi)
        lo, hi = (mid, hi) if np.clip(u * mid, 8, top).sum() < rest else (lo, mid)
    sizes = np.append(np.clip(u * lo, 8, top), top)
    return sizes[rng.permutation(n)]


def _layout(rng: np.random.Generator, size: float, top: bool) -> Layout:
    """A layout of about ``size`` ranks (8 GPUs per node; world a multiple of 8)."""
    if top and round(size) == 12_960:
        return Layout(*IL_LAYOUT)
    pp = int(rng.choice((1, 2) if size <= 16 else (1, 2, 4) if size <= 128 else (2, 4, 8) if size <= 2048
                        else (4, 8)))
    tp = 2 if size >= 256 and rng.random() < 0.3 else 1
    room = max(4, int(size) // (tp * pp))
    ep = max(e for e in ((4, 8) if size < 1024 else (8, 16, 32)) if e <= room or e == 4)
    dp = ep * max(1, round(size / (tp * pp * ep)))
    while (tp * pp * dp) % 8:
        dp += ep
    return Layout(tp, pp, dp, ep)


def _model(layout: Layout) -> tuple[int, int]:
    """(microbatches, layers per stage) that give about :func:`iteration_target_s`."""
    target = iteration_target_s(layout.world)
    layers = 2 if target < 4 else 4 if target < 12 else 6
    if (layout.tp, layout.pp, layout.dp, layout.ep) == IL_LAYOUT:
        return 54, 6
    m = round((target - 1.1) / (layers * 0.066) - layout.pp + 1)
    return max(layout.pp, m, 1), layers


# ------------------------------------------------------------------ lifecycles
class _Hosts:
    """Host names of the cluster, handed out in order (a job's nodes, spares for swaps)."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> tuple[str, ...]:
        names = tuple(f"gpu-{i:05d}" for i in range(self.next, self.next + n))
        self.next += n
        return names


def _lives(rng: np.random.Generator, cfg: FleetConfig) -> tuple[list[tuple[float, float]], int, int]:
    """(start_s, end_s) of each job (end inf: to the end of the day), and the jobs whose name
    is reused: the first ends 15% into the day, the second starts the reuse gap (and 5% of the
    day) later."""
    day = cfg.seconds
    lives = []
    for _ in range(cfg.jobs):
        start = 0.0 if rng.random() < 0.75 else float(rng.uniform(0.05, 0.5)) * day
        end = start + float(rng.uniform(0.45, 0.85)) * (day - start) if rng.random() < 0.2 else float("inf")
        lives.append((start, end))
    donor, reuser = (int(x) for x in rng.choice(cfg.jobs, 2, replace=False)) if cfg.jobs > 1 else (0, 0)
    if donor != reuser:
        lives[donor] = (0.0, 0.15 * day)
        lives[reuser] = (0.2 * day + cfg.reuse_gap, float("inf"))
    return lives, donor, reuser


def _restarts(rng: np.random.Generator, job: FleetJob, day: float) -> list[tuple[float, str]]:
    """(share of the running time, cause) of each restart of ``job``, in order."""
    life = min(job.end_s, day) - job.start_s
    room = int(life / job.iteration_s) // (2 * MIN_SEGMENT) - 1
    n = min(int(rng.poisson(0.5 * life / 3600 + 0.5)), room, 4)
    if n <= 0:
        return []
    shares = np.sort(rng.uniform(0.1, 0.9, n))
    return [(float(s), str(rng.choice(("restart", "restart", "shrink", "swap")))) for s in shares]


def _segments(rng: np.random.Generator, job: FleetJob, plan: list[tuple[float, str]], day: float,
              hosts: _Hosts) -> list[Segment]:
    """The job's attempts from its restart plan: iterations by the healthy iteration time,
    rewinds to the last checkpoint, shrinks and swaps applied to the next attempt."""
    downs = [float(rng.uniform(60, 600)) for _ in plan]
    running = min(job.end_s, day) - job.start_s - sum(downs)
    cuts = [0.0, *(s * running for s, _ in plan), running]
    shortest = min(b - a for a, b in zip(cuts, cuts[1:], strict=False)) / job.iteration_s
    k_every = job.checkpoint_every = max(20, min(job.checkpoint_every, int(shortest) // 2))
    dp, names = job.layout.dp, hosts.take(job.world // job.layout.gpus_per_node)
    segs: list[Segment] = []
    first, high = 0, 0
    for k in range(len(cuts) - 1):
        cause = "start" if k == 0 else plan[k - 1][1]
        if cause == "shrink":
            smaller = job.layout.shrunk(dp)
            cause, dp = ("shrink", smaller) if smaller else ("restart", dp)
            names = names[:job.layout.tp * job.layout.pp * dp // job.layout.gpus_per_node]
        elif cause == "swap":
            node = int(rng.integers(len(names)))
            names = (*names[:node], *hosts.take(1), *names[node + 1:])
        n = max(MIN_SEGMENT, int((cuts[k + 1] - cuts[k]) / job.iteration_s))
        if k < len(cuts) - 2 and rng.random() < 0.5:   # a long rewind: room for a fault inside it
            n += max(0, min(k_every - 1, 40) - (first + n) % k_every)
        segs.append(Segment(k, cause, first, n, dp, names, downs[k - 1] if k else 0.0, high,
                            int(rng.integers(2, 5)), float(rng.uniform(1.5, 3.0))))
        high = first + n
        first = (high // k_every) * k_every
    return segs


def _ensure_kinds(rng: np.random.Generator, jobs: list[FleetJob], plans: list[list[tuple[float, str]]],
                  day: float) -> None:
    """At least one plain restart, one shrink and one swap in the day (added to the longest-lived
    jobs that have room, a shrink to one that can shrink)."""
    for cause in ("restart", "swap", "shrink"):
        if any(c == cause for p in plans for _, c in p):
            continue
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].start_s - min(jobs[i].end_s, day)) / jobs[i].iteration_s)
        for i in order:
            job = jobs[i]
            if cause == "shrink" and job.layout.shrunk(job.layout.dp) is None:
                continue
            room = int((min(job.end_s, day) - job.start_s) / job.iteration_s) // MIN_SEGMENT - 1
            if len(plans[i]) < room:
                plans[i] = sorted([*plans[i], (float(rng.uniform(0.3, 0.7)), cause)])
                break


def build_fleet(cfg: FleetConfig, iteration_s: Callable[[FleetJob], float] | None = None) -> Fleet:
    """The fleet of ``cfg`` (same config, same fleet). ``iteration_s(job) -> seconds`` measures a
    job's healthy iteration (default: one simulated iteration,
    :func:`simulator.fleet_scenarios.measured_iteration_s`)."""
    measure = iteration_s or measured_iteration_s
    rng = np.random.default_rng([cfg.seed, 30])
    sizes = _sizes(rng, cfg)
    lives, donor, reuser = _lives(rng, cfg)
    jobs = []
    for i, size in enumerate(sizes):
        layout = _layout(rng, float(size), size == cfg.max_ranks)
        m, layers = _model(layout)
        name = f"fleet-{(donor if i == reuser else i):02d}"
        job = FleetJob(i, name, int(i == reuser and donor != reuser), layout, cfg.seed * 1000 + i, m, layers, 0.0,
                       lives[i][0], lives[i][1], int(rng.integers(50, 201)), bool(i % 2 == 0))
        job.iteration_s = float(measure(job))
        target = iteration_target_s(job.world)
        if abs(job.iteration_s / target - 1) > 0.15:   # the model's estimate was off: one correction
            job.microbatches = max(layout.pp, round(m * (target - 1.1) / max(job.iteration_s - 1.1, 0.1)))
            job.iteration_s = float(measure(job))
        jobs.append(job)
    plans = [_restarts(rng, j, cfg.seconds) for j in jobs]
    _ensure_kinds(rng, jobs, plans, cfg.seconds)
    hosts = _Hosts()
    for job, plan in zip(jobs, plans, strict=True):
        job.segments = _segments(rng, job, plan, cfg.seconds, hosts)
    return Fleet(cfg, jobs, plan_faults(np.random.default_rng([cfg.seed, 31]), jobs, cfg.faults or cfg.jobs))
