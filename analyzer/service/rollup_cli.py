"""``rankscope rollup --since TIME``: the rollups of iterations written while no analyzer ran.

The analyzer rolls up every iteration it processes; iterations stored before it first ran
(an imported trace, a replayed scenario, rows kept from before rollups existed) have no
``rollup_host`` / ``rollup_job`` points, so the NOC walls show a gap (a restarted analyzer
goes on from where its predecessor stopped: an outage leaves none).
This command walks a job's ``stage_latency`` from ``--since`` in chunks of iterations and
writes their rollups, then the ``rollup_host_5m`` windows and ``rollup_host_1h`` hours the range
touches (:mod:`analyzer.write.rollup_backfill`).
Points are keyed by the iteration's time and tags: running it again over the same range writes
the same points, never duplicates.
"""

from __future__ import annotations

import argparse
import sys
import time

from analyzer.write.rollup_backfill import backfill, write_hours_since
from rankscope import schema
from rankscope.cli import add_store_options, require_jobs
from rankscope.store import open_store
from rankscope.times import format_time, parse_time


def register(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser(
        "rollup", help="write the rollups the dashboards read for iterations stored before the analyzer ran",
        description="Read stage_latency from --since (to --until) and write rollup_host and rollup_job, "
                    "the per-host and per-job points the NOC walls, the L1 panels and the alert rules "
                    "read, rollup_host_5m for every 5-minute window the range touches, and rollup_host_1h "
                    "for every hour of stored windows in the range (after an upgrade: --since 400d "
                    "writes the hours of all the history the windows keep; --hours-only does only that). The "
                    "analyzer writes them for every iteration it processes; this fills the iterations "
                    "it never saw. Idempotent: running it again writes the same points.")
    add_store_options(p)
    p.add_argument("--since", required=True, metavar="TIME",
                   help="first iteration time: 6h / 7d (ago), 2026-07-08T09:30:00Z, or epoch ms")
    p.add_argument("--until", metavar="TIME", help="last iteration time (default: the newest)")
    p.add_argument("--job", action="append", help="only this job (repeatable; default: every job)")
    p.add_argument("--chunk", type=int, default=20, metavar="N", help="iterations read at once (default 20)")
    p.add_argument("--hours-only", action="store_true",
                   help="only rollup_host_1h, from the stored 5-minute windows: the upgrade step for "
                        "history written before hourly rollups existed (--since 400d), without "
                        "rolling up the raw points again")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    now_ms = int(time.time() * 1000)
    since = parse_time(args.since, "--since", now_ms=now_ms, assume_utc=True)
    until = parse_time(args.until, "--until", now_ms=now_ms, assume_utc=True) if args.until else None
    if args.chunk < 1:
        raise ValueError("--chunk must be at least 1")
    if until is not None and until < since:
        raise ValueError(f"--until {args.until} ({format_time(until)}) is before --since {args.since} "
                         f"({format_time(since)})")
    with open_store(args.store, args.bucket, create=False) as store:
        # jobs with raw points, and jobs whose raw points expired but whose windows are kept
        known = sorted(set(store.jobs()) | set(store.tag_values(schema.ROLLUP_HOST_WINDOW, "job")))
        require_jobs(store, args.job, known)
        jobs = args.job or known
        if not jobs:
            print(f"no stage_latency or {schema.ROLLUP_HOST_WINDOW} data in {store!r}", file=sys.stderr)
            return 0
        for job in jobs:
            if args.hours_only:
                n = write_hours_since(store, job, since, until, progress=True)
                print(f"{job}: {n} {schema.ROLLUP_HOST_HOUR} point(s) from the stored 5-minute windows")
                continue
            rep = backfill(store, job, since, until, args.chunk, progress=True)
            hours = (rep.points or {}).get(schema.ROLLUP_HOST_HOUR, 0)
            if not rep.iterations:
                print(f"{job}: no iteration in the range"
                      + (f"; {hours} {schema.ROLLUP_HOST_HOUR} point(s) from the stored 5-minute windows"
                         if hours else ""))
                continue
            points = ", ".join(f"{n} {name}" for name, n in sorted((rep.points or {}).items()))
            span = f"{format_time(rep.first_ms)} .. {format_time(rep.last_ms)}"
            print(f"{job}: rolled up {rep.iterations} iteration(s) ({span}): {points} point(s)")
    return 0
