"""Accuracy of the analyzer on randomized simulated scenarios with ground truth.

:func:`generate_cases` draws seeded scenarios (topology sizes, fault kind,
culprit position, factor, onset, overlapping faults, noise level, healthy
runs) as plain scenario dicts, so any case can be rebuilt from its seed and
pasted into a TOML file. :func:`run_case` simulates one in memory and feeds the
analyzer (no database); :func:`score_case` matches the incidents to the truth
and :func:`summarize` turns many scored cases into per-kind figures:
precision/recall of culprit ranks, class accuracy, detection delay and false
incidents. Used by ``benchmarks/bench_accuracy.py`` and the CI smoke test.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.config import AnalyzerConfig
from analyzer.job_analyzer import JobAnalyzer
from analyzer.read.iteration_assembler import IterationAssembler
from rankscope.frames import LatencyCube, frame_to_cube
from rankscope.incident import Incident, IncidentClass
from simulator.cluster import ClusterSimulator, IterationResult
from simulator.scenario import FAULT_KINDS, Scenario

#: A compute slowdown that comes and goes (bursts); scored as a kind of its own: one incident per fault.
INTERMITTENT = "intermittent_compute"
#: Incident class the analyzer should give each fault kind.
EXPECTED_CLASS = {
    INTERMITTENT: IncidentClass.COMPUTE_STRAGGLER,
    "compute_slowdown": IncidentClass.COMPUTE_STRAGGLER,
    "link_degradation": IncidentClass.LINK_DEGRADATION,
    "stage_imbalance": IncidentClass.PIPELINE_IMBALANCE,
    "transient_stall": IncidentClass.TRANSIENT_STALL,
    "host_stall": IncidentClass.HOST_STALL,
    "silent_rank": IncidentClass.SILENT_RANK,
}
#: The IL-0477 job's topology (12,960 ranks).
IL_TOPOLOGY = {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8}
#: Small topologies (a run takes about a second): (tp, pp, dp, ep, gpus_per_node).
SMALL_TOPOLOGIES = ((1, 2, 64, 8, 8), (1, 4, 32, 8, 8), (2, 4, 32, 8, 8), (1, 4, 128, 16, 8),
                    (2, 2, 64, 16, 4), (1, 8, 32, 4, 8), (1, 1, 128, 16, 8), (2, 8, 16, 4, 8))
#: Factor ranges per kind, drawn log-uniformly (the built-ins sit inside them).
FACTOR_RANGE = {
    "compute_slowdown": (1.3, 6.0),
    "link_degradation": (3.0, 10.0),
    "stage_imbalance": (1.3, 2.0),
    "transient_stall": (4.0, 20.0),
    "host_stall": (10.0, 50.0),
}
#: Topologies of the link-degradation set: the small ones and shapes where a node, an EP group
#: and a TP group relate differently (EP wider than a node, a node holding whole EP groups, tp>1).
LINK_TOPOLOGIES = SMALL_TOPOLOGIES + ((1, 4, 64, 16, 8), (4, 2, 32, 8, 8), (1, 3, 96, 32, 8),
                                      (2, 4, 32, 4, 4), (1, 2, 128, 32, 8))
#: Noise multipliers applied to the model's sigmas (1.0 = the calibrated model).
NOISE_LEVELS = (1.0, 1.0, 1.5, 2.0)
_SIGMAS = ("iteration_sigma", "occurrence_sigma", "transfer_sigma", "host_sigma")
BASE_SIGMAS = {"iteration_sigma": 0.03, "occurrence_sigma": 0.03, "transfer_sigma": 0.06, "host_sigma": 0.08}


@dataclass(frozen=True)
class Case:
    """One generated scenario: ``data`` is the ``Scenario.from_dict`` input (reproducible)."""

    seed: int
    data: dict[str, Any]
    noise: float = 1.0

    @property
    def kinds(self) -> list[str]:
        return [f["kind"] for f in self.data.get("fault", [])]

    @property
    def healthy(self) -> bool:
        return not self.data.get("fault")

    def scenario(self) -> Scenario:
        return Scenario.from_dict(copy.deepcopy(self.data), name=self.data["run"]["job"])


@dataclass
class Seen:
    """An incident as first reported: ``first_iteration`` is when the analyzer emitted it."""

    id: str
    cls: str
    ranks: list[int]
    stage: str | None
    onset_iteration: int
    first_iteration: int
    ambiguous: bool = False
    episodes: int = 1
    #: the job's iteration time (s) with the culprits restored, as the incident last said
    what_if_s: float = float("nan")
    #: the last iteration it was reported at
    last_iteration: int = -1


def _seen(inc: Incident, first: int, last: int) -> Seen:
    return Seen(inc.id, inc.cls, sorted(int(r) for r in inc.ranks), inc.stage, int(inc.onset_iteration),
                first, bool(inc.evidence.get("ambiguous", False)), int(inc.episodes),
                float(inc.impact.iteration_s_if_restored), last)


@dataclass
class Outcome:
    """What the analyzer reported on one case."""

    case: Case
    iterations: int
    world: int
    incidents: list[Seen] = field(default_factory=list)
    #: the job's iteration time (s, median over ranks) each iteration of the same run without its
    #: faults (a one-fault case's true what-if); empty where not simulated
    healthy_s: np.ndarray = field(default_factory=lambda: np.zeros(0))


def healthy_times(case: Case) -> np.ndarray:
    """The job's iteration time (s) each iteration of ``case`` run without its faults."""
    data = copy.deepcopy(case.data)
    data["fault"] = []
    sc = Scenario.from_dict(data, name=data["run"]["job"])
    sim = ClusterSimulator(sc)
    return np.array([float(np.median(sim.step().iteration_ms)) / 1000.0 for _ in range(sc.iterations)])


