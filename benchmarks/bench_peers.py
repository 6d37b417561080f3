"""Side by side with what users would pick instead, on the same simulated data, in one run.

1. L1 change points: our vectorised StepDetector vs ruptures (PELT, Binseg,
   Window) and river (ADWIN, PageHinkley; river has no CUSUM detector):
   precision/recall with a 2-iteration margin, detection delay, false alarms,
   and time for all 12,960 rank series of a 300-iteration IL-0477 run.
2. L2 culprits: the analyzer vs nvidia-resiliency-ext's straggler scores
   (relative and individual section scores, threshold 0.75), fed the same
   per-rank section medians.
3. HTA's ``get_potential_stragglers`` vs our trace import + analyzer on the
   same synthetic Kineto traces.
"""

from __future__ import annotations

import collections
import gzip
import importlib.metadata as md
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.detect.l1 import L1Monitor
from analyzer.detect.step import StepDetector
from analyzer.job_analyzer import JobAnalyzer
from evaluation.accuracy import BASE_SIGMAS, Case, result_cube
from rankscope.schema import DEFAULT_STAGES
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario, load_scenario

MARGIN = 2
CP_RUNS = 40
CP_ITERATIONS = 300
CP_TOPOLOGY = {"tp": 1, "pp": 4, "dp": 32, "ep": 8, "gpus_per_node": 8}
DELAY_HORIZON = 30
TIMING_SUBSET = {"PELT": 2, "Binseg": 20, "Window": 20, "ADWIN": 300, "PageHinkley": 300}
PELT_LENGTHS = (300, 600, 1000)
#: The variant of ours whose rolling median/MAD is recomputed every REFRESH updates (1: every update).
REFRESH = 1


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


# ------------------------------------------------------------------ change-point data
@dataclass
class SeriesSet:
    """``x[time, k]`` iteration-time series and the true change points of each."""

    x: np.ndarray
    truth: list[list[int]]


def _cp_runs(seed: int = 31) -> SeriesSet:
    """Random runs of a 128-rank job: half healthy, half with a slowdown (a third of those recover)."""
    rng = np.random.default_rng(seed)
    cols, truth = [], []
    for i in range(CP_RUNS):
        noise = float(rng.choice([1.0, 2.0]))
        data = {"topology": CP_TOPOLOGY, "run": {"job": f"cp-{i}", "iterations": CP_ITERATIONS, "seed": 700 + i}}
        if noise != 1.0:
            data["model"] = {k: v * noise for k, v in BASE_SIGMAS.items()}
        cps: list[int] = []
        if i % 2:
            start = int(rng.integers(40, 220))
            f = {"kind": "compute_slowdown", "node": int(rng.integers(16)), "start": start,
                 "factor": round(float(np.exp(rng.uniform(np.log(1.5), np.log(6.0)))), 2)}
            cps = [start]
            if i % 3 == 0:
                f["end"] = start + int(rng.integers(20, 60))
                cps.append(f["end"])
            data["fault"] = [f]
        sim = ClusterSimulator(Scenario.from_dict(data))
        it = np.array([sim.step().iteration_ms for _ in range(CP_ITERATIONS)])
        series = np.hstack([np.median(it, axis=1)[:, None], np.unique(it, axis=1)])
        cols.append(series)
        truth += [list(cps)] * series.shape[1]
    return SeriesSet(np.hstack(cols), truth)


def _il_series() -> tuple[np.ndarray, int]:
    """All 12,960 rank series of IL-0477 over 300 iterations, the step at 150."""
    sc = load_scenario("il-0477")
    data = {"topology": sc.topology.to_dict(), "run": {"job": "il", "iterations": CP_ITERATIONS, "seed": 7},
            "fault": [{"kind": "compute_slowdown", "ranks": "10352-10359", "stage": "mlp", "factor": 5.7,
                       "start": 150}]}
    data["topology"].pop("order", None)
    sim = ClusterSimulator(Scenario.from_dict(data))
    return np.array([sim.step().iteration_ms for _ in range(CP_ITERATIONS)]), 150


# ------------------------------------------------------------------ detectors
#: A detector maps one series to (locations, alarm times) of its change points.
Detect = Callable[[np.ndarray], tuple[list[int], list[int]]]


