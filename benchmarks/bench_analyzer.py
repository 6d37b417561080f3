"""Analyzer: cycle cost at 12,960 and 100,000 ranks (database read measured apart), the
steady-state cycle before and after a given revision, measured side by side, and the store
calls of the cycle before and after another.

``RANKSCOPE_BENCH_BASELINE`` names the revision to compare the steady-state cycle with
(default the last commit before the package redesign); it is checked out in a temporary git
worktree and both trees run the same measuring script in turn (ABAB), each in its own
interpreter. ``RANKSCOPE_BENCH_CALLS_BASELINE`` names the revision whose store calls
(:mod:`benchmarks.analyzer_store_calls`) are compared (default the last before the read path
had one owner); its files are extracted with ``git archive``, and both trees measure the same
simulated points in turn.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from analyzer.job_analyzer import JobAnalyzer
from rankscope.frames import frame_to_cube
from rankscope.schema import DEFAULT_STAGES
from rankscope.store import InfluxStore
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
#: The revision the steady-state cycle is compared with (the last before the package redesign).
BASELINE = os.environ.get("RANKSCOPE_BENCH_BASELINE", "912400b")
#: The revision the store calls of the cycle are compared with (the last before the read path had one owner).
CALLS_BASELINE = os.environ.get("RANKSCOPE_BENCH_CALLS_BASELINE", "b84f921")
#: Measures the IL-0477 steady-state cycle in whichever tree it runs in (old or new layout).
_MEASURE = """
import json, sys, time
try:
    from collector.simulator import ClusterSimulator
    from collector.scenario import Scenario
except ImportError:
    from simulator.cluster import ClusterSimulator
    from simulator.scenario import Scenario
from analyzer.job_analyzer import JobAnalyzer
from rankscope.frames import frame_to_cube
from rankscope.schema import DEFAULT_STAGES
sc = Scenario.from_dict({"topology": {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8},
                         "run": {"job": "bench", "iterations": 40, "seed": 1}})
sim = ClusterSimulator(sc)
cubes = [frame_to_cube(sim.frame(sim.step()), sc.topology.world, DEFAULT_STAGES.names) for _ in range(40)]
ja = JobAnalyzer("bench", sc.topology, DEFAULT_STAGES)
for c in cubes[:20]:
    ja.feed(c)
out = []
for c in cubes[20:]:
    t0 = time.perf_counter()
    ja.feed(c)
    ja.l2_frames()
    out.append(time.perf_counter() - t0)
print(json.dumps(out[1:]))
"""

SIZES = {
    "12,960 (IL-0477: tp=1 pp=9 dp=1440 ep=32)": {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8},
    "100,000 (tp=8 pp=10 dp=1250 ep=25)": {"tp": 8, "pp": 10, "dp": 1250, "ep": 25, "gpus_per_node": 8},
}


def _cubes(topo_dict: dict, n: int):
    sc = Scenario.from_dict({"topology": topo_dict, "run": {"job": "bench", "iterations": n, "seed": 1}})
    sim = ClusterSimulator(sc)
    frames = [sim.frame(sim.step()) for _ in range(n)]
    world = sc.topology.world
    return sc, [frame_to_cube(f, world, DEFAULT_STAGES.names) for f in frames], frames


def run(ctx) -> str:
    rows = []
    per_world = {}
    for label, topo in SIZES.items():
        sc, cubes, frames = _cubes(topo, 45)
        # steady state: warm up on 20 iterations, then one new iteration + the L2 points per cycle
        ja = JobAnalyzer("bench", sc.topology, DEFAULT_STAGES)
        for c in cubes[:20]:
            ja.feed(c)
        it = iter(cubes[20:])

        def cycle(ja=ja, it=it):
            ja.feed(next(it))
            ja.l2_frames()

        steady = ctx.median_s(cycle, repeat=min(ctx.repeat, 10), warmup=1)

        # a whole 20-iteration window in one cycle (a cycle after a 20-iteration gap)
        def window(sc=sc, cubes=cubes):
            fresh = JobAnalyzer("bench", sc.topology, DEFAULT_STAGES)
            t0 = time.perf_counter()
            for c in cubes[:20]:
                fresh.feed(c)
            fresh.l2_frames()
            return time.perf_counter() - t0

        win = min(window() for _ in range(2))
        per_world[label] = (sc.topology.world, steady, win)
        rows.append(f"| {label} | {steady * 1000:.0f} ms | {win:.2f} s | {win / 20 * 1000:.0f} ms |")

    (w1, s1, v1), (w2, s2, v2) = per_world.values()
    read = _read_time(ctx)
    before_after = _before_after()
    calls = store_calls(ctx)
    return f"""## Analyzer

One analyzer cycle (L1 + L2 + diagnosis + the L2 points to write), in memory, without the
database. *Steady state*: the cycle that processes the one new iteration (a 30-90 s iteration
and a 30 s cycle), plus the `l2_group`/`l2_rank` frames over the last 5 iterations. *20-iteration
window*: a fresh analyzer processing a whole 20-iteration window in one cycle (the worst case:
after a gap, or at start-up).

| ranks | steady-state cycle (median) | 20-iteration window | per iteration |
|---|---|---|---|
{chr(10).join(rows)}

Scaling from {w1:,} to {w2:,} ranks ({w2 / w1:.1f}x the ranks): steady-state cycle {s2 / s1:.1f}x,
20-iteration window {v2 / v1:.1f}x (linear would be {w2 / w1:.1f}x). Target: a cycle over 12,960
ranks x {len(DEFAULT_STAGES)} stages x 20 iterations in <= 0.5 s without the read.

