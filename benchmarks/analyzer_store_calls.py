"""Store calls of the analyzer's cycle, counted by a wrapper around the store.

``python benchmarks/analyzer_store_calls.py URL`` (an InfluxDB 1.x URL) writes a 1,024-rank
job with a fault at 30 s iterations (simulated once: ``--frames PATH`` reuses them) and runs
an :class:`AnalyzerService` over it three ways:
a catch-up cycle over 60 iterations in chunks of 20, the same in chunks of 5 (the
difference of their calls over the difference of their chunks is what one chunk costs), 20 live cycles that each find one new
iteration, and a restarted service (its replay). Every public method of the store that the
cycle calls is counted; a *chunk* is one read of ``stage_latency``; a *rollup read* is a read
(``read``, ``next_times``, ``latest_times``) of ``rollup_host``, ``rollup_host_5m``,
``rollup_host_1h`` or ``rollup_job``. Prints one JSON object. Self-contained: it measures
whichever tree ``PYTHONPATH`` names (any revision with ``analyzer.service.analyzer_service``),
on points simulated by one tree (``--frames``), so the numbers before and after a change
come from the same script and the same points. ``--dump PATH`` keeps every point the
analyzer stored (a pickle), to compare two revisions' outputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import pandas as pd

from analyzer.service.analyzer_service import AnalyzerService
from rankscope import schema
from rankscope.store import InfluxStore

START = 1_770_000_000_000
STEP_MS = 30_000
ROLLUPS = {schema.ROLLUP_HOST, schema.ROLLUP_JOB, schema.ROLLUP_HOST_WINDOW, schema.ROLLUP_HOST_HOUR}
READS = {"read", "next_times", "latest_times"}


class CountingStore:
    """Forwards every attribute to ``store``; counts the calls of its public methods."""

    def __init__(self, store):
        self._store = store
        self.calls: Counter = Counter()

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            if name == "write_measurement" and args:
                self.calls[f"write {args[0]}"] += 1
            if name in READS and args and args[0] in ROLLUPS:
                self.calls["rollup reads"] += 1
            return attr(*args, **kwargs)
        return counted

    def take(self) -> Counter:
        out, self.calls = self.calls, Counter()
        return out


def _calls(total: Counter) -> int:
    """Store calls (the counter's extra keys are breakdowns of them)."""
    return sum(v for k, v in total.items() if k != "rollup reads" and not k.startswith("write "))


def _summary(calls: list[Counter], seconds: list[float]) -> dict:
    total = sum(calls, Counter())
    return {"cycles": len(calls), "chunks": total["read_stage_latency"],
            "store calls per cycle": round(_calls(total) / len(calls), 2),
            "writes per cycle": round(total["write_measurement"] / len(calls), 2),
            "event reads per cycle": round(total["read_events"] / len(calls), 2),
            "rollup reads per cycle": round(total["rollup reads"] / len(calls), 2),
            "median cycle s": round(statistics.median(seconds), 3), "calls": dict(sorted(total.items()))}


def simulate(path: str | Path, iterations: int = 100) -> None:
    """The job's points, one frame per iteration (times set when written), pickled to ``path``."""
    from simulator.cluster import ClusterSimulator
    from simulator.scenario import Scenario

    sc = Scenario.from_dict({
        "topology": {"tp": 1, "pp": 4, "dp": 64, "ep": 8, "gpus_per_node": 8},
        "run": {"job": "calls", "iterations": iterations, "seed": 1},
        "fault": [{"kind": "compute_slowdown", "ranks": 77, "factor": 3.0, "start": 30}]}, name="calls")
    sim = ClusterSimulator(sc)
    frames = []
    for _ in range(iterations):
        res = sim.step()
        frames.append((res.iteration, sim.frame(res, time_ms=START)))
    pd.to_pickle(frames, path)


def main(url: str, frames_path: str | Path, dump: str | None = None) -> dict:
    """Count the calls of the three runs on the points of ``frames_path``."""
    frames = iter(pd.read_pickle(frames_path))
    # two databases with the same points: catch-up cycles with chunks of 20 and of 5 iterations
    raws = [InfluxStore(url, f"calls_{uuid.uuid4().hex[:8]}", api="v1") for _ in range(2)]
    store, fine = CountingStore(raws[0]), CountingStore(raws[1])
    last = {"ms": START}

    def write(n: int, into=raws[:1]) -> None:
        for _ in range(n):
            iteration, frame = next(frames)
            last["ms"] = START + STEP_MS * iteration
            for r in into:
                r.write_stage_latency(frame.assign(time=last["ms"]))

    def cycle(svc) -> float:
        t0 = time.perf_counter()
        svc.cycle()
        return time.perf_counter() - t0

    out = {}
    try:
        clock = lambda: last["ms"] / 1000 + 5   # noqa: E731 - a live analyzer, 5 s after the newest point
        write(60, raws)
        svc = AnalyzerService(store, chunk_iterations=20, clock=clock)
        s = cycle(svc)
        coarse = store.take()
        out["catch-up (60 iterations, one cycle)"] = _summary([coarse], [s])
        s = cycle(AnalyzerService(fine, chunk_iterations=5, clock=clock))
        small = fine.take()
        out["catch-up, chunks of 5"] = _summary([small], [s])
        extra = small["read_stage_latency"] - coarse["read_stage_latency"]
        out["store calls per chunk (the difference of the two catch-ups)"] = round(
            (_calls(small) - _calls(coarse)) / extra, 2)
        out["rollup reads per chunk (the same difference)"] = round(
            (small["rollup reads"] - coarse["rollup reads"]) / extra, 2)
        calls, secs = [], []
        for _ in range(20):
            write(1)
            secs.append(cycle(svc))
            calls.append(store.take())
        out["live (one new iteration a cycle)"] = _summary(calls, secs)
        write(2)
        restarted = AnalyzerService(store, chunk_iterations=20, clock=clock)
        s = cycle(restarted)
        out["restart (replay of the history)"] = _summary([store.take()], [s])
        if dump:   # every point the analyzer stored, to compare two revisions' outputs
            pd.to_pickle({(i, m): r.read(m, "calls") for i, r in enumerate(raws) for m in schema.MEASUREMENTS
                          if m != schema.STAGE_LATENCY}, dump)
    finally:
        for r in raws:
            r.drop_database()
            r.close()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="an InfluxDB 1.x URL")
    ap.add_argument("--frames", help="points simulated before (default: simulate them now)")
    ap.add_argument("--dump", help="keep every point the analyzer stored in this pickle")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.frames is None:
            args.frames = Path(tmp) / "frames.pkl"
            simulate(args.frames)
        print(json.dumps(main(args.url, args.frames, args.dump), indent=1))
