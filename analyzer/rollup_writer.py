"""Rollups written from what the store already holds: the backfill and the 5-minute windows.

The analyzer's cycle rolls up the iterations it processes in memory; two things it and
``rankscope rollup`` share need the store's points instead, and live here:

- :func:`write_windows`: the ``rollup_host_5m`` points of some windows, read back from
  ``rollup_host``, so the points written before a restart or by a backfill count;
- :func:`backfill`: ``rollup_host`` / ``rollup_job`` for iterations no analyzer saw (an
  imported trace, a replayed scenario, a long outage), read from ``stage_latency`` a chunk of
  iterations at a time, then their windows.

Points are keyed by time and tags, so writing a range again writes the same points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm import tqdm

from analyzer.rollups import rollup_frames, window_rollup, window_span
from rankscope import schema
from rankscope.frames import frame_to_cube
from rankscope.store import Store
from rankscope.topology import Topology, TopologyError, infer_topology

#: Windows of ``rollup_host_5m`` read back at once (an hour: 12 x 1,620 x 10 points at IL-0477).
WINDOWS_PER_READ = 12


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
             chunk_iterations: int = 20, progress: bool = False) -> BackfillReport:
    """Write the rollups of ``job``'s iterations with times in [since_ms, until_ms]; with
    ``progress``, a bar of the iterations done on a terminal (stderr)."""
    report = BackfillReport(job, 0, {})
    cursor, topo = since_ms - 1, None
    bar = tqdm(desc=f"rollup {job}", unit="it", disable=None if progress else True, leave=False,
               dynamic_ncols=True)
    with bar:
        while True:
            times = store.next_times(schema.STAGE_LATENCY, job, cursor, chunk_iterations)
            times = [t for t in times if until_ms is None or t <= until_ms]
            if not times:
                break
            cursor = times[-1]
            frame = store.read_stage_latency(job, start_ms=times[0], end_ms=times[-1])
            if len(frame):
                topo = _topology(frame, topo)
                stages = [s for s in schema.stage_fields(frame.columns)
                          if pd.api.types.is_numeric_dtype(frame[s])]
                cube = frame_to_cube(frame, topo.world, stages)
                for name, rolled in rollup_frames(job, topo, cube).items():
                    store.write_measurement(name, rolled)
                    report.points[name] = report.points.get(name, 0) + len(rolled)
                report.iterations += len(cube.iterations)
                report.first_ms = int(cube.times.min()) if report.first_ms is None else report.first_ms
                report.last_ms = int(np.max(cube.times))
                bar.update(len(cube.iterations))
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