Database read, reported apart: {read}

{before_after}

{calls}
"""


def _before_after(rounds: int = 3) -> str:
    """Steady-state IL-0477 cycle in the baseline revision and in this tree, ABAB."""
    if shutil.which("git") is None:
        return "Before/after: git not found; not measured."
    tmp = Path(tempfile.mkdtemp(prefix="rankscope-baseline-"))
    tree = tmp / "tree"
    try:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), BASELINE],
                       check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"Before/after: revision {BASELINE} not available ({exc.stderr.strip()[:200]}); not measured."
    samples: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for _ in range(rounds):
            for name, where in (("before", tree), ("after", ROOT)):
                env = {**os.environ, "PYTHONPATH": str(where)}
                out = subprocess.run([sys.executable, "-c", _MEASURE], cwd=where, env=env, check=True,
                                     capture_output=True, text=True)
                samples[name] += json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    b, a = statistics.median(samples["before"]), statistics.median(samples["after"])
    return (f"Before/after the package redesign: the IL-0477 steady-state cycle (one new iteration plus "
            f"the L2 points) in revision `{BASELINE}` and in this tree, {rounds} rounds in turn, each in "
            f"its own interpreter, {len(samples['after'])} cycles each: before {b * 1000:.0f} ms, after "
            f"{a * 1000:.0f} ms, **ratio after/before {a / b:.2f}** (the after cycle also accounts every "
            f"open incident's cost and follows placements).")


def _read_time(ctx) -> str:
    if not ctx.influx_url:
        return "(no InfluxDB)"
    sc, _, frames = _cubes(SIZES["12,960 (IL-0477: tp=1 pp=9 dp=1440 ep=32)"], 20)
    store = InfluxStore(ctx.influx_url, f"bench_{uuid.uuid4().hex[:8]}", api="v1")
    try:
        for i, f in enumerate(frames):
            f["time"] = 1_700_000_000_000 + 30_000 * i
            store.write_stage_latency(f)
        t = ctx.median_s(lambda: store.read_stage_latency("bench"), repeat=3, warmup=1)
        return (f"the 20-iteration window of 12,960 ranks ({20 * 12960:,} points) from InfluxDB 1.6.7 "
                f"over `/query` as CSV: median {t:.2f} s.")
    finally:
        store.drop_database()
        store.close()


def store_calls(ctx, rounds: int = 2) -> str:
    """The store calls and cycle times of :mod:`benchmarks.analyzer_store_calls` in revision
    :data:`CALLS_BASELINE` and in this tree, on the same simulated points, ``rounds`` times in turn."""
    if not ctx.influx_url:
        return "Store calls: (no InfluxDB)"
    from benchmarks.analyzer_store_calls import simulate

    tmp = Path(tempfile.mkdtemp(prefix="rankscope-calls-"))
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    try:
        base = tmp / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", CALLS_BASELINE], check=True,
                                 capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        simulate(tmp / "frames.pkl")
        for _ in range(rounds):
            for name, tree in (("before", base), ("after", ROOT)):
                out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "analyzer_store_calls.py"),
                                      ctx.influx_url, "--frames", str(tmp / "frames.pkl")], cwd=tree, check=True,
                                     env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
                runs[name].append(json.loads(out.stdout))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        return f"Store calls: revision {CALLS_BASELINE} not measured ({str(detail).strip()[-300:]})."
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _calls_table(runs)


def _calls_table(runs: dict[str, list[dict]]) -> str:
    """Markdown: what each tree's cycle asked of the store (the same in every round) and its
    median cycle time over the rounds."""
    catch, fine = "catch-up (60 iterations, one cycle)", "catch-up, chunks of 5"
    live, restart = "live (one new iteration a cycle)", "restart (replay of the history)"
    rows = [
        ("store calls per chunk (catch-up in chunks of 5 minus chunks of 20, per extra chunk)",
         lambda r: r["store calls per chunk (the difference of the two catch-ups)"]),
        ("event reads in the catch-up cycle (chunks of 5)", lambda r: r[fine]["event reads per cycle"]),
        ("rollup reads in the catch-up cycle", lambda r: r[catch]["rollup reads per cycle"]),
        ("rollup reads per live cycle", lambda r: r[live]["rollup reads per cycle"]),
        ("rollup reads in the restart cycle", lambda r: r[restart]["rollup reads per cycle"]),
        ("store calls per live cycle", lambda r: r[live]["store calls per cycle"]),
        ("chunks read by the restart cycle", lambda r: r[restart]["chunks"]),
    ]
    seconds = [(f"{name} cycle, s (median over rounds)", key) for name, key in
               (("catch-up", catch), ("live", live), ("restart", restart))]
    lines = [f"| | before (`{CALLS_BASELINE}`) | after |", "|---|---|---|"]
    lines += [f"| {label} | {get(runs['before'][0])} | {get(runs['after'][0])} |" for label, get in rows]
    lines += [f"| {label} | {statistics.median(r[key]['median cycle s'] for r in runs['before']):.3f} | "
              f"{statistics.median(r[key]['median cycle s'] for r in runs['after']):.3f} |" for label, key in seconds]
    return ("Store calls of the cycle (`benchmarks/analyzer_store_calls.py`: a 1,024-rank job at 30 s "
            "iterations, a counting wrapper around the store; a *rollup read* is a read, time probe "
            "included, of `rollup_host`, `rollup_job`, `rollup_host_5m` or `rollup_host_1h`), "
            f"{len(runs['after'])} rounds in turn:\n\n" + "\n".join(lines))