def _sigma(y: np.ndarray) -> float:
    """Robust noise sigma of a log series from its first differences (what an offline user would do)."""
    return max(float(np.median(np.abs(np.diff(y)))) / 0.6745 / np.sqrt(2), 1e-4)


def _ruptures(kind: str) -> Detect:
    import ruptures as rpt

    def detect(x: np.ndarray) -> tuple[list[int], list[int]]:
        y = np.log(x)
        pen = 2 * _sigma(y) ** 2 * np.log(len(y))  # BIC-style penalty for a mean shift of known variance
        algo = {"PELT": lambda: rpt.Pelt(model="l2", min_size=2, jump=1),
                "Binseg": lambda: rpt.Binseg(model="l2", min_size=2, jump=1),
                "Window": lambda: rpt.Window(width=20, model="l2", min_size=2, jump=1)}[kind]()
        bkps = [int(b) for b in algo.fit(y.reshape(-1, 1)).predict(pen=pen)[:-1]]
        return bkps, [len(y) - 1] * len(bkps)  # offline: known only once the series is complete

    return detect


def _river(kind: str) -> Detect:
    from river import drift

    def detect(x: np.ndarray) -> tuple[list[int], list[int]]:
        y = np.log(x)
        z = (y - np.median(y[:20])) / _sigma(y[:20])  # standardised with the first 20 values
        d = drift.ADWIN() if kind == "ADWIN" else drift.PageHinkley()
        hits = []
        for i, v in enumerate(z):
            d.update(float(v))
            if d.drift_detected:
                hits.append(i)
        return hits, hits

    return detect


def _step_detector(n: int, refresh: int | None = None) -> StepDetector:
    """The analyzer's rank-level L1 step detector, exactly as ``L1Monitor`` builds it.

    ``refresh`` overrides how often its rolling median/MAD is recomputed (``L1Monitor``
    refreshes the rank-level reference every few updates; 1 = every update)."""
    det = L1Monitor("bench", n, AnalyzerConfig()).rank_step
    if refresh is not None:
        det.ref.refresh_every = refresh
    return det


def _ours_all(x: np.ndarray, refresh: int | None = None) -> tuple[list[list[int]], list[list[int]]]:
    """Our L1 step detector over every series at once: (onsets, alarm times) per series."""
    det = _step_detector(x.shape[1], refresh)
    locs: list[list[int]] = [[] for _ in range(x.shape[1])]
    times: list[list[int]] = [[] for _ in range(x.shape[1])]
    for i in range(x.shape[0]):
        u = det.update(x[i])
        for k in np.flatnonzero(u.confirmed):
            locs[k].append(int(u.onset_index[k]))
            times[k].append(i)
        for k in np.flatnonzero(u.recovered):
            locs[k].append(int(u.recovered_index[k]))
            times[k].append(i)
    return locs, times


def _ours_timed(x: np.ndarray, refresh: int | None = None) -> int:
    det = _step_detector(x.shape[1], refresh)
    n = 0
    for i in range(x.shape[0]):
        n += int(det.update(x[i]).confirmed.sum())
    return n


@dataclass
class CPScore:
    """Change-point figures of one method on a :class:`SeriesSet`."""

    tp: int
    fp: int
    fn: int
    delays: list[int]
    false_on_healthy: int
    healthy_iterations: int

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else float("nan")

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else float("nan")

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


def _score(locs: list[list[int]], times: list[list[int]], data: SeriesSet) -> CPScore:
    tp = fp = fn = 0
    delays: list[int] = []
    false_h = healthy_it = 0
    for loc, tim, truth in zip(locs, times, data.truth, strict=True):
        unmatched = list(range(len(loc)))
        for t in truth:
            near = [j for j in unmatched if abs(loc[j] - t) <= MARGIN]
            if near:
                tp += 1
                unmatched.remove(min(near, key=lambda j: abs(loc[j] - t)))
            else:
                fn += 1
            after = [tm - t for tm in tim if 0 <= tm - t < DELAY_HORIZON]
            if after:
                delays.append(min(after))
        fp += len(unmatched)
        if not truth:
            false_h += len(loc)
            healthy_it += data.x.shape[0]
    return CPScore(tp, fp, fn, delays, false_h, healthy_it)


def _fmt(x: float, nd: int = 2) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{nd}f}"


