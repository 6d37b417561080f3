"""Where one analyzer cycle's time goes at 100,000 ranks on the real InfluxDB: the ``shapes``
read-cost case alone (``bench_shapes._read_cost``: 12 iterations written by the simulator with
the collector shapes on, one ``cycle(final=True)``), split into its parts.

The points are written once; each trial drops what the previous cycle wrote (every
measurement but ``stage_latency``) and runs a fresh cycle in its own interpreter, in this tree
or, with ``--baseline DIR``, alternately in this tree and in ``DIR`` (ABAB, the same points, the
same server), so the two are compared side by side. Timers wrap the store's HTTP requests
(``/query`` and ``/write`` apart), the decoding of answers, the line-protocol encoding, the
assembler, the analyzer's feed, the rollups and the outputs' writes; times are inclusive
(the reads' HTTP time is part of the read).

    python -m benchmarks.cycle_breakdown                      # 100,000 ranks, 3 trials
    python -m benchmarks.cycle_breakdown --baseline /tmp/old --repeat 5
    python -m benchmarks.cycle_breakdown --profile            # and cProfile's top entries
    RANKSCOPE_TEST_INFLUX_URL=http://... python -m benchmarks.cycle_breakdown --bucket b   # points there already
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_770_000_000_000
TOPOLOGIES = {
    100_000: {"tp": 1, "pp": 10, "dp": 10000, "ep": 16, "gpus_per_node": 8},
    12_960: {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8},
}

#: Runs one cycle in whichever tree it is started in, with timers around its parts.
_TRIAL = r'''
import cProfile, io, json, pstats, sys, threading, time
from collections import defaultdict
url, bucket, profile = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
import rankscope.store.influx as influx
import rankscope.lineprotocol as lp
import rankscope.store.base as base
import analyzer.read.iteration_reader as ir
import analyzer.read.iteration_assembler as ia
import analyzer.job_analyzer as jam
import analyzer.write.outputs as outs
import analyzer.service.analyzer_service as svcm
from rankscope.store import InfluxStore

acc = defaultdict(float)
lock = threading.Lock()

def timed(owner, name, label=None, key=None):
    fn = getattr(owner, name)
    label = label or name
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            with lock:
                acc[key(*a, **k) if key else label] += time.perf_counter() - t0
    setattr(owner, name, wrapper)

def http_key(self, path, *a, **k):
    return "http " + path
timed(influx.InfluxStore, "_request", key=http_key)
for name in ("parse_csv", "parse_json", "encode_frame", "normalise_frame"):
    if hasattr(influx, name):
        timed(influx, name, "decode " + name if name.startswith("parse") else name)
for name in ("parse_csv_fast", "decode_csv"):
    if hasattr(influx, name):
        timed(influx, name, "decode " + name)
timed(base.Store, "read_stage_latency", "read_stage_latency (all)")
timed(influx.InfluxStore, "next_times", "next_times (all)")
timed(ia.IterationAssembler, "add", "assembler.add")
timed(ia.IterationAssembler, "ready", "assembler.ready")
timed(jam.JobAnalyzer, "feed", "analyze: JobAnalyzer.feed")
timed(jam.JobAnalyzer, "l2_frames", "analyze: l2_frames")
timed(outs.JobRollups, "add", "rollups: add")
timed(outs.JobRollups, "flush", "rollups: flush (incl. write)")
timed(outs.CycleOutputs, "write", "outputs: write")
timed(svcm, "frame_to_cube", "frame_to_cube")
if hasattr(svcm, "annotate_repeat_offenders"):
    timed(svcm, "annotate_repeat_offenders", "annotate_repeat_offenders")

store = InfluxStore(url, bucket=bucket, api="v1")
svc = svcm.AnalyzerService(store)
prof = cProfile.Profile() if profile else None
t0 = time.perf_counter()
if prof:
    prof.enable()
rep = svc.cycle(final=True)
if prof:
    prof.disable()
took = time.perf_counter() - t0
n = rep.iterations.get("read", 0)
out = {"cycle_s": took, "iterations": n, "read_s": rep.read_s, "analyze_s": rep.analyze_s,
       "write_s": rep.write_s, "parts": dict(acc)}
if prof:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
    out["profile"] = s.getvalue()
store.close()
print("RESULT " + json.dumps(out))
'''


def _write_points(url: str, bucket: str, ranks: int, iterations: int) -> float:
    from evaluation.accuracy import COLLECTOR_SHAPES
    from rankscope.store import InfluxStore
    from simulator.scenario import Scenario
    from simulator.simulate import simulate

    sc = Scenario.from_dict({"topology": TOPOLOGIES[ranks], "run": {"job": "read", "iterations": iterations,
                                                                   "seed": 1}, "model": COLLECTOR_SHAPES})
    st = InfluxStore(url, bucket=bucket, api="v1")
    t0 = time.perf_counter()
    simulate(sc, st, start_ms=T0, progress=False)
    st.close()
    return time.perf_counter() - t0


def _drop_outputs(url: str, bucket: str) -> None:
    """Every measurement but the raw points: the next cycle starts as the benchmark's did."""
    from rankscope.store import InfluxStore
    from rankscope.store.influx_answers import parse_json

    st = InfluxStore(url, bucket=bucket, api="v1")
    _, body, _ = st._request("/query", {"db": bucket, "q": "SHOW MEASUREMENTS"})
    names = parse_json(body)
    for m in (names["name"].tolist() if len(names) else []):
        if m != "stage_latency":
            st.execute(f'DROP MEASUREMENT "{m}"')
    st.close()