@dataclass
class FaultScore:
    """One injected fault against the incident that best matches it (``None``: missed)."""

    seed: int
    kind: str
    factor: float
    n_true: int
    n_reported: int
    n_hit: int
    detected: bool
    class_ok: bool
    delay: int | None
    world: int
    ambiguous: bool = False
    #: incidents of the expected class naming these culprits (1 for a fault found once)
    n_incidents: int = 0
    #: the incident's what-if over the true one (the run without the fault, over the same
    #: iterations) - 1; NaN where either is unknown (several faults at once: no one truth)
    what_if_error: float = float("nan")


@dataclass
class CaseScore:
    """A scored case: its faults and the incidents that match no fault."""

    case: Case
    faults: list[FaultScore]
    false_incidents: list[Seen]
    iterations: int
    world: int


@dataclass
class KindSummary:
    """Per fault kind over many cases."""

    kind: str
    faults: int
    detected: int
    rank_precision: float
    rank_recall: float
    class_accuracy: float
    delay_median: float
    delay_p95: float
    ambiguous: int = 0
    delay_worst: float = float("nan")
    #: the what-if's relative error against the run without the fault (one-fault cases)
    what_if_error_median: float = float("nan")
    what_if_error_worst: float = float("nan")
    what_ifs: int = 0
    ambiguous_ok: int = 0
    rank_precision_named: float = float("nan")
    incidents_per_fault: float = float("nan")

    @property
    def recall(self) -> float:
        return self.detected / self.faults if self.faults else float("nan")


# ------------------------------------------------------------------ generating
def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def _topology(rng: np.random.Generator, big: bool) -> dict[str, int]:
    if big:
        return dict(IL_TOPOLOGY)
    tp, pp, dp, ep, gpn = SMALL_TOPOLOGIES[int(rng.integers(len(SMALL_TOPOLOGIES)))]
    return {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "gpus_per_node": gpn}


