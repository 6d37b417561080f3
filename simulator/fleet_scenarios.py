"""A cluster day's faults, and each attempt of a job as a scenario the simulator runs (pure).

:func:`plan_faults` places faults in the jobs' segments by iteration: a fifth inside re-run
windows (they begin and end before the old high-water iteration), a quarter right after a
restart's warm-up, the rest anywhere after a segment's first 20 iterations; at most one at a
time in a segment, 25 iterations apart; spread over the jobs in turn. "After the warm-up" is
after the longer of the attempt's own warm-up and the analyzer's (:data:`ANALYZER_WARMUP`: the
iterations after a restart it does not analyze, by design). A job on one node gets no fault of
a whole node (no other node to compare it with; a NIC fault there slows nothing), and no fault
slows more than half of its job's ranks (the analyzer names culprits against their peers: a
fault on most of a job is the job's own step, which it reports as an L1 changepoint only). A compute slowdown or
link fault in the segment before a node swap is put on the node the swap replaces and lasts
until the restart. :func:`segment_scenario` builds one attempt: its topology and hosts, its
warm-up (every rank slower by up to ``warmup_factor``, unevenly by node, and a cold data
loader in its first iteration) and its faults; :func:`segment_simulator` runs it with every
GPU's speed bias belonging to the GPU (:func:`gpu_speed`: drawn from the fleet's seed and the
host's name), so a host keeps its GPUs' speeds over a job's attempts and only a swapped-in
host brings new ones.

Transient stalls are sized by the analyzer's rule (docs/analyzer.md): a sporadic stall that
costs its job less than ``stall_min_excess`` of an iteration is job_health noise, not an
incident. Each one planned here costs at least :data:`STALL_MARGIN` times that
(:func:`stall_factor_floor`); :func:`lost_iterations` measures what one cost as written.
"""

from __future__ import annotations

import zlib

import numpy as np

from rankscope.topology import Topology
from simulator.cluster import ClusterSimulator
from simulator.faults import Fault
from simulator.fleet_jobs import FaultPlan, FleetJob, Segment
from simulator.model_params import ModelParams
from simulator.scenario import Scenario

#: Factor ranges per fault kind (log-uniform): well inside what the analyzer finds on a
#: job without restarts (the accuracy suite), so a miss here is the lifecycle's doing.
FACTORS = {"compute_slowdown": (2.0, 5.0), "link_degradation": (4.0, 10.0), "stage_imbalance": (1.5, 2.0),
           "host_stall": (15.0, 50.0), "transient_stall": (8.0, 20.0), "silent_rank": (1.0, 1.0)}
#: How many iterations each kind lasts (low, high exclusive).
DURATIONS = {"compute_slowdown": (15, 61), "link_degradation": (15, 61), "stage_imbalance": (20, 61),
             "host_stall": (6, 13), "transient_stall": (2, 4), "silent_rank": (12, 31)}
#: Iterations between two faults of one segment.
GAP = 25
#: Warm-up slowness of a node relative to the job's warm-up factor, and how often each is drawn.
WARMUP_LEVELS = (1.0, 1.1, 1.25, 1.5)
WARMUP_WEIGHTS = (0.55, 0.25, 0.15, 0.05)
_COMPUTE_STAGES = ("mlp", "attention", None)
#: Iterations after a restart the analyzer leaves out (``AnalyzerConfig.restart_warmup``'s
#: default; tests/test_simulator_fleet.py checks they agree): a fault that begins and ends in
#: them is warm-up by the analyzer's contract, so faults "right after a restart" begin after.
ANALYZER_WARMUP = 5
#: Kinds that slow a whole node: none in a job of one node.
NODE_KINDS = ("host_stall", "link_degradation")
#: A transient stall costing its job less than this many iterations' worth of time is
#: job_health noise to the analyzer, not an incident (``AnalyzerConfig.stall_min_excess``'s
#: default; tests/test_simulator_fleet.py checks they agree).
STALL_MIN_EXCESS = 0.5
#: The benchmark's transient stalls are sized to cost at least this multiple of
#: :data:`STALL_MIN_EXCESS` (iteration noise and the level around a stall take some of it).
STALL_MARGIN = 2.0
#: The stream of the fleet's seed each host's GPU speeds are drawn from (with the host's name).
_GPU_STREAM = 32


def measured_iteration_s(job: FleetJob) -> float:
    """A job's healthy iteration time (s): the mean of its first three simulated iterations."""
    sc = Scenario(topology=job.layout.topology(), job=job.name, iterations=3, seed=job.seed, model=job.model)
    sim = ClusterSimulator(sc)
    return float(np.mean([sim.step().job_iteration_ms for _ in range(3)])) / 1000.0