def _trial(tree: Path, url: str, bucket: str, profile: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run([sys.executable, "-c", _TRIAL, url, bucket, "1" if profile else "0"], cwd=tree,
                         env=env, capture_output=True, text=True, check=False)
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
    if res.returncode or not line:
        raise RuntimeError(f"trial in {tree} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])


def _table(label: str, runs: list[dict]) -> list[str]:
    n = max(runs[0]["iterations"], 1)
    med = lambda xs: statistics.median(xs) * 1000 / n   # noqa: E731 - ms per iteration
    rows = [f"### {label}: {runs[0]['iterations']} iterations, {len(runs)} trial(s), ms per iteration (median)",
            "", "| part | ms / iteration |", "|---|---:|"]
    rows.append(f"| whole cycle | {med([r['cycle_s'] for r in runs]):,.0f} |")
    for k in ("read_s", "analyze_s", "write_s"):
        rows.append(f"| report.{k} | {med([r[k] for r in runs]):,.0f} |")
    keys = sorted({k for r in runs for k in r["parts"]})
    for k in keys:
        rows.append(f"| {k} | {med([r['parts'].get(k, 0.0) for r in runs]):,.0f} |")
    rows.append("")
    rows.append("cycles (s): " + ", ".join(f"{r['cycle_s']:.2f}" for r in runs))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=100_000, choices=sorted(TOPOLOGIES))
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3, help="trials per tree (default 3)")
    ap.add_argument("--baseline", type=Path, help="another tree to run the same trials in, alternately")
    ap.add_argument("--profile", action="store_true", help="cProfile the first trial of each tree")
    ap.add_argument("--bucket", help="a database that holds the points already (from an earlier run on the "
                                     "server of RANKSCOPE_TEST_INFLUX_URL): not written again")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.influx_server import server_or_external

    server, url = server_or_external()
    bucket = args.bucket or f"breakdown_{uuid.uuid4().hex[:8]}"
    trees = {"this tree": ROOT}
    if args.baseline:
        trees = {"baseline": args.baseline.resolve(), **trees}
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    try:
        if not args.bucket:
            took = _write_points(url, bucket, args.ranks, args.iterations)
            print(f"wrote {args.ranks:,} ranks x {args.iterations} iterations in {took:.1f} s", flush=True)
        for i in range(args.repeat):
            for label, tree in trees.items():
                _drop_outputs(url, bucket)
                r = _trial(tree, url, bucket, args.profile and i == 0)
                runs[label].append(r)
                print(f"{label} trial {i}: cycle {r['cycle_s']:.2f} s, read {r['read_s']:.2f} s", flush=True)
                if "profile" in r:
                    print(r["profile"], flush=True)
    finally:
        if server is not None:
            server.cleanup()
    for label, rs in runs.items():
        print("\n".join(_table(label, rs)), flush=True)
    if args.baseline:
        a, b = (statistics.median(r["cycle_s"] for r in runs[k]) for k in trees)
        print(f"\nwhole cycle, this tree / baseline: {b / a:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
