"""``rankscope rollup``: the rollups of iterations no analyzer saw, from what the store holds.

The analyzer's cycle rolls up the iterations it processes, windows and hours included, in
memory (:mod:`analyzer.write.outputs`). The backfill works from the store instead:

- :func:`backfill`: ``rollup_host`` / ``rollup_job`` for iterations no analyzer saw (an
  imported trace, a replayed scenario), read from ``stage_latency`` a chunk of
  iterations at a time through an :class:`~analyzer.read.iteration_reader.IterationReader`,
  then their windows; and the hours of every window stored in the range, so the hours of
  history written before ``rollup_host_1h`` existed (an upgrade) are there too: its raw
  points are gone after 7 days, its windows are kept as long as the hours;
- :func:`write_windows`: the ``rollup_host_5m`` points of some windows, from the
  ``rollup_host`` points stored (the analyzer's and the backfill's alike), and the
  ``rollup_host_1h`` points of the hours they fall in, from the stored ``rollup_host_5m``.

Points are keyed by time and tags, so writing a range again writes the same points.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm import tqdm

from analyzer.read.iteration_reader import IterationReader
from analyzer.write.rollups import rollup_frames, window_rollup, window_span
from rankscope import schema
from rankscope.frames import frame_to_cube
from rankscope.store import Store

#: Windows of ``rollup_host_5m`` written per read of ``rollup_host`` (an hour: 12 x 1,620 x 10
#: points at IL-0477).
WINDOWS_PER_READ = 12
#: Hours of ``rollup_host_1h`` written per read of ``rollup_host_5m`` (6 x 12 x 1,620 points).
HOURS_PER_READ = 6


@dataclass
class BackfillReport:
    """What one job's backfill wrote."""

    job: str
    iterations: int = 0
    points: dict[str, int] | None = None
    first_ms: int | None = None
    last_ms: int | None = None


def backfill(store: Store, job: str, since_ms: int, until_ms: int | None = None,
             chunk_iterations: int = 20, progress: bool = False) -> BackfillReport:
    """Write the rollups of ``job``'s iterations with times in [since_ms, until_ms]; with
    ``progress``, a bar of the iterations done on a terminal (stderr)."""
    report = BackfillReport(job, 0, {})
    reader = IterationReader(store, job, chunk_iterations, since_ms=since_ms, until_ms=until_ms)
    topo = None
    with tqdm(desc=f"rollup {job}", unit="it", disable=None if progress else True, leave=False,
              dynamic_ncols=True) as bar:
        for frame in reader.chunks(final=True):
            topo = reader.chunk_topology(frame, topo)
            reader.world = topo.world
            stages = [s for s in schema.stage_fields(frame.columns) if pd.api.types.is_numeric_dtype(frame[s])]
            cube = frame_to_cube(frame, topo.world, stages)
            for name, rolled in rollup_frames(job, topo, cube).items():
                store.write_measurement(name, rolled)
                report.points[name] = report.points.get(name, 0) + len(rolled)
            report.iterations += len(cube.iterations)
            report.first_ms = int(cube.times.min()) if report.first_ms is None else report.first_ms
            report.last_ms = int(np.max(cube.times))
            bar.update(len(cube.iterations))
    if report.iterations:
        # every window the range touches, its edges included: the window's other points count
        report.points.update(write_windows(store, job, *window_span(report.first_ms, report.last_ms),
                                           hours=False))
    # the hours of every window stored in the range, whether its raw points are still there or not
    report.points[schema.ROLLUP_HOST_HOUR] = write_hours_since(store, job, since_ms, until_ms, progress)
    return report


def write_hours_since(store: Store, job: str, since_ms: int, until_ms: int | None = None,
                      progress: bool = False) -> int:
    """The ``rollup_host_1h`` points of every hour holding a stored ``rollup_host_5m`` window
    with a time in ``[since_ms, until_ms]`` (to the newest window when ``until_ms`` is None)."""
    newest = store.latest_times(schema.ROLLUP_HOST_WINDOW, job, 1)
    if not newest:
        return 0
    end = newest[0] + schema.ROLLUP_WINDOW_MS      # the newest window's end
    end = end if until_ms is None else min(end, until_ms + 1)
    return write_hours(store, job, since_ms, end, progress) if end > since_ms else 0


def write_windows(store: Store, job: str, start_ms: int, end_ms: int,
                  window_ms: int = schema.ROLLUP_WINDOW_MS, hours: bool = True) -> dict[str, int]:
    """Write the ``rollup_host_5m`` points of the windows in ``[start_ms, end_ms)`` (window
    aligned) from the ``rollup_host`` points the store holds for them, so the points written
    before a restart or by a backfill count; then the ``rollup_host_1h`` points of every hour
    those windows fall in, from the windows the store holds for it (an hour still open holds
    the windows closed so far, and is written again with each; ``hours=False``: not the hours).
    Returns the points written per measurement."""
    if end_ms <= start_ms:
        return {}
    written = {schema.ROLLUP_HOST_WINDOW: _write_tier(store, job, schema.ROLLUP_HOST, schema.ROLLUP_HOST_WINDOW,
                                                      start_ms, end_ms, window_ms, WINDOWS_PER_READ)}
    if hours:
        written[schema.ROLLUP_HOST_HOUR] = write_hours(store, job, start_ms, end_ms)
    return written


def write_hours(store: Store, job: str, start_ms: int, end_ms: int, progress: bool = False) -> int:
    """Write the ``rollup_host_1h`` points of every hour that holds a time in ``[start_ms,
    end_ms)`` from the ``rollup_host_5m`` points the store holds for it; with ``progress``, a
    bar of the hours done on a terminal. Returns how many points were written."""
    if end_ms <= start_ms:
        return 0
    hour = schema.ROLLUP_HOUR_MS
    lo, hi = window_span(start_ms, end_ms - 1, hour)
    with tqdm(total=(hi - lo) // hour, desc=f"hours {job}", unit="h", disable=None if progress else True,
              leave=False, dynamic_ncols=True) as bar:
        return _write_tier(store, job, schema.ROLLUP_HOST_WINDOW, schema.ROLLUP_HOST_HOUR, lo, hi, hour,
                           HOURS_PER_READ, done=lambda ms: bar.update(ms // hour))


def _write_tier(store: Store, job: str, source: str, target: str, start_ms: int, end_ms: int,
                window_ms: int, per_read: int, done: Callable[[int], object] | None = None) -> int:
    """Write ``target``'s windows in ``[start_ms, end_ms)`` from ``source``'s points, ``per_read``
    windows per read; a gap (the job did not run) skips to the window of the next point.
    ``done`` hears how many ms of the range each step covered."""
    written = 0
    step = window_ms * per_read
    lo = start_ms
    while lo < end_ms:
        hi = min(lo + step, end_ms)
        points = store.read(source, job, lo, hi - 1)
        before = lo
        if len(points):
            written += store.write_measurement(target, window_rollup(points, window_ms)).written
            lo = hi
        else:
            nxt = store.next_times(source, job, hi - 1, 1)
            lo = max(hi, nxt[0] // window_ms * window_ms) if nxt else end_ms
        if done is not None:
            done(min(lo, end_ms) - before)
    return written
