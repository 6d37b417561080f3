"""One job's ``stage_latency``, read in chunks of whole iterations: the analyzer's only reader of it.

Each rank stamps its own clock, so one iteration's points spread over milliseconds to
seconds. :class:`IterationReader` finds the new points by time and hands on whole
iterations by their ``iteration`` field:

1. **the probe**: ``next_times`` after the cursor gives about one time per iteration, so a
   read asks for ``chunk`` iterations (fewer in a job so large that a read would outgrow
   ``max_read_rows``: :mod:`analyzer.read.read_size`; one until the job's size is known), and
   the last read goes on to the newest point of any rank;
2. **the read**: a contiguous time range after the cursor, into an
   :class:`~analyzer.read.iteration_assembler.IterationAssembler`, which hands on an iteration
   once every rank reported or after a bounded wait;
3. **the cursor**: the newest point read. Each cycle reads again from
   :data:`LATE_MARGIN_MS` before it, so points written late are read too (the assembler
   tells a re-read row from a late one). A cycle whose outputs could not be stored takes it
   back (:meth:`~IterationReader.rewind`): the next cycle reads again from where the failed
   one began, and a chunk handed on that the cycle never took (it failed first) is handed
   on again, first;
4. **the first read**: a job never analyzed is read from its first point; a job analyzed
   before (a restarted analyzer) from the last ``history`` iterations its predecessor
   analyzed, a replay that warms the detectors up, and on from there to the newest point. Such a read starts inside the data: its oldest iteration may be
   partial, so it, and the rest of it read later, are cut. :meth:`before_replay` reads the
   iterations the predecessor analyzed before the replay's start, for the rollup windows
   they share with the replayed ones;
5. **what the rows say**: the job's topology and stages from its first iterations, a
   placement that moved, each backfill chunk's layout (:mod:`analyzer.read.row_layout`);
6. **the events**: the job's out-of-band events and the cluster's, read when the cycle asks
   (once a cycle);
7. **the stream path**: with a ``stream`` (:mod:`analyzer.read.stream_feed`), once a read has
   caught up and the feed covers everything written since it began, the rows come from the
   points InfluxDB forwarded instead of a read; a start, a rewind, a subscription made again
   or points lost make the next cycle read from the store again (from the cursor, as above).

``since_ms`` / ``until_ms`` make it a reader of a fixed range (``rankscope rollup``, and the
iterations before a replay): from ``since_ms``, to ``until_ms``, everything handed on at
the end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd

from analyzer.read.attempts import SEGMENT, Attempts
from analyzer.read.iteration_assembler import AssemblyCounts, IterationAssembler
from analyzer.read.rank_devices import RankDevices
from analyzer.read.read_size import MAX_READ_ROWS, iterations_per_read
from analyzer.read.row_layout import chunk_topology, described_placement, stages_of, topology_of
from analyzer.read.stream_feed import StreamFeed
from rankscope import schema
from rankscope.schema import StageSet
from rankscope.store import Store
from rankscope.topology import Topology

log = logging.getLogger(__name__)

#: Late points of an iteration are looked for this far before the last one processed.
LATE_MARGIN_MS = 120_000
IT = schema.ITERATION_FIELD


@dataclass
class Replay:
    """Where a restarted analyzer's replay starts: after ``cursor_ms`` (the last ``history``
    iterations), the job analyzed before up to ``analyzed_ms`` (its newest ``l2_kind``
    point, or ``l2_group`` as written before there was ``l2_kind``); ``skipped`` is the replay's
    first, partial iteration, not replayed."""

    cursor_ms: int
    analyzed_ms: int
    skipped: int | None = None


class IterationReader:
    """Reads one job's ``stage_latency`` and hands on whole iterations, oldest first.

    The caller says, as it analyzes, how many ranks a whole iteration has (``expected``),
    which iterations it analyzed already and how many ranks the job has (:meth:`analyzed`).
    """

    def __init__(self, store: Store, job: str, chunk: int = 20, max_read_rows: int = MAX_READ_ROWS,
                 wait_ms: int = 15_000, since_ms: int | None = None, until_ms: int | None = None,
                 stream: StreamFeed | None = None):
        self.store, self.job = store, job
        self.stream = stream                 # the points as InfluxDB forwards them (the stream path)
        self._read_at: float | None = None   # wall time (s) the last read from the store began
        self.chunk, self.max_read_rows = chunk, max_read_rows
        self.until_ms = until_ms
        self.since_ms = since_ms
        self.assembler = IterationAssembler(wait_ms)   # whole iterations out of the points
        self.attempts = Attempts(job)                  # restarts: the rows' iterations as steps
        self.lifecycle = pd.DataFrame()                # the job's job_lifecycle points, read at start
        self.devices = RankDevices()                   # each rank's GPU (index, UUID), as its rows say
        self.cursor: int | None = None if since_ms is None else since_ms - 1
        self.read_until: int | None = None   # time (ms) of the newest point read
        self.replay: Replay | None = None
        self.world: int | None = None        # the job's ranks, once known: sizes the reads
        self.expected: int | None = None     # ranks of a whole iteration (None: by the wait only)
        self.read_s = 0.0                    # seconds in the probes and reads of this cycle
        self._analyzed = -1                  # the newest iteration analyzed
        self._cut = False
        self._informed: object | None = None   # whom this cycle's events went to
        self._late_logged = 0
        self._began: int | None = None       # read_until when this cycle began (rewind)
        self._held: pd.DataFrame | None = None   # a chunk handed on, not yet taken
        self._fed_segment: int | None = None     # the segment of the last chunk fed (attempts.py)

    @property
    def counts(self) -> AssemblyCounts:
        """Rows used, late rows dropped, iterations handed on short."""
        return self.assembler.counts

    # ------------------------------------------------------------ where to read
    def resume(self, history: int, wait_ms: int) -> None:
        """Where this cycle's reads start: again from a margin before what was read (points
        written late are read too), or, nothing read yet, from ``since_ms``, else from the
        job's first point or, when it was analyzed before, from the last ``history``
        iterations analyzed."""
        self.assembler.wait_ms = int(wait_ms)
        self.read_s, self._cut, self._informed = 0.0, False, None
        self._began = self.read_until
        if self.read_until is not None:
            self.cursor = self.read_until - LATE_MARGIN_MS
            return
        if self.since_ms is not None:   # a reader of a range (or of a job from its first point)
            self.cursor = self.since_ms - 1
            return
        self.cursor = None
        if self.until_ms is None:   # the segments a predecessor found, so steps number as before
            self.lifecycle = self.store.read(schema.JOB_LIFECYCLE, self.job)
            self.attempts.restore(self.lifecycle)
        analyzed = self.store.latest_times(schema.L2_KIND, self.job, 1) \
            or self.store.latest_times(schema.L2_GROUP, self.job, 1)
        if not analyzed:   # never analyzed: everything
            return
        # from where the predecessor's analysis stopped, not from the newest point: one killed
        # in a catch-up (or down a while) leaves iterations unanalyzed, and nothing may be lost
        times = self.store.latest_times(schema.STAGE_LATENCY, self.job, history, before_ms=analyzed[0])
        if times:
            self.cursor, self._cut = times[-1] - 1, True
            self.replay = Replay(self.cursor, analyzed[0])

    def rewind(self) -> None:
        """This cycle's outputs were not stored: the cursor goes back to where the cycle began,
        so the next one reads it all again (rows of iterations handed on are neither handed
        on again nor counted late). A stream reader reads back from the store next time: the
        rows it took are gone from the feed."""
        self.read_until = self._began
        self._read_at = None

    def first_point_after(self, ms: int) -> int | None:
        """The time of the job's first point after ``ms`` (None: nothing since)."""
        after = self.store.next_times(schema.STAGE_LATENCY, self.job, ms, 1)
        return int(after[0]) if after else None

    def job_start_ms(self) -> int | None:
        """Where the job under this name began, when an older one had it (None: no older one)."""
        starts = [s.start_ms for s in self.attempts.segments[1:] if s.kind == "start"]
        return max([*starts, *([self.since_ms] if self.since_ms is not None and self.until_ms is None else [])],
                   default=None)

    def analyzed(self, ranks: int, last_iteration: int, world: int) -> None:
        """What the job's analyzer now knows: the ranks that reported (an iteration is whole
        with them), the newest iteration it analyzed, the job's size."""
        self.expected = ranks or None
        self._analyzed = last_iteration
        self.world = world

    # ------------------------------------------------------------ reading
    def chunks(self, final: bool = False, clock: Callable[[], float] | None = None) -> Iterator[pd.DataFrame]:
        """The iterations that became ready, one frame per read that made some ready, oldest
        first. The wall ``clock`` (s) counts once everything is read (a job that hangs);
        ``final`` then hands on what is held, a possibly incomplete last iteration too. A chunk
        counts as taken when the caller asks for the next one: one a failed cycle did not
        take is handed on first by the next."""
        if self._held is not None:
            yield from self._hand(self._held)
        if self.stream is not None and self.read_until is not None and self.stream.covers(self._read_at):
            yield from self._streamed(final, clock)
            return
        if self.stream is not None:   # a read: it holds what the stream held of the job
            self._read_at = time.time()
            self.stream.forget(self.job)
        tail = False
        while not tail:
            t0 = time.perf_counter()
            n = iterations_per_read(self.world, self.chunk, self.max_read_rows)
            times = self.store.next_times(schema.STAGE_LATENCY, self.job, self.cursor, n)
            if self.until_ms is not None:
                times = [t for t in times if t <= self.until_ms]
            tail = len(times) < n   # then read on to the newest point (or the range's end)
            if tail and self.cursor is None and not times:
                return
            end = self.until_ms if tail else times[-1]
            frame = self.store.read_stage_latency(self.job, start_ms=None if self.cursor is None else self.cursor + 1,
                                                  end_ms=end)
            self.read_s += time.perf_counter() - t0
            self._take(frame, [t for t in (end, times[-1] if times else None) if t is not None])
            now = int(clock() * 1000) if tail and clock is not None else None
            ready = self.assembler.ready(self.expected, now, final and tail)
            if len(ready):
                yield from self._hand(ready)

    def _streamed(self, final: bool, clock: Callable[[], float] | None) -> Iterator[pd.DataFrame]:
        """The stream path: the job's rows the feed took since the last cycle, as a read."""
        t0 = time.perf_counter()
        frame = self.stream.take(self.job)
        self.read_s += time.perf_counter() - t0
        if len(frame):
            self._take(frame, [self.read_until])
        now = int(clock() * 1000) if clock is not None else None
        ready = self.assembler.ready(self.expected, now, final)
        if len(ready):
            yield from self._hand(ready)

    def restarted(self, ready: pd.DataFrame) -> bool:
        """Whether ``ready`` (a segment's rows) begins a later segment than the one fed before it: the
        job restarted (or a new job began under its name: :class:`~analyzer.service.job_life.JobLife`
        tells the two apart). The first chunk of a reader is no restart."""
        k = int(ready[SEGMENT].iloc[0]) if SEGMENT in ready.columns and len(ready) else 0
        later = self._fed_segment is not None and k > self._fed_segment
        self._fed_segment = k if self._fed_segment is None else max(k, self._fed_segment)
        return later

    def took(self) -> None:
        """The chunk handed on last is taken (fed), though the caller stops asking for more (a
        deadline): the next cycle goes on after it instead of handing it on again."""
        self._held = None

    def _hand(self, ready: pd.DataFrame) -> Iterator[pd.DataFrame]:
        """Hand ``ready`` on, held until the caller comes back for more."""
        self._held = ready
        yield ready
        self._held = None

    def _take(self, frame: pd.DataFrame, ends: list[int]) -> None:
        """Move the cursor past a read and hand its rows to the assembler."""
        newest = [t for t in (self.cursor, *ends) if t is not None]
        if len(frame):
            newest.append(int(frame["time"].max()))
            before = len(self.attempts.segments)
            frame = self.attempts.steps(frame)   # iterations as steps, across restarts
            if len(self.attempts.segments) > before:
                self.expected = None   # a restart: its ranks may be others (a shrink, a grow)
        if len(frame):
            if self._cut:   # the oldest iteration read is partial: it, and the rest of it read later, go
                first = int(frame[IT].min())
                self.assembler.skip_through(first)
                if self.replay is not None:
                    self.replay.skipped = first
                self._cut = False
        self.cursor = self.read_until = max(newest)
        self.assembler.last_iteration = max(self.assembler.last_iteration, self._analyzed)
        self.devices.update(frame)
        self.assembler.add(frame)

    def before_replay(self, since_ms: int, world: int | None = None) -> Iterator[pd.DataFrame]:
        """A restarted analyzer's iterations from ``since_ms`` up to its replay (through the
        replay's first, partial iteration; the replay ends where its predecessor's analysis
        did), which share rollup windows with the replayed ones (``world``: the job's ranks, to
        size the reads). Nothing for an analyzer that replays no history."""
        rp = self.replay
        if rp is None or rp.skipped is None:
            return
        end = rp.cursor_ms
        if since_ms > end:
            return
        # a margin on both sides: the iterations at the range's edges are read whole
        older = IterationReader(self.store, self.job, self.chunk, self.max_read_rows, self.assembler.wait_ms,
                                since_ms=since_ms - LATE_MARGIN_MS, until_ms=end + LATE_MARGIN_MS)
        older.world = world or self.world
        older.attempts = self.attempts   # the same steps (its rows are older: no new restarts)
        for frame in older.chunks(final=True):
            its = frame[IT].to_numpy()
            stamped = frame.groupby(IT)["time"].transform("max").to_numpy()   # the iteration's time
            keep = (stamped >= since_ms) & (its <= rp.skipped)
            if keep.any():
                yield frame.loc[keep].reset_index(drop=True)

    # ------------------------------------------------------------ what the rows say
    def topology(self, ready: pd.DataFrame) -> Topology:
        """The topology (and placement) of the job's first whole iterations and the rows held
        of the same segment (a held row of a restart, or of a new job under the name, may
        describe another layout)."""
        return topology_of(pd.concat([ready, self._held_like(ready)]))

    def stages(self, ready: pd.DataFrame, held: bool = False) -> StageSet:
        """The known stages the rows have (``held``: and the rows the assembler holds of the
        same segment)."""
        return stages_of(pd.concat([ready, self._held_like(ready)]).columns if held else ready.columns)

    def _held_like(self, ready: pd.DataFrame) -> pd.DataFrame:
        """The rows the assembler holds of ``ready``'s segment."""
        held = self.assembler.pending()
        if len(held) and len(ready) and SEGMENT in held.columns and SEGMENT in ready.columns:
            held = held[held[SEGMENT].to_numpy() == ready[SEGMENT].iloc[0]]
        return held

    def placement(self, ready: pd.DataFrame, topo: Topology, restart: bool = False) -> Topology | None:
        """The topology the rows' host tags describe when it is not ``topo`` (another layout,
        or ranks on other nodes; ``restart``: the rows are a restart's first, where the job
        may have shrunk); None when they say nothing new."""
        return described_placement(self.job, ready, topo, restart)

    @staticmethod
    def chunk_topology(frame: pd.DataFrame, previous: Topology | None) -> Topology:
        """The topology a chunk's tags describe; ``previous`` when they describe none."""
        return chunk_topology(frame, previous)

    # ------------------------------------------------------------ around the points
    def events(self, analyzer: object, since_ms: Callable[[], int | None]) -> list[dict]:
        """The job's out-of-band events and the cluster's (matched by host later) from
        ``since_ms()`` (None: all), as rows, once a cycle for ``analyzer`` (again for one that
        took over in the cycle; [] until the next cycle): monitoring posts late (Alertmanager's
        group_wait) and resolves later, so each cycle reads them again."""
        if analyzer is self._informed:
            return []
        self._informed = analyzer
        ev = self.store.read_events(self.job, start_ms=since_ms())
        return ev.to_dict("records") if len(ev) else []

    def log_late(self) -> None:
        """Say once how many points came after their iteration was analyzed."""
        late = self.counts.late_rows
        if late and late != self._late_logged:
            log.info("job %s: %d point(s) arrived after their iteration was analyzed (ignored)", self.job, late)
            self._late_logged = late
