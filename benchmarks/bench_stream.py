"""The stream path against the read path and the floor, side by side on the same points, on the
real InfluxDB.

Per size, a healthy simulated job's iterations are made once (the collectors' points); then,
iteration after iteration, the same points go to three databases and each is served its way:
the **read path** (write, then an analyzer cycle that reads them back, analyzes and writes its
outputs), the **stream path** (write, the points forwarded by the database's subscription to
the analyzer's endpoint, a cycle that analyzes what came and writes its outputs) and the
**floor** (write, then one read of the iteration back: the server's own cost with no analysis).
The first ``WARM`` iterations are not timed (the stream path's first cycle reads back, as a
start does). Seconds per iteration are medians over the timed iterations, the three measured
in turn within each iteration; the analyzer's CPU is the stream cycle's process CPU time.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid

from benchmarks.run import BenchContext

SIZES = {12_960: {"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8},
         100_000: {"tp": 1, "pp": 10, "dp": 10000, "ep": 16, "gpus_per_node": 8}}
ITERATIONS = int(os.environ.get("RANKSCOPE_BENCH_STREAM_ITERATIONS", "6"))
WARM = 2


def _frames(topology: dict, n: int) -> list:
    from simulator.cluster import ClusterSimulator
    from simulator.scenario import Scenario

    sc = Scenario.from_dict({"topology": topology, "run": {"job": "stream-bench", "iterations": n, "seed": 7}},
                            name="stream-bench")
    sim = ClusterSimulator(sc)
    return [sim.frame(sim.step()) for _ in range(n)]


def _settle(feed, lines: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while feed.counts.lines < lines and time.monotonic() < deadline:
        time.sleep(0.01)


def _size(url: str, ranks: int) -> dict[str, float]:
    from analyzer.read.stream_feed import StreamEndpoint, StreamFeed
    from analyzer.read.subscription import Subscription
    from analyzer.service.analyzer_service import AnalyzerService
    from rankscope.http_intake import make_server
    from rankscope.store import InfluxStore

    frames = _frames(SIZES[ranks], ITERATIONS)
    tag = uuid.uuid4().hex[:6]
    stores = {k: InfluxStore(url, bucket=f"bench_{k}_{tag}", api="v1") for k in ("read", "stream", "floor")}
    feed = StreamFeed(stores["stream"].bucket)
    server = make_server(("127.0.0.1", 0), StreamEndpoint(feed))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sub = Subscription(stores["stream"], feed, f"http://127.0.0.1:{server.server_address[1]}", name=f"bench_{tag}")
    read_svc = AnalyzerService(stores["read"], jobs=["stream-bench"])
    stream_svc = AnalyzerService(stores["stream"], jobs=["stream-bench"], stream=feed, subscription=sub)
    times: dict[str, list[float]] = {"read": [], "stream": [], "floor": [], "cpu": []}
    try:
        sub.ensure()
        written = 0
        for i, frame in enumerate(frames):
            t0 = time.perf_counter()
            stores["floor"].write_stage_latency(frame)
            stores["floor"].read_stage_latency("stream-bench", start_ms=int(frame["time"].min()),
                                               end_ms=int(frame["time"].max()))
            t1 = time.perf_counter()
            stores["read"].write_stage_latency(frame)
            read_svc.cycle()
            t2 = time.perf_counter()
            stores["stream"].write_stage_latency(frame)
            written += len(frame)
            _settle(feed, written)
            c0 = time.process_time()
            stream_svc.cycle()
            t3, c1 = time.perf_counter(), time.process_time()
            if i >= WARM:
                for k, v in (("floor", t1 - t0), ("read", t2 - t1), ("stream", t3 - t2), ("cpu", c1 - c0)):
                    times[k].append(v)
    finally:
        sub.drop()
        server.shutdown()
        server.server_close()
        for s in stores.values():
            s.drop_database()
            s.close()
    out = {k: statistics.median(v) for k, v in times.items()}
    out["refused"] = float(feed.counts.refused)
    return out


def run(ctx: BenchContext) -> str:
    rows = ["| ranks | stream path (s/it) | read path (s/it) | floor (s/it) | stream / floor | read / floor | "
            "analyzer CPU in the stream cycle (s/it) | posts refused |", "|---|---|---|---|---|---|---|---|"]
    lines = []
    for ranks in SIZES:
        m = _size(ctx.influx_url, ranks)
        rows.append(f"| {ranks:,} | {m['stream']:.2f} | {m['read']:.2f} | {m['floor']:.2f} | "
                    f"{m['stream'] / m['floor']:.2f} | {m['read'] / m['floor']:.2f} | {m['cpu']:.2f} | "
                    f"{int(m['refused'])} |")
        lines.append(f"stream: {ranks} ranks: {m['stream']:.2f} s/it stream, {m['read']:.2f} s/it read path, "
                     f"{m['floor']:.2f} s/it floor")
    return "\n".join(["## Stream path", "", __doc__.split("\n", 2)[2].strip(), "",
                      f"{ITERATIONS} iterations per size, {ITERATIONS - WARM} timed.", "", *rows, "",
                      "```", *lines, "```"])