def stall_factor_floor(job: FleetJob, iterations: int) -> float:
    """The smallest attention factor of a transient stall lasting ``iterations`` that costs
    ``job`` :data:`STALL_MARGIN` x :data:`STALL_MIN_EXCESS` of an iteration: the stalled rank's
    attention (microbatches x layers x ``attention_ms``) is on the job's critical path (its
    pipeline stage sets the 1F1B period, every rank waits in the DP reduce), over the
    ``stall_factor_max`` of the job's own sporadic stalls that may already set the level."""
    p = ModelParams.from_dict(job.model)
    attention_ms = job.microbatches * job.layers * p.attention_ms
    need_ms = STALL_MARGIN * STALL_MIN_EXCESS * job.iteration_s * 1000.0 / max(iterations, 1)
    return p.stall_factor_max + need_ms / attention_ms


def lost_iterations(times_ms, start: int, end: int) -> float:
    """Iterations' worth of time a job lost over its iterations ``start <= i < end`` (indices
    into ``times_ms``, the stamps of a segment's iterations): each one's time over the level
    around them (the higher of the median of the 3 before and the first after), as a share of
    that level, summed: what the analyzer charges a stall (``stall_min_excess``)."""
    dt = np.diff(np.asarray(times_ms, dtype=float))   # dt[i - 1]: iteration i's time
    before = dt[max(0, start - 4):max(0, start - 1)]
    after = dt[end - 1:end]
    level = max(float(np.median(before)) if len(before) else 0.0, float(after[0]) if len(after) else 0.0)
    if level <= 0 or start < 1:
        return float("nan")
    return float(np.clip(dt[start - 1:end - 1] - level, 0, None).sum() / level)


def gpu_speed(seed: int, topo: Topology, sigma: float) -> np.ndarray:
    """Every rank's GPU speed bias (the simulator's ``gpu_speed``), a property of the GPU: each
    host's GPUs are drawn from the fleet's ``seed`` and the host's name (lognormal ``sigma``,
    clipped to +-3 sigma, as :class:`~simulator.cluster.ClusterSimulator` draws them), and a
    rank gets the one of its node's host at its local index."""
    if topo.hosts is None:
        raise ValueError("GPU speeds belong to hosts: the topology names none")
    z = np.stack([np.random.default_rng([seed, _GPU_STREAM, zlib.crc32(h.encode())]).standard_normal(
        topo.gpus_per_node) for h in topo.hosts])
    return np.exp(np.clip(z, -3, 3)[topo.node_index, topo.local_index] * sigma)


def plan_faults(rng: np.random.Generator, jobs: list[FleetJob], n: int) -> list[FaultPlan]:
    """``n`` faults over ``jobs`` (fewer when the segments have no room left)."""
    n_rerun, n_after = max(1, round(0.2 * n)), max(1, round(0.25 * n))
    wanted = ["rerun_window"] * n_rerun + ["after_restart"] * n_after + ["normal"] * max(0, n - n_rerun - n_after)
    order = [int(j) for j in rng.permutation(len(jobs))]
    taken: dict[tuple[int, int], list[tuple[int, int]]] = {}
    out: list[FaultPlan] = []
    turn = 0
    for placement in wanted[:n]:
        for tries in range(4 * len(jobs)):
            j = order[(turn + tries) % len(jobs)]
            plan = _place(rng, jobs[j], placement if tries < 3 * len(jobs) else "normal", taken)
            if plan is not None:
                out.append(plan)
                turn = (turn + tries + 1) % len(jobs)
                break
    return out


def warmed(seg: Segment) -> int:
    """The iterations of ``seg`` that are warm-up: its own, or the analyzer's when longer."""
    return max(seg.warmup, ANALYZER_WARMUP)


def _window(rng: np.random.Generator, seg: Segment, placement: str, kind: str, to_end: bool) -> tuple[int, int] | None:
    """(start, end) of a fault of ``kind`` in ``seg``, or None when it does not fit."""
    lo_d, hi_d = DURATIONS[kind]
    dur = int(rng.integers(lo_d, hi_d))
    if placement == "normal":
        lo, hi = max(25, seg.warmup + 20), seg.iterations - dur - (0 if to_end else 5)
        lo = hi if to_end else lo   # to the restart: it ends with the segment
    elif placement == "after_restart":
        lo = warmed(seg) + 1
        hi = min(lo + 4, seg.iterations - dur - 5)
    else:
        limit = min(seg.rerun, seg.iterations - 5)
        lo = warmed(seg) + 1
        dur = min(dur, limit - lo)
        hi = limit - dur
        if dur < lo_d:
            return None
    if (seg.attempt == 0 and placement != "normal") or hi < lo or lo < 1:
        return None
    start = int(rng.integers(lo, hi + 1))
    return start, start + dur