def _fault(rng: np.random.Generator, kind: str, topo: dict[str, int], iterations: int,
           taken: set[int]) -> dict[str, Any]:
    """One fault of ``kind`` at a random position, avoiding nodes in ``taken``."""
    world = topo["tp"] * topo["pp"] * topo["dp"]
    gpn = topo["gpus_per_node"]
    nodes = world // gpn
    free = [n for n in range(nodes) if n not in taken] or list(range(nodes))
    node = int(rng.choice(free))
    taken.add(node)
    start = int(rng.integers(15, max(16, iterations - 15)))
    f: dict[str, Any] = {"kind": kind, "start": start}
    if kind == INTERMITTENT:   # bursts of a compute slowdown on one node, a few iterations apart
        length = int(rng.integers(4, 7))
        start = min(start, iterations - 3 * (2 * length + 4))
        return {"kind": "compute_slowdown", "node": node, "stage": str(rng.choice(["mlp", "attention"])),
                "factor": round(_log_uniform(rng, 2.0, 6.0), 2), "start": max(15, start),
                "end": max(15, start) + length, "every": length + int(rng.integers(4, 9)), "repeats": 3}
    if kind in FACTOR_RANGE:
        f["factor"] = round(_log_uniform(rng, *FACTOR_RANGE[kind]), 2)
    if kind == "compute_slowdown":
        shape = rng.choice(["gpu", "gpu", "node"])
        if shape == "gpu":
            f["ranks"] = str(node * gpn + int(rng.integers(gpn)))
        else:
            f["node"] = node
        stage = rng.choice(["mlp", "attention", "all"])
        if stage != "all":
            f["stage"] = str(stage)
        if rng.random() < 0.25:
            f["end"] = int(start + rng.integers(8, 15))
    elif kind == "link_degradation":
        f["node"] = node
    elif kind == "stage_imbalance":
        f["pp"] = int(rng.integers(topo["pp"]))
    elif kind == "transient_stall":
        lo = node * gpn
        f["ranks"] = f"{lo}-{lo + int(rng.integers(1, gpn + 1)) - 1}"
        f["end"] = start + int(rng.integers(1, 4))
    elif kind == "host_stall":
        f["node"] = node
        f["stage"] = "dataloader"
        f["end"] = int(start + rng.integers(6, 13))
    elif kind == "silent_rank":
        f["ranks"] = str(node * gpn + int(rng.integers(gpn)))
    return f


def generate_case(seed: int, kinds: tuple[str, ...] = FAULT_KINDS, healthy_share: float = 0.15,
                  overlap_share: float = 0.15, big: bool = False, iterations: int | None = None,
                  noise: float | None = None) -> Case:
    """One random scenario from ``seed`` (same seed, same case)."""
    rng = np.random.default_rng([seed, 4711])
    topo = _topology(rng, big)
    n_it = iterations or int(rng.integers(45, 61))
    level = float(noise if noise is not None else rng.choice(NOISE_LEVELS))
    data: dict[str, Any] = {"topology": topo, "run": {"job": f"acc-{seed}", "iterations": n_it,
                                                      "seed": int(seed)}}
    if level != 1.0:
        data["model"] = {k: round(BASE_SIGMAS[k] * level, 4) for k in _SIGMAS}
    if rng.random() < healthy_share:
        return Case(seed, data, level)
    usable = [k for k in kinds if not (k == "stage_imbalance" and topo["pp"] < 2)] or list(kinds)
    taken: set[int] = set()
    faults = [_fault(rng, str(rng.choice(usable)), topo, n_it, taken)]
    if rng.random() < overlap_share:
        second = [k for k in usable if k != "stage_imbalance"] or usable
        faults.append(_fault(rng, str(rng.choice(second)), topo, n_it, taken))
    data["fault"] = faults
    return Case(seed, data, level)


def generate_cases(seed: int, n: int, **kw: Any) -> list[Case]:
    """``n`` cases with seeds ``seed*100000 + i`` (each reproducible on its own)."""
    return [generate_case(seed * 100_000 + i, **kw) for i in range(n)]


