"""``rankscope rollup --since TIME``: the rollups of iterations written while no analyzer ran.

The analyzer rolls up every iteration it processes; iterations stored before it first ran
(an imported trace, a replayed scenario) or while it was down longer than its replay
``history`` have no ``rollup_host`` / ``rollup_job`` points, so the NOC walls show a gap.
This command walks a job's ``stage_latency`` from ``--since`` in chunks of iterations and
writes their rollups (:mod:`analyzer.rollups`), then the ``rollup_host_5m`` windows the range
touches (read back from ``rollup_host``, so a window's points from before the range count).
Points are keyed by the iteration's time and tags: running it again over the same range writes
the same points, never duplicates.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzer.rollups import rollup_frames, window_rollup, window_span
from rankscope import schema
from rankscope.frames import frame_to_cube
from rankscope.store import Store, open_store
from rankscope.topology import Topology, TopologyError, infer_topology

#: Windows of ``rollup_host_5m`` read back at once (an hour: 12 x 1,620 x 10 points at IL-0477).
WINDOWS_PER_READ = 12

_AGO = re.compile(r"(\d+)(s|m|h|d|w)")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_time(text: str, now_ms: int | None = None) -> int:
    """``6h`` / ``7d`` (that long ago), an ISO 8601 time (UTC unless it says otherwise) or epoch
    milliseconds -> epoch milliseconds."""
    t = text.strip()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    m = _AGO.fullmatch(t)
    if m:
        return now_ms - int(m.group(1)) * _UNIT_MS[m.group(2)]
    if t.isdigit():
        if int(t) < 10**11:
            raise ValueError(f"time {text!r}: epoch milliseconds expected (this looks like seconds)")
        return int(t)
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"time {text!r}: expected e.g. 6h, 7d, 2026-07-08T09:30:00Z or epoch ms") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


@dataclass
class BackfillReport:
    """What one job's backfill wrote."""

    job: str
    iterations: int = 0
    points: dict[str, int] | None = None
    first_ms: int | None = None
    last_ms: int | None = None


def _topology(frame: pd.DataFrame, previous: Topology | None) -> Topology:
    """The topology the chunk's rank tags describe (each rank's latest row); the previous
    chunk's when this one misses ranks and does not describe one."""
    rows = frame.drop_duplicates("rank", keep="last")
    hosts = rows["host"] if "host" in rows.columns else None
    try:
        return infer_topology(rows["rank"], rows["tp"], rows["pp"], rows["dp"], rows["ep_group"], rows["node"],
                              host=hosts)
    except TopologyError:
        if previous is None:
            raise
        return previous


def backfill(store: Store, job: str, since_ms: int, until_ms: int | None = None,
             chunk_iterations: int = 20) -> BackfillReport:
    """Write the rollups of ``job``'s iterations with times in [since_ms, until_ms]."""
    report = BackfillReport(job, 0, {})
    cursor, topo = since_ms - 1, None
    while True:
        times = store.next_times(schema.STAGE_LATENCY, job, cursor, chunk_iterations)
        times = [t for t in times if until_ms is None or t <= until_ms]
        if not times:
            break
        cursor = times[-1]
        frame = store.read_stage_latency(job, start_ms=times[0], end_ms=times[-1])
        if len(frame):
            topo = _topology(frame, topo)
            stages = [s for s in schema.stage_fields(frame.columns) if pd.api.types.is_numeric_dtype(frame[s])]
            cube = frame_to_cube(frame, topo.world, stages)
            for name, rolled in rollup_frames(job, topo, cube).items():
                store.write_measurement(name, rolled)
                report.points[name] = report.points.get(name, 0) + len(rolled)
            report.iterations += len(cube.iterations)
            report.first_ms = int(cube.times.min()) if report.first_ms is None else report.first_ms
            report.last_ms = int(np.max(cube.times))
        if len(times) < chunk_iterations:
            break
    if report.iterations:
        # every window the range touches, its edges included: the window's other points count
        n = write_windows(store, job, *window_span(report.first_ms, report.last_ms))
        report.points[schema.ROLLUP_HOST_WINDOW] = n
    return report


def write_windows(store: Store, job: str, start_ms: int, end_ms: int,
                  window_ms: int = schema.ROLLUP_WINDOW_MS) -> int:
    """Write the ``rollup_host_5m`` points of the windows in ``[start_ms, end_ms)`` (window
    aligned) from the ``rollup_host`` points the store holds for them, so the points written
    before a restart or by a backfill count. Returns how many points were written."""
    written = 0
    step = window_ms * WINDOWS_PER_READ
    lo = start_ms
    while lo < end_ms:
        hi = min(lo + step, end_ms)
        host = store.read(schema.ROLLUP_HOST, job, lo, hi - 1)
        if len(host):
            written += store.write_measurement(schema.ROLLUP_HOST_WINDOW, window_rollup(host, window_ms)).written
            lo = hi
        else:   # a gap (the job did not run): on to the window of its next point
            nxt = store.next_times(schema.ROLLUP_HOST, job, hi - 1, 1)
            lo = max(hi, nxt[0] // window_ms * window_ms) if nxt else end_ms
    return written


def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    p = sub.add_parser(
        "rollup", help="write the rollups the dashboards read for iterations stored before the analyzer ran",
        description="Read stage_latency from --since (to --until) and write rollup_host and rollup_job, "
                    "the per-host and per-job points the NOC walls, the L1 panels and the alert rules "
                    "read, and rollup_host_5m for every 5-minute window the range touches. The "
                    "analyzer writes them for every iteration it processes; this fills the iterations "
                    "it never saw. Idempotent: running it again writes the same points.")
    add_store_options(p)
    p.add_argument("--since", required=True, metavar="TIME",
                   help="first iteration time: 6h / 7d (ago), 2026-07-08T09:30:00Z, or epoch ms")
    p.add_argument("--until", metavar="TIME", help="last iteration time (default: the newest)")
    p.add_argument("--job", action="append", help="only this job (repeatable; default: every job)")
    p.add_argument("--chunk", type=int, default=20, metavar="N", help="iterations read at once (default 20)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    since = parse_time(args.since)
    until = parse_time(args.until) if args.until else None
    if args.chunk < 1:
        raise ValueError("--chunk must be at least 1")
    with open_store(args.store, args.bucket, create=False) as store:
        jobs = args.job or store.jobs()
        if not jobs:
            print(f"no stage_latency data in {store!r}", file=sys.stderr)
            return 0
        for job in jobs:
            rep = backfill(store, job, since, until, args.chunk)
            if not rep.iterations:
                print(f"{job}: no iteration in the range")
                continue
            points = ", ".join(f"{n} {name}" for name, n in sorted((rep.points or {}).items()))
            span = (f"{dt.datetime.fromtimestamp(rep.first_ms / 1000, dt.UTC):%Y-%m-%dT%H:%M:%SZ} .. "
                    f"{dt.datetime.fromtimestamp(rep.last_ms / 1000, dt.UTC):%Y-%m-%dT%H:%M:%SZ}")
            print(f"{job}: rolled up {rep.iterations} iteration(s) ({span}): {points} point(s)")
    return 0