def _x(num: float, den: float) -> str:
    """A ratio as text: n/a when undefined, inf when the denominator is 0."""
    if not np.isfinite(num) or not np.isfinite(den):
        return "n/a"
    if den == 0:
        return "inf" if num > 0 else "n/a"
    r = num / den
    return f"{r:,.0f}x" if r >= 10 else f"{r:.2f}x"


def _time_str(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.2f} s" if s >= 1 else f"{s * 1000:.0f} ms"


def _changepoints(ctx, summary: list[str]) -> list[str]:
    data = _cp_runs()
    il, il_at = _il_series()
    n_all = il.shape[1]
    peers: dict[str, tuple[str, Detect]] = {
        "PELT": (f"ruptures {_version('ruptures')}", _ruptures("PELT")),
        "Binseg": (f"ruptures {_version('ruptures')}", _ruptures("Binseg")),
        "Window": (f"ruptures {_version('ruptures')}", _ruptures("Window")),
        "ADWIN": (f"river {_version('river')}", _river("ADWIN")),
        "PageHinkley": (f"river {_version('river')}", _river("PageHinkley")),
    }
    scores: dict[str, CPScore] = {}
    locs, times = _ours_all(data.x)
    scores["ours"] = _score(locs, times, data)
    locs, times = _ours_all(data.x, REFRESH)
    scores["ours-exact"] = _score(locs, times, data)
    for name, (_, fn) in peers.items():
        cols = range(data.x.shape[1]) if name != "PELT" else range(0, data.x.shape[1], 7)
        res = [fn(data.x[:, k]) for k in cols]
        sub = SeriesSet(data.x[:, list(cols)], [data.truth[k] for k in cols])
        scores[name] = _score([r[0] for r in res], [r[1] for r in res], sub)

    # time: ours over all 12,960 series at once; peers per series on a subset, extrapolated
    timing: dict[str, float] = {}
    subset = {name: il[:, :TIMING_SUBSET[name]] for name in peers}
    funcs: dict[str, Callable[[], object]] = {"ours": lambda: _ours_timed(il),
                                              "ours-exact": lambda: _ours_timed(il, REFRESH)}
    for name, (_, fn) in peers.items():
        funcs[name] = (lambda f=fn, s=subset[name]: [f(s[:, k]) for k in range(s.shape[1])])
    measured = ctx.side_by_side(funcs, repeat=3)
    for name, sec in measured.items():
        timing[name] = sec if name.startswith("ours") else sec / TIMING_SUBSET[name] * n_all
    il_hits = _ours_timed(il)

    # where PELT gives up: one series of growing length
    pelt_len = {}
    for n in PELT_LENGTHS:
        x = np.tile(il[:, 0], n // CP_ITERATIONS + 1)[:n]
        t0 = time.perf_counter()
        peers["PELT"][1](x)
        pelt_len[n] = time.perf_counter() - t0

    n_series = data.x.shape[1]
    n_changes = sum(len(t) for t in data.truth)
    best = max((n for n in peers), key=lambda n: np.nan_to_num(scores[n].f1, nan=-1.0))
    fastest = min((n for n in peers), key=lambda n: timing[n])
    c = AnalyzerConfig()
    lines = [
        "### L1 change points: StepDetector vs ruptures and river",
        "",
        f"Accuracy data: {CP_RUNS} simulated runs of a 128-rank job x {CP_ITERATIONS} iterations (noise x1 or "
        f"x2), half healthy, half with a node slowed x1.5-x6 from a random onset (a third recover): "
        f"{n_series} series (job median + the distinct rank series), {n_changes} true change points. "
        f"A change point counts when located within +-{MARGIN} iterations; delay = first alarm at or after "
        f"the change (within {DELAY_HORIZON}); false alarms are alarms on healthy series. Every method gets "
        "log iteration time; ruptures a BIC-style penalty 2 sigma^2 ln n (sigma from the MAD of first "
        "differences), river the series standardised by the median/sigma of its first 20 values, defaults "
        "otherwise. "
        f"Ours: the analyzer's L1 settings (`AnalyzerConfig`: z={c.l1_threshold:g}, min_change={c.l1_min_change:g}, persist={c.l1_persist}). PELT is scored on every 7th series (it is slow).",
        "",
        "| method | peer version | precision | recall | F1 | delay median / p95 (it.) | false alarms per 1,000 "
        "healthy it. | F1 ours / peer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    so = scores["ours"]

    def row(name: str, ver: str) -> str:
        s = scores[name]
        offline = name in ("PELT", "Binseg", "Window")
        d = "offline (needs the whole series)" if offline else (
            f"{_fmt(float(np.median(s.delays)), 0)} / {_fmt(float(np.percentile(s.delays, 95)), 0)}"
            if s.delays else "n/a")
        far = 1000 * s.false_on_healthy / s.healthy_iterations if s.healthy_iterations else float("nan")
        ratio = "1" if name.startswith("ours") else _fmt(so.f1 / s.f1 if s.f1 else float("inf"))
        return (f"| {name} | {ver} | {_fmt(s.precision)} | {_fmt(s.recall)} | {_fmt(s.f1)} | {d} | "
                f"{_fmt(far)} | {ratio} |")

    lines.append(row("ours", f"rankscope L1 (reference refreshed every {_step_detector(1).ref.refresh_every} updates)"))
    lines.append(row("ours-exact", "same, reference recomputed every update"))
    lines += [row(n, v) for n, (v, _) in peers.items()]
    lines += [
        "",
        f"Time for all {n_all:,} rank series of a {CP_ITERATIONS}-iteration IL-0477 run (the 30 -> 90 s step at "
        f"iteration {il_at}), measured side by side, interleaved (3 repeats). Ours runs all series at once "
        f"(vectorised, {il_hits:,} series confirmed the step); each peer runs series by series, timed on the first "
        "N series and extrapolated linearly to 12,960 (N in the table):",
        "",
        "| method | peer version | N timed | time for 12,960 series | ours | peer / ours | ours, reference every update "
        "| peer / that |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (ver, _) in peers.items():
        lines.append(f"| {name} | {ver} | {TIMING_SUBSET[name]} | {_time_str(timing[name])}"
                     f" (extrapolated) | {_time_str(timing['ours'])} | {timing[name] / timing['ours']:,.1f}x | "
                     f"{_time_str(timing['ours-exact'])} | {timing[name] / timing['ours-exact']:,.1f}x |")
    lines += [
        "",
        "Where ruptures PELT gives up (one series, l2, jump=1, same penalty): "
        + ", ".join(f"{n} iterations {_time_str(s)} ({_time_str(s * n_all)} for 12,960 series)"
                    for n, s in pelt_len.items()) + ".",
        "",
        f"Best peer by F1: {best} (F1 {_fmt(scores[best].f1)} vs ours {_fmt(so.f1)}); fastest peer: {fastest} "
        f"({timing[fastest] / timing['ours']:,.0f}x our time). Targets: F1 and delay at least the best peer's, "
        f">= 10x faster than the fastest peer, >= 1000x faster than PELT: "
        f"F1 {'met' if so.f1 >= scores[best].f1 else 'NOT met'}, "
        f"speed vs fastest {'met' if timing[fastest] >= 10 * timing['ours'] else 'NOT met'}, "
        f"speed vs PELT {'met' if timing['PELT'] >= 1000 * timing['ours'] else 'NOT met'}.",
    ]
    data_l1 = f"{n_series} simulated series, {n_changes} change points"
    for name, (ver, _) in peers.items():
        sp = scores[name]
        summary.append(f"| L1 F1 (margin {MARGIN}) | {name} | {ver} | {data_l1} | {_fmt(sp.f1)} | {_fmt(so.f1)} | "
                       f"{_x(so.f1, sp.f1)} (ours / peer) |")
    for name in ("ADWIN", "PageHinkley"):
        sp = scores[name]
        dp = float(np.median(sp.delays)) if sp.delays else float("nan")
        do = float(np.median(so.delays)) if so.delays else float("nan")
        summary.append(f"| L1 delay median (it.) | {name} | {peers[name][0]} | {data_l1} | {_fmt(dp, 0)} | "
                       f"{_fmt(do, 0)} | {_fmt(dp - do, 0)} it. sooner |")
    for name, (ver, _) in peers.items():
        summary.append(f"| L1 time, all 12,960 series x {CP_ITERATIONS} it. | {name} | {ver} | IL-0477 run | "
                       f"{_time_str(timing[name])} (extrap.) | {_time_str(timing['ours'])} | "
                       f"{_x(timing[name], timing['ours'])} (peer / ours) |")
    return lines


# ------------------------------------------------------------------ L2 vs nvidia-resiliency-ext
def _nvrx_rederived(medians: np.ndarray, hist_min: np.ndarray, sections: list[str]) -> tuple[set[int], set[int]]:
    """The published formula: score = reference median / rank median, straggler below 0.75."""
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.nanmin(medians, axis=0)[None, :] / medians
        ind = hist_min / medians
    return set(np.flatnonzero((rel < 0.75).any(axis=1)).tolist()), set(np.flatnonzero((ind < 0.75).any(axis=1)).tolist())


def _nvrx_scoring():
    """nvidia-resiliency-ext's own scoring functions if they import on this torch; else re-derived."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from nvidia_resiliency_ext.straggler.reporting import (
                Report,
                ReportGenerator,
                StragglerId,
            )
            from nvidia_resiliency_ext.straggler.statistics import Statistic
    except Exception as exc:  # noqa: BLE001 - any import failure means: re-derive
        return _nvrx_rederived, f"does not import here ({type(exc).__name__}: {exc}); its formula is re-derived"

    def flagged(medians: np.ndarray, hist_min: np.ndarray, sections: list[str]) -> tuple[set[int], set[int]]:
        """Ranks with a relative or individual section score < 0.75, via the package's own code."""
        ref_rel = {s: float(np.nanmin(medians[:, j])) for j, s in enumerate(sections)}
        rel: dict[str, dict[int, float]] = {s: {} for s in sections}
        ind: dict[str, dict[int, float]] = {s: {} for s in sections}
        for r in range(medians.shape[0]):
            summ = {s: {Statistic.MED: float(medians[r, j])} for j, s in enumerate(sections)
                    if np.isfinite(medians[r, j]) and medians[r, j] > 0}
            ref_ind = {s: float(hist_min[r, j]) for j, s in enumerate(sections)}
            for s, v in ReportGenerator._compute_sections_perf_scores(None, summ, ref_rel).items():
                rel[s][r] = v
            for s, v in ReportGenerator._compute_sections_perf_scores(None, summ, ref_ind).items():
                ind[s][r] = v
        rep = Report(gpu_relative_perf_scores={}, section_relative_perf_scores=rel,
                     gpu_individual_perf_scores={}, section_individual_perf_scores=ind,
                     rank_to_node=collections.defaultdict(lambda: "<unk>"), local_section_summaries={}, local_kernel_summaries={},
                     generate_report_elapsed_time=0.0, gather_on_rank0=True, rank=0)
        st = rep.identify_stragglers(section_rel_threshold=0.75, section_indiv_threshold=0.75)
        rel_r = {sid.rank for v in st["straggler_sections_relative"].values() for sid in v}
        ind_r = {sid.rank for v in st["straggler_sections_individual"].values() for sid in v}
        assert StragglerId  # the package's record type, used by identify_stragglers
        return rel_r, ind_r

    return flagged, "imports on CPU-only torch; its own `ReportGenerator._compute_sections_perf_scores` and " \
                    "`Report.identify_stragglers` are called"


def _l2_cases() -> list[tuple[str, Case]]:
    il = load_scenario("il-0477")
    il_data = {"topology": {k: v for k, v in il.topology.to_dict().items() if k != "order"},
               "run": {"job": "il-0477", "iterations": 45, "seed": 7},
               "fault": [{"kind": "compute_slowdown", "ranks": "10352-10359", "stage": "mlp", "factor": 5.7,
                          "start": 30}]}
    small = {"tp": 1, "pp": 4, "dp": 128, "ep": 16, "gpus_per_node": 8}
    out = [("IL-0477 (12,960 ranks, mlp x5.7 on one node)", Case(7, il_data))]
    rng = np.random.default_rng(5)
    for i in range(4):
        f = {"kind": "compute_slowdown", "ranks": str(int(rng.integers(512))), "stage": "mlp",
             "factor": [1.3, 1.5, 2.0, 3.0][i], "start": 30}
        out.append((f"one GPU mlp x{f['factor']} (512 ranks)",
                    Case(800 + i, {"topology": small, "run": {"job": f"g{i}", "iterations": 45, "seed": 800 + i},
                                   "fault": [f]})))
    out.append(("node NIC x8 (512 ranks)", Case(810, {"topology": small, "run": {"job": "n", "iterations": 45,
                                                                                    "seed": 810},
                                                       "fault": [{"kind": "link_degradation", "node": 33,
                                                                  "factor": 8.0, "start": 30}]})))
    out.append(("healthy (512 ranks)", Case(811, {"topology": small,
                                                 "run": {"job": "h", "iterations": 45, "seed": 811}})))
    return out


def _l2(ctx, summary: list[str]) -> list[str]:
    flagged, how = _nvrx_scoring()
    names = list(DEFAULT_STAGES.names)
    compute = [j for j, s in enumerate(DEFAULT_STAGES) if s.kind in ("compute", "host")]
    rows = ["### L2 culprits: the analyzer vs nvidia-resiliency-ext straggler scores",
            "",
            f"nvidia-resiliency-ext {_version('nvidia-resiliency-ext')}: {how}. Both see the same per-rank, "
            "per-stage medians: the package's *sections* are our stages; its relative score is "
            "min-over-ranks median / rank median, its individual score the rank's best (minimum) past median / "
            "its current median, a straggler below 0.75. Medians over the 5 iterations ending 8 after onset; "
            "the individual reference is the minimum of the 5-iteration medians before onset. nvrx's GPU "
            "(kernel) scores need CUPTI kernel summaries, which a CPU-only run cannot produce: sections only. "
            "'nvrx all' scores every stage (collectives included, as a user wrapping them would), 'nvrx "
            "compute' only compute/host stages.",
            "",
            "| data | true culprits | ours: found / reported | nvrx all rel.: found / flagged | nvrx all indiv. "
            "| nvrx compute rel. | nvrx compute indiv. |",
            "|---|---|---|---|---|---|---|"]
    totals = {"ours": [0, 0], "all_rel": [0, 0], "all_ind": [0, 0], "c_rel": [0, 0], "c_ind": [0, 0]}
    n_true_total = 0
    for label, case in _l2_cases():
        sc = case.scenario()
        sim = ClusterSimulator(sc)
        ja = JobAnalyzer(sc.job, sc.topology, DEFAULT_STAGES)
        vals = []
        for _ in range(sc.iterations):
            res = sim.step()
            cube = result_cube(res, sim.stages.names)
            ja.feed(cube)
            vals.append(cube.values[0])
        v = np.array(vals)
        truth = set(int(r) for f in sc.faults for r in f.ranks)
        onset = sc.faults[0].start if sc.faults else 30
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            cur = np.nanmedian(v[onset + 3:onset + 8], axis=0)
            hist = np.nanmin(np.stack([np.nanmedian(v[a:a + 5], axis=0) for a in range(0, onset - 4, 5)]), axis=0)
        ours = {r for i in ja.incidents() for r in i.ranks}
        a_rel, a_ind = flagged(cur, hist, names)
        c_rel, c_ind = flagged(cur[:, compute], hist[:, compute], [names[j] for j in compute])
        sets = {"ours": ours, "all_rel": a_rel, "all_ind": a_ind, "c_rel": c_rel, "c_ind": c_ind}
        for k, s in sets.items():
            totals[k][0] += len(s & truth)
            totals[k][1] += len(s)
        n_true_total += len(truth)
        rows.append(f"| {label} | {len(truth)} | " + " | ".join(f"{len(s & truth)} / {len(s):,}" for s in sets.values())
                    + " |")

    def pr(k: str) -> str:
        hit, rep = totals[k]
        p = hit / rep if rep else float("nan")
        return f"P {_fmt(p)}, R {_fmt(hit / n_true_total)}"

    rows += ["", "| over all data | ours | nvrx all rel. | nvrx all indiv. | nvrx compute rel. | nvrx compute indiv. |",
             "|---|---|---|---|---|---|",
             "| culprit precision, recall | " + " | ".join(pr(k) for k in totals) + " |"]
    ver = f"{_version('nvidia-resiliency-ext')}"
    for k, label in (("all_rel", "relative, all stages"), ("all_ind", "individual, all stages"),
                     ("c_rel", "relative, compute stages"), ("c_ind", "individual, compute stages")):
        hit, rep = totals[k]
        p_peer = hit / rep if rep else float("nan")
        p_ours = totals["ours"][0] / totals["ours"][1] if totals["ours"][1] else float("nan")
        summary.append(f"| L2 culprit precision / recall | nvrx {label} | {ver} | 7 simulated jobs (IL-0477 + 512-rank) | "
                       f"{_fmt(p_peer)} / {_fmt(hit / n_true_total)} | {_fmt(p_ours)} / "
                       f"{_fmt(totals['ours'][0] / n_true_total)} | "
                       f"{_x(p_ours, p_peer)} precision (ours / peer) |")
    return rows


# ------------------------------------------------------------------ HTA
HTA_RANKS = 16
HTA_STEPS = 40
HTA_SLOW_RANK = 5
HTA_ONSET = 20


def _write_traces(folder: Path, slow: bool, seed: int) -> list[Path]:
    """Synthetic GPU-shaped Kineto traces of a 16-rank data-parallel job (an MLP kernel, then an
    ``ncclKernel`` all-reduce that ends when the last rank arrives); rank 5's MLP x3 from step 20."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    events: list[list[dict]] = [[] for _ in range(HTA_RANKS)]
    t = 1000.0
    corr = 1_000_000  # real correlation ids are large; small ones trip HTA 0.5.0 on pandas 3 (int8 downcast)
    for step in range(HTA_STEPS):
        mlp = 40_000 * np.exp(rng.normal(0, 0.03, HTA_RANKS))
        if slow and step >= HTA_ONSET:
            mlp[HTA_SLOW_RANK] *= 3.0
        launch = 200.0
        arrive = t + launch + mlp
        done = arrive.max() + 8_000 * float(np.exp(rng.normal(0, 0.05)))
        end = done + 500
        for r in range(HTA_RANKS):
            ev = events[r]
            ev += [
                {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                 "ts": t, "dur": end - t},
                {"ph": "X", "cat": "python_function", "name": "nn.Module: ExpertMLP_0", "pid": 1, "tid": 1,
                 "ts": t + 10, "dur": 100},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                 "ts": t + 20, "dur": 5, "args": {"correlation": corr, "external id": corr}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                 "ts": t + 150, "dur": 5, "args": {"correlation": corr + 1, "external id": corr + 1}},
                {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7,
                 "ts": t + launch, "dur": float(mlp[r]),
                 "args": {"correlation": corr, "stream": 7, "device": 0, "external id": corr}},
                {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0,
                 "tid": 20, "ts": float(arrive[r]), "dur": float(done - arrive[r]),
                 "args": {"correlation": corr + 1, "stream": 20, "device": 0, "external id": corr + 1}},
            ]
        corr += 2
        t = end + 100
    paths = []
    for r in range(HTA_RANKS):
        p = folder / f"rank{r}.pt.trace.json.gz"
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": HTA_RANKS},
               "deviceProperties": [{"id": 0, "name": "synthetic"}], "traceEvents": events[r],
               "baseTimeNanoseconds": 1_700_000_000_000_000_000}
        p.write_bytes(gzip.compress(json.dumps(doc).encode()))
        paths.append(p)
    return paths


def _ours_on_traces(paths: list[Path]) -> list[int]:
    """Our import-trace path (summarise each trace to stage_latency rows) + the analyzer, in memory."""
    import pandas as pd

    from collector.kineto import StagePatterns, load_trace, summarise_trace
    from rankscope.frames import frame_to_cube
    from rankscope.topology import Topology

    topo = Topology(dp=HTA_RANKS, gpus_per_node=8)
    pats = StagePatterns.default()
    frames = [summarise_trace(load_trace(p), pats, p).frame(topo, "hta") for p in paths]
    cube = frame_to_cube(pd.concat(frames, ignore_index=True), topo.world, DEFAULT_STAGES.names)
    ja = JobAnalyzer("hta", topo, DEFAULT_STAGES)
    ja.feed(cube)
    return sorted({r for i in ja.incidents() for r in i.ranks})


def _hta_on_traces(folder: Path) -> list[int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from hta.trace_analysis import TraceAnalysis

        ta = TraceAnalysis(trace_dir=str(folder))
        return sorted(int(r) for r in ta.get_potential_stragglers(num_candidates=2))


def _hta(ctx, summary: list[str]) -> list[str]:
    rows = ["### Traces: HTA get_potential_stragglers vs our trace import + analyzer", ""]
    ver = _version("HolisticTraceAnalysis")
    with tempfile.TemporaryDirectory() as tmp:
        slow_dir, ok_dir = Path(tmp) / "slow", Path(tmp) / "healthy"
        slow, ok = _write_traces(slow_dir, True, 1), _write_traces(ok_dir, False, 2)
        results: dict[str, list[int] | str] = {}
        for label, fn in (("hta slow", lambda: _hta_on_traces(slow_dir)), ("hta healthy", lambda: _hta_on_traces(ok_dir)),
                          ("ours slow", lambda: _ours_on_traces(slow)), ("ours healthy", lambda: _ours_on_traces(ok))):
            try:
                results[label] = fn()
            except Exception as exc:  # noqa: BLE001 - report exactly why a peer could not run
                results[label] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
        timing = {}
        if all(isinstance(results[k], list) for k in results):
            timing = ctx.side_by_side({"hta": lambda: _hta_on_traces(slow_dir), "ours": lambda: _ours_on_traces(slow)},
                                      repeat=3)
    rows += [f"Synthetic GPU-shaped Kineto traces (gzip JSON, one per rank, `distributedInfo`, `ProfilerStep#N` "
             f"annotations, an MLP GEMM kernel and an `ncclKernel_AllReduce` kernel per step linked by "
             f"correlation): {HTA_RANKS}-rank data-parallel job, {HTA_STEPS} steps; in the slow set rank "
             f"{HTA_SLOW_RANK}'s MLP kernel is 3x slower from step {HTA_ONSET}, so every other rank waits in the "
             "all-reduce (its kernel starts early and runs long). HolisticTraceAnalysis " + ver
             + " (`TraceAnalysis(trace_dir).get_potential_stragglers(num_candidates=2)`, all steps) vs "
             "`collector.kineto.summarise_trace` (what `rankscope import-trace` writes) fed to the analyzer.", "",
             "| traces | truth | HTA | ours |", "|---|---|---|---|",
             f"| slow rank {HTA_SLOW_RANK} | [{HTA_SLOW_RANK}] | {results['hta slow']} | {results['ours slow']} |",
             "| healthy | [] | " f"{results['hta healthy']} | {results['ours healthy']} |"]
    if timing:
        rows += ["", f"Time for the {HTA_RANKS} slow traces (side by side, 3 repeats): HTA {_time_str(timing['hta'])}, "
                 f"ours {_time_str(timing['ours'])}, ratio HTA / ours {timing['hta'] / timing['ours']:.1f}x."]
    summary.append(f"| trace stragglers, slow set / healthy set | HTA | {ver} | {HTA_RANKS} synthetic Kineto traces | "
                   f"{results['hta slow']} / {results['hta healthy']} | {results['ours slow']} / {results['ours healthy']} "
                   f"| truth [{HTA_SLOW_RANK}] / [] |")
    if timing:
        summary.append(f"| trace analysis time | HTA | {ver} | {HTA_RANKS} synthetic Kineto traces | {_time_str(timing['hta'])} | "
                       f"{_time_str(timing['ours'])} | {_x(timing['hta'], timing['ours'])} (peer / ours) |")
    return rows


def _load() -> str:
    """The 1-, 5- and 15-minute load averages as ``os.getloadavg()`` measures them now."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def run(ctx) -> str:
    t0 = time.perf_counter()
    load_before = _load()
    summary: list[str] = []
    body = _changepoints(ctx, summary)
    body += [""] + _l2(ctx, summary)
    body += [""] + _hta(ctx, summary)
    lines = ["## Peers side by side", "", "### Summary (one row per figure; details below)", "",
             "| comparison | peer | version | data | peer's figure | ours | ratio |", "|---|---|---|---|---|---|---|",
             *summary, ""] + body
    lines += ["", f"Run time {time.perf_counter() - t0:.0f} s on {os.cpu_count()} cores; load average (1, 5, 15 min, "
              f"`os.getloadavg()`) {load_before} at the start and {_load()} at the end. Absolute times depend on "
              "that load; the side-by-side ratios are the figures to quote."]
    return "\n".join(lines)