def link_case(seed: int) -> Case:
    """A degraded NIC on a random node of one of :data:`LINK_TOPOLOGIES` (noise x1-x2)."""
    rng = np.random.default_rng([seed, 23])
    tp, pp, dp, ep, gpn = LINK_TOPOLOGIES[int(rng.integers(len(LINK_TOPOLOGIES)))]
    level = float(rng.choice(NOISE_LEVELS))
    data: dict[str, Any] = {
        "topology": {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "gpus_per_node": gpn},
        "run": {"job": f"link-{seed}", "iterations": 45, "seed": int(seed)},
        "fault": [{"kind": "link_degradation", "node": int(rng.integers(tp * pp * dp // gpn)),
                   "factor": round(_log_uniform(rng, *FACTOR_RANGE["link_degradation"]), 2),
                   "start": int(rng.integers(15, 25))}]}
    if level != 1.0:
        data["model"] = {k: round(BASE_SIGMAS[k] * level, 4) for k in _SIGMAS}
    return Case(seed, data, level)


def intermittent_case(seed: int) -> Case:
    """A compute slowdown in three bursts on one node of a random small topology."""
    rng = np.random.default_rng([seed, 31])
    topo = _topology(rng, big=False)
    data: dict[str, Any] = {"topology": topo, "run": {"job": f"flap-{seed}", "iterations": 75, "seed": int(seed)},
                            "fault": [_fault(rng, INTERMITTENT, topo, 75, set())]}
    return Case(seed, data)


def single_gpu_case(seed: int, factor: float, topology: dict[str, int] | None = None,
                    iterations: int = 40, stage: str = "mlp") -> Case:
    """One GPU's ``stage`` slowed by ``factor`` from a random onset, at a random rank."""
    rng = np.random.default_rng([seed, 99])
    topo = topology or {"tp": 1, "pp": 4, "dp": 32, "ep": 8, "gpus_per_node": 8}
    world = topo["tp"] * topo["pp"] * topo["dp"]
    start = int(rng.integers(15, iterations - 10))
    data = {"topology": dict(topo), "run": {"job": f"gpu-{seed}", "iterations": iterations, "seed": seed},
            "fault": [{"kind": "compute_slowdown", "ranks": str(int(rng.integers(world))), "stage": stage,
                       "factor": float(factor), "start": start}]}
    return Case(seed, data)


# ------------------------------------------------------------------ running
def result_cube(res: IterationResult, stages: list[str]) -> LatencyCube:
    """One simulated iteration as the analyzer's cube (silent ranks NaN), without a frame."""
    values = np.where(res.reporting[:, None], res.values, np.nan)
    it_ms = np.where(res.reporting, res.iteration_ms, np.nan)
    return LatencyCube(np.array([res.iteration]), np.array([res.time_ms]), list(stages),
                       values[None], it_ms[None])


def run_case(case: Case, config: AnalyzerConfig | None = None) -> Outcome:
    """Simulate ``case`` in memory and feed every iteration to a fresh analyzer."""
    sc = case.scenario()
    sim = ClusterSimulator(sc)
    ja = JobAnalyzer(sc.job, sc.topology, sim.stages, config)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    latest: dict[str, Incident] = {}
    for _ in range(sc.iterations):
        res = sim.step()
        out = ja.feed(result_cube(res, sim.stages.names))
        for inc in out.incidents:
            first.setdefault(inc.id, res.iteration)
            last[inc.id], latest[inc.id] = res.iteration, inc
    seen = [_seen(i, first[i.id], last[i.id]) for i in latest.values()]
    healthy = healthy_times(case) if len(sc.faults) == 1 else np.zeros(0)
    return Outcome(case, sc.iterations, sc.topology.world, seen, healthy)


#: What real collectors write, as the simulator models it: per-rank stamps up to 50 ms apart,
#: host clocks up to 2 s apart, 1% of points dropped, 0.2% of rank-iterations stalled 1.5-3x in
#: attention, MoE expert load imbalance (sigma 0.05 on mlp), per-GPU speed bias (sigma 0.03).
COLLECTOR_SHAPES = {"rank_clock_ms": 50.0, "host_clock_ms": 1000.0, "drop_rate": 0.01,
                    "stall_rate": 0.002, "expert_load_sigma": 0.05, "gpu_speed_sigma": 0.03}


def with_shapes(case: Case, shapes: dict[str, float] | None = None) -> Case:
    """The same case with the collector shapes on."""
    data = copy.deepcopy(case.data)
    data["model"] = {**data.get("model", {}), **(shapes or COLLECTOR_SHAPES)}
    return Case(case.seed, data, case.noise)


def run_case_written(case: Case, config: AnalyzerConfig | None = None) -> Outcome:
    """Like :func:`run_case`, but through the points as a collector writes them (each rank's
    own stamp, skewed hosts, dropped points) and the cycle's assembly of whole iterations: a
    reader sees the points stamped up to each iteration's time, the wall clock moving with
    the data; no database."""
    sc = case.scenario()
    sim = ClusterSimulator(sc)
    cfg = config or AnalyzerConfig()
    ja = JobAnalyzer(sc.job, sc.topology, sim.stages, cfg)
    asm = IterationAssembler(int(cfg.iteration_wait_s * 1000))
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    latest: dict[str, Incident] = {}
    held = pd.DataFrame()

    def feed(ready: pd.DataFrame, at: int) -> None:
        if not len(ready):
            return
        out = ja.feed(frame_to_cube(ready, sc.topology.world, sim.stages.names))
        for inc in out.incidents:
            first.setdefault(inc.id, at)
            last[inc.id], latest[inc.id] = at, inc

    for _ in range(sc.iterations):
        res = sim.step()
        held = pd.concat([held, sim.frame(res)], ignore_index=True)
        seen = held["time"].to_numpy() <= res.time_ms   # what a reader finds by this time
        asm.add(held.loc[seen])
        held = held.loc[~seen]
        feed(asm.ready(ja.reporting_ranks or None, now_ms=res.time_ms), res.iteration)
    asm.add(held)
    feed(asm.ready(ja.reporting_ranks or None, final=True), sc.iterations)
    seen_incidents = [_seen(i, first[i.id], last[i.id]) for i in latest.values()]
    healthy = healthy_times(case) if len(sc.faults) == 1 else np.zeros(0)
    return Outcome(case, sc.iterations, sc.topology.world, seen_incidents, healthy)


# ------------------------------------------------------------------ scoring
def _truth(case: Case) -> list[dict[str, Any]]:
    """The faults and their culprits: the GPUs slowed (with tp > 1 too: the TP group waits for
    the slow member in its all-reduces, ``tp_comm``, which names it)."""
    sc = case.scenario()
    out = []
    for f in sc.faults:
        d = f.to_dict(sc.topology)
        if f.repeats > 1:
            d["kind"] = INTERMITTENT
        out.append(d)
    return out


def score_case(out: Outcome) -> CaseScore:
    """Match each fault to the incident sharing most culprit ranks with it (reported after its start)."""
    truth = _truth(out.case)
    used: set[str] = set()
    scores: list[FaultScore] = []
    for f in truth:
        true = np.asarray(f["ranks"], dtype=np.int64)
        best, best_hit = None, 0
        for inc in out.incidents:
            if inc.first_iteration < f["start"]:
                continue
            hit = int(np.isin(np.asarray(inc.ranks, dtype=np.int64), true).sum())
            if hit > best_hit:
                best, best_hit = inc, hit
        if best is not None:
            used.add(best.id)
        want = EXPECTED_CLASS[f["kind"]]
        naming = [i for i in out.incidents if i.cls == want and i.first_iteration >= f["start"]
                  and np.isin(np.asarray(i.ranks, dtype=np.int64), true).any()]
        scores.append(FaultScore(
            seed=out.case.seed, kind=f["kind"], factor=float(f["factor"]), n_true=len(true),
            n_reported=len(best.ranks) if best else 0, n_hit=best_hit, detected=best is not None,
            class_ok=best is not None and best.cls == want,
            delay=(best.first_iteration - f["start"]) if best else None, world=out.world,
            ambiguous=bool(best is not None and best.ambiguous), n_incidents=len(naming),
            what_if_error=_what_if_error(best, f, out.healthy_s)))
        if f["kind"] == INTERMITTENT:   # its later episodes are the same incident, or more of them
            used.update(i.id for i in naming)
    false = [i for i in out.incidents if i.id not in used]
    return CaseScore(out.case, scores, false, out.iterations, out.world)


def _what_if_error(inc: Seen | None, fault: dict[str, Any], healthy_s: np.ndarray) -> float:
    """The incident's what-if against the run without the fault over the iterations from the
    onset to its last report (the fault's end at most): relative error, NaN where unknown."""
    if inc is None or not len(healthy_s) or not inc.what_if_s == inc.what_if_s:
        return float("nan")
    lo = max(int(fault["start"]), 0)
    end = fault.get("end")
    hi = min(inc.last_iteration + 1, len(healthy_s), int(end) if end is not None and end >= 0 else len(healthy_s))
    if hi <= lo:
        return float("nan")
    truth = float(np.median(healthy_s[lo:hi]))
    return inc.what_if_s / truth - 1.0 if truth > 0 else float("nan")


def _ratio(num: float, den: float) -> float:
    return num / den if den else float("nan")


def summarize(scores: list[CaseScore]) -> list[KindSummary]:
    """Per-kind figures (rank precision/recall micro-averaged over the detected faults' ranks)."""
    out = []
    faults = [f for s in scores for f in s.faults]
    for kind in (*FAULT_KINDS, INTERMITTENT):
        fs = [f for f in faults if f.kind == kind]
        if not fs:
            continue
        det = [f for f in fs if f.detected]
        named = [f for f in det if not f.ambiguous]
        delays = np.array([f.delay for f in det], dtype=float)
        errors = np.array([f.what_if_error for f in det if f.what_if_error == f.what_if_error])
        out.append(KindSummary(
            kind=kind, faults=len(fs), detected=len(det),
            rank_precision=_ratio(sum(f.n_hit for f in det), sum(f.n_reported for f in det)),
            rank_recall=_ratio(sum(f.n_hit for f in fs), sum(f.n_true for f in fs)),
            class_accuracy=_ratio(sum(f.class_ok for f in det), len(det)),
            delay_median=float(np.median(delays)) if len(delays) else float("nan"),
            delay_p95=float(np.percentile(delays, 95)) if len(delays) else float("nan"),
            ambiguous=len(det) - len(named),
            ambiguous_ok=sum(f.ambiguous and f.n_hit == f.n_true for f in det),
            rank_precision_named=_ratio(sum(f.n_hit for f in named), sum(f.n_reported for f in named)),
            incidents_per_fault=_ratio(sum(f.n_incidents for f in det), len(det)),
            delay_worst=float(delays.max()) if len(delays) else float("nan"),
            what_if_error_median=float(np.median(np.abs(errors))) if len(errors) else float("nan"),
            what_if_error_worst=float(errors[np.argmax(np.abs(errors))]) if len(errors) else float("nan"),
            what_ifs=len(errors)))
    return out


def false_incidents_per_1000(scores: list[CaseScore], healthy_only: bool = True) -> tuple[int, int, float]:
    """(false incidents, iterations, per 1,000 iterations) over the (healthy) cases."""
    sel = [s for s in scores if s.case.healthy or not healthy_only]
    n_false = sum(len(s.false_incidents) for s in sel)
    n_it = sum(s.iterations for s in sel)
    return n_false, n_it, 1000.0 * _ratio(n_false, n_it)


def smallest_factor_at_recall(factor_recall: dict[float, float], target: float = 0.95) -> float | None:
    """The smallest factor whose recall, and that of every larger factor measured, reaches ``target``."""
    ok = None
    for factor in sorted(factor_recall, reverse=True):
        if factor_recall[factor] < target:
            break
        ok = factor
    return ok


# ------------------------------------------------------------------ shaped runs through a store
#: Start of the shaped runs' data (any fixed time).
SHAPED_T0_MS = 1_770_000_000_000
SHAPED_TOPOLOGY_4608 = {"tp": 1, "pp": 4, "dp": 1152, "ep": 16, "gpus_per_node": 8}
#: Collector-shaped runs through a store that the test suite leaves to this suite: the tests
#: (tests/test_collector_shapes.py) keep one run at full scale (12,960 ranks) per backend;
#: these re-measure the same checks at 4,608 ranks, on the embedded store and the real InfluxDB.
#: (label, faults, expected incidents as (class, ranks)), 50 iterations, seed 7.
SHAPED_STORE_RUNS = (
    ("healthy", [], []),
    ("one-node straggler", [{"kind": "compute_slowdown", "node": 301, "stage": "mlp", "factor": 3.0,
                             "start": 25}], [("compute_straggler", list(range(301 * 8, 302 * 8)))]),
    ("silent rank", [{"kind": "silent_rank", "ranks": 3000, "start": 30}], [("silent_rank", [3000])]),
)


def shaped_store_run(store, topology: dict[str, int], faults: list[dict], iterations: int = 50,
                     seed: int = 7, job: str = "shaped") -> tuple[Scenario, list[dict]]:
    """Simulate a job with the collector shapes on into ``store`` (the points as real
    collectors write them) and run one analyzer cycle over it: (scenario, incidents)."""
    from analyzer.service.run_once import run_once
    from simulator.simulate import simulate

    sc = Scenario.from_dict({"topology": topology, "run": {"job": job, "iterations": iterations, "seed": seed},
                             "model": dict(COLLECTOR_SHAPES), "fault": faults})
    simulate(sc, store, start_ms=SHAPED_T0_MS, progress=False)
    return sc, run_once(store, job)


def shaped_health_holds(health: pd.DataFrame) -> bool:
    """The last ``job_health`` point of a shaped run counts what the shapes did: 1% of points
    dropped (completeness 0.985-0.995), the sporadic stalls seen (over 50) as noise."""
    last = health.iloc[-1]
    return bool(0.985 < last["completeness"] < 0.995 and last["sporadic_stalls"] > 50
                and "noise, no incident" in last["sporadic_text"])