def _swapped_node(job: FleetJob, k: int) -> int | None:
    """The node whose host the restart after segment ``k`` replaces (None: no swap there)."""
    if k + 1 >= len(job.segments) or job.segments[k + 1].cause != "swap":
        return None
    a, b = job.segments[k].hosts, job.segments[k + 1].hosts
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def _place(rng: np.random.Generator, job: FleetJob, placement: str,
           taken: dict[tuple[int, int], list[tuple[int, int]]]) -> FaultPlan | None:
    """One fault of ``placement`` in a random fitting segment of ``job``, or None."""
    k = int(rng.integers(len(job.segments)))
    seg = job.segments[k]
    one_node = job.layout.topology(seg.dp).nodes == 1
    kinds = [x for x in FACTORS if (x != "stage_imbalance" or job.layout.pp > 1) and not (one_node and x in NODE_KINDS)]
    kind = kinds[int(rng.integers(len(kinds)))]
    swapped = _swapped_node(job, k) if placement == "normal" and kind in ("compute_slowdown", "link_degradation") \
        and not taken.get((job.index, k)) else None
    window = _window(rng, seg, placement, kind, to_end=swapped is not None)
    if window is None:
        return None
    start, end = window
    busy = taken.setdefault((job.index, k), [])
    if any(start < e + GAP and s < end + GAP for s, e in busy):
        return None
    busy.append((start, end))
    ranks, stage = _culprits(rng, kind, job.layout.topology(seg.dp), swapped)
    lo, hi = FACTORS[kind]
    if kind == "transient_stall":   # it must cost the job what the analyzer calls an incident
        lo = max(lo, stall_factor_floor(job, end - start))
        hi = max(hi, 1.5 * lo)
    factor = round(float(np.exp(rng.uniform(np.log(lo), np.log(hi)))), 2)
    return FaultPlan(job.index, k, kind, stage, factor, tuple(int(r) for r in ranks), start, end, placement)


def _culprits(rng: np.random.Generator, kind: str, topo: Topology, node: int | None) -> tuple[np.ndarray, str | None]:
    """The ranks a fault of ``kind`` slows (on ``node``, or a random one) and its stage."""
    if kind == "stage_imbalance":
        return np.flatnonzero(topo.pp_index == int(rng.integers(topo.pp))), None
    on = topo.node_ranks([int(rng.integers(topo.nodes)) if node is None else node])
    one = on[int(rng.integers(len(on)))]
    most = min(len(on), topo.world // 2)   # a fault slows at most half of its job's ranks
    if kind == "compute_slowdown":
        return (on if len(on) <= most and rng.random() < 0.5 else np.array([one])), _COMPUTE_STAGES[int(rng.integers(3))]
    if kind == "transient_stall":
        return on[:int(rng.integers(1, most + 1))], "attention"
    if kind == "silent_rank":
        return np.array([one]), None
    return on, ("dataloader" if kind == "host_stall" else None)


def warmup_faults(job: FleetJob, seg: Segment, topo: Topology) -> list[Fault]:
    """The warm-up of an attempt: every rank's compute slower by a factor that falls from
    ``warmup_factor`` to about 1 over ``warmup`` iterations, by node up to 1.5x more in the
    first two; every data loader 2-4x slower in the first iteration."""
    rng = np.random.default_rng([job.seed, 77, seg.attempt])
    level = rng.choice(len(WARMUP_LEVELS), topo.nodes, p=WARMUP_WEIGHTS)
    out = [Fault("host_stall", topo.ranks, "dataloader", float(rng.uniform(2.0, 4.0)), 0, 1)]
    for i in range(seg.warmup):
        w = 1.0 + (seg.warmup_factor - 1.0) * (1.0 - i / seg.warmup)
        for li in np.unique(level):
            ranks = topo.node_ranks(np.flatnonzero(level == li))
            out.append(Fault("compute_slowdown", ranks, None, w * (WARMUP_LEVELS[li] if i < 2 else 1.0), i, i + 1))
    return out


def segment_scenario(job: FleetJob, k: int, faults: list[FaultPlan]) -> Scenario:
    """Attempt ``k`` of ``job`` as a scenario: its iterations count from 0 (the writer adds
    the segment's first iteration), its own seed, warm-up and the faults planned in it."""
    seg = job.segments[k]
    topo = job.layout.topology(seg.dp, seg.hosts)
    mine = [Fault(p.kind, np.asarray(p.ranks, dtype=np.int64), p.stage, p.factor, p.start, p.end)
            for p in faults if p.job == job.index and p.segment == k]
    return Scenario(topology=topo, job=job.name, iterations=seg.iterations, seed=job.seed * 8 + k,
                    faults=[*warmup_faults(job, seg, topo), *mine], name=f"{job.name}.{job.instance}.{seg.attempt}",
                    model=job.model)


def segment_simulator(job: FleetJob, k: int, faults: list[FaultPlan], seed: int, start_ms: int = 0) -> ClusterSimulator:
    """Attempt ``k`` of ``job`` (:func:`segment_scenario`) as a simulator from ``start_ms``, its
    GPUs' speed biases those of its hosts (:func:`gpu_speed` from the fleet's ``seed``), not
    the attempt's own draw: a host keeps them over the job's attempts."""
    sim = ClusterSimulator(segment_scenario(job, k, faults), start_ms=start_ms)
    sim.gpu_speed = gpu_speed(seed, sim.topology, sim.params.gpu_speed_sigma)
    return sim
