"""One analyzer cycle: read what is new, feed the job analyzers, write the results back.

Each cycle, per job:

1. **read**: the job's :class:`~analyzer.read.iteration_reader.IterationReader` (the only
   reader of ``stage_latency``: from the store, or as InfluxDB forwards the points, the stream
   path) hands on whole iterations, a chunk at a time; the job's events are read once;
2. **feed**: the iterations to the job's :class:`~analyzer.job_analyzer.JobAnalyzer` (the layout of its first ones);
3. **write**: ``l1_changepoint``, ``l2_kind``, ``l2_group``, ``l2_rank``, ``job_health``, ``incident`` and
   ``incident_host`` points, and the rollups of the iterations processed (``rollup_host``,
   ``rollup_job``, and the ``rollup_host_5m`` windows and ``rollup_host_1h`` hours closed,
   made in memory: :mod:`analyzer.write.outputs`), all keyed by time and tags, so a re-run
   writes the same points again. Iterations written while no analyzer ran are rolled up by
   ``rankscope rollup``.

A cycle is a unit: its cursor moves on only once what it analyzed is stored. When a read or a
write fails (the database down, hung or restarted), the outputs of the iterations it fed stay
pending (an iteration is fed once, whatever is read again), the cursor goes back to where the
cycle began, and the next cycle first stores the outputs of a cycle that analyzed all it read,
then reads again; one that failed before that leaves its outputs to the next, which adds its own.

Restarts are found by the read (the reader's :class:`~analyzer.read.attempts.Attempts` number the
segments; :meth:`IterationReader.restarted` says when a chunk begins a later one); a job's life
(ended, a new job under its name, what an end writes) is decided by
:class:`~analyzer.service.job_life.JobLife`. The cycle only feeds, stores and releases.

After a restart of the analyzer the state is rebuilt from the database: the job's incidents are read back (an
open one keeps its id: re-detected culprits join it), the last ``history`` iterations analyzed
are replayed to warm up, and the ``rollup_host_5m`` windows stored are read once, from the hour
of the first window to write (:meth:`~analyzer.write.outputs.JobRollups.resume`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
from tqdm import tqdm

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.event_verdicts import OutOfBandEvent
from analyzer.job_analyzer import JobAnalyzer
from analyzer.read.attempts import SEGMENT, Attempts
from analyzer.read.host_history import annotate_repeat_offenders
from analyzer.read.iteration_reader import IT, LATE_MARGIN_MS, IterationReader
from analyzer.read.rank_devices import name_gpus
from analyzer.read.read_size import MAX_READ_ROWS
from analyzer.read.stream_feed import StreamFeed
from analyzer.read.subscription import Subscription
from analyzer.service.action_follow import follow_actions
from analyzer.service.cycle_report import CycleFailed, CycleReport, IncidentEvidence
from analyzer.service.job_life import RANKS_LEFT, JobEnd, JobLife, close_open, left_ranks
from analyzer.service.kernel_cycle import KernelCycle
from analyzer.service.shards import Shard
from analyzer.write.outputs import CycleOutputs, JobRollups
from rankscope.frames import frame_to_cube
from rankscope.incident import Incident, load_incidents
from rankscope.schema import StageSet
from rankscope.store import Store
from rankscope.topology import Topology

log = logging.getLogger(__name__)


class AnalyzerService:
    """Keeps a :class:`JobAnalyzer` per job and runs cycles against a store."""

    def __init__(self, store: Store, config: AnalyzerConfig | None = None, stages: StageSet | None = None,
                 jobs: list[str] | None = None, topology: Topology | None = None,
                 chunk_iterations: int = 20, progress: bool = False,
                 clock: Callable[[], float] = time.time, max_read_rows: int = MAX_READ_ROWS,
                 shard: Shard | None = None, evidence: Sequence[IncidentEvidence] = (),
                 stream: StreamFeed | None = None, subscription: Subscription | None = None):
        self.store = store
        self.stream, self.subscription = stream, subscription   # the stream path, its subscription
        self.cfg = config or AnalyzerConfig()
        self.stages = stages
        self.jobs = jobs
        self.shard = shard   # --shard K/N: only the jobs it owns (analyzer.service.shards)
        self.topology = topology
        self.chunk = chunk_iterations
        self.max_read_rows = max_read_rows
        self.progress = progress
        self.clock = clock   # wall clock (s): closes the windows of a job that stopped writing
        self.analyzers: dict[str, JobAnalyzer] = {}
        self.readers: dict[str, IterationReader] = {}   # each job's stage_latency, whole iterations
        self.rollups: dict[str, JobRollups] = {}        # each job's rollups, windows made in memory
        self.pending: dict[str, CycleOutputs] = {}      # each job's outputs not yet stored
        self.life = JobLife(store)                      # which jobs ended, what an end writes
        self.kernels = KernelCycle(store)               # L3: each job's kernel windows
        self.evidence = list(evidence)                  # sources attaching evidence to incidents

    def reconfigure(self, cfg: AnalyzerConfig) -> None:
        """New thresholds for every job from the next cycle on, no state lost."""
        self.cfg = cfg
        for ja in self.analyzers.values():
            ja.reconfigure(cfg)

    def _jobs(self) -> list[str]:
        jobs = self.jobs if self.jobs else self.store.jobs()
        return self.shard.select(jobs) if self.shard is not None else jobs

    # --------------------------------------------------------------- cycle
    def cycle(self, final: bool = False) -> CycleReport:
        """One pass over every job, ``concurrency`` at a time, each within its deadline (not in a
        ``final`` cycle, which also processes a possibly incomplete last iteration); then the
        jobs idle for ``job_idle_s`` end."""
        report = CycleReport()
        jobs = self._jobs()
        if self.stream is not None:   # the stream path: its subscription made, what came parsed
            _ = self.subscription is not None and self.subscription.ensure()
            self.stream.drain(jobs)
        workers = max(1, min(int(self.cfg.concurrency), len(jobs)))
        if workers == 1:
            results = [self._one_job(job, final) for job in jobs]
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="analyze") as pool:
                results = list(pool.map(lambda j: self._one_job(j, final), jobs))
        failed = [err for part, err in results if err]
        for part, _ in results:
            report.merge(part)
        if not final:
            self._end_idle(report)
        if failed:
            raise CycleFailed(f"the analysis of {len(failed)} job(s) failed, the others went on: "
                              + "; ".join(failed), report)
        return report

    def _one_job(self, job: str, final: bool) -> tuple[CycleReport, str | None]:
        """One job's cycle, its report and its failure (one job's trouble must not stop the others)."""
        part, t0 = CycleReport(), time.perf_counter()
        try:
            self._cycle_job(job, part, final)
            err = None
        except Exception as exc:  # noqa: BLE001 - logged, reported, the others go on
            log.error("job %s: analysis failed: %s: %s", job, type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            err = f"{job} ({type(exc).__name__}: {exc})"
        part.job_s[job] = time.perf_counter() - t0
        return part, err

    def _reader(self, job: str) -> IterationReader | None:
        """The job's reader (:meth:`JobLife.reader`: None for a job that ended and wrote nothing since)."""
        reader = self.readers.get(job)
        if reader is not None:
            return reader

        def make(since_ms: int | None, base_step: int) -> IterationReader:
            made = IterationReader(self.store, job, self.chunk, self.max_read_rows, since_ms=since_ms, stream=self.stream)
            made.attempts = Attempts(job, base_step=base_step) if base_step else made.attempts
            made.attempts.idle_ms = int(self.cfg.job_idle_s * 1000)
            return made

        reader = self.life.reader(job, make)
        if reader is not None:
            self.readers[job] = reader
        return reader

    def _cycle_job(self, job: str, report: CycleReport, final: bool) -> None:
        """Store what a failed cycle analyzed, then read, feed, write. Nothing is taken as done
        before it is stored: on any failure the outputs made stay pending and the cursor goes
        back to where the cycle began."""
        reader = self._reader(job)
        if reader is None:
            return
        out = self.pending.pop(job, None)
        try:
            reader.resume(self.cfg.history, int(self.cfg.iteration_wait_s * 1000))
            if out is not None and out.complete:   # analyzed, not stored: stored as it was, first
                self._store(job, out, report, final=False)
                out = None
            out = out or CycleOutputs()
            self._read_and_feed(job, reader, out, report, final)
            ja = self.analyzers.get(job)
            if ja is None:
                return
            if out.iterations:
                out.analyzed(ja.l2_frames(), ja.health_row(reader.counts.late_rows))
            self._store(job, out, report, final)
        except Exception:
            if out is not None and (out.iterations or out.complete):
                self.pending[job] = out
            reader.rewind()
            raise

    def _read_and_feed(self, job: str, reader: IterationReader, out: CycleOutputs, report: CycleReport,
                       final: bool) -> None:
        """Every chunk of whole iterations the reader hands on, fed and rolled up, until the
        job's deadline (not in a ``final`` cycle): the rest is read next cycle."""
        deadline = time.perf_counter() + self.cfg.job_deadline_s
        with tqdm(desc=f"analyze {job}", unit="it", disable=None if self.progress else True, leave=False,
                  dynamic_ncols=True) as bar:
            for ready in reader.chunks(final, self.clock):
                before = out.iterations
                ja = self._feed(job, reader, ready, out, report)
                reader.took()
                bar.update(out.iterations - before)
                bar.set_postfix_str(f"iteration {ja.last_iteration}", refresh=False)
                if not final and time.perf_counter() > deadline:
                    log.info("job %s: deadline of %gs reached at step %d; the rest next cycle", job,
                             self.cfg.job_deadline_s, ja.last_iteration)
                    report.deferred.append(job)
                    break
        reader.log_late()
        report.read_s += reader.read_s

    def _store(self, job: str, out: CycleOutputs, report: CycleReport, final: bool) -> None:
        """The rollups held and the windows closed (by the data and the clock: a job that ended
        or hangs still gets its last ones), then what the cycle analyzed, ``l2_kind`` last."""
        ja, rollups = self.analyzers[job], self.rollups.get(job)
        t0 = time.perf_counter()
        if rollups is not None:
            rollups.flush(self.store, ja.last_time_ms, int(self.clock() * 1000), final, force=True)
        if out.complete:
            annotate_repeat_offenders(self.store, out.incidents.values())   # new ones: their hosts' record
            name_gpus(out.incidents.values(), ja.topo, getattr(self.readers.get(job), "devices", None))
            for source in self.evidence:   # what other sources say of the incidents, before they are written
                source.attach(job, list(out.incidents.values()), ja)
            out.write(self.store)
            report.iterations[job] = report.iterations.get(job, 0) + out.iterations
            report.changepoints += len(out.changepoints)
            report.incidents += list(out.incidents.values())
        follow_actions(self.store, job, ja, self.clock)   # drains done, a drained job's wait (wall clock)
        self.kernels.run(job, ja, final, self.readers.get(job))
        report.write_s += time.perf_counter() - t0

    def _feed(self, job: str, reader: IterationReader, ready: pd.DataFrame, out: CycleOutputs,
              report: CycleReport) -> JobAnalyzer:
        """Feed ``ready`` a segment (restart) at a time: a segment can change the job's layout,
        and a new job under the same name starts afresh; the restarts found are stored."""
        segments = [ready] if SEGMENT not in ready.columns else [g for _, g in ready.groupby(SEGMENT, sort=True)]
        for part in segments:
            ja = self._feed_segment(job, reader, part, out, report)
        out.lifecycle += [s.row(job) for s in reader.attempts.take_new()]
        return ja

    def _feed_segment(self, job: str, reader: IterationReader, ready: pd.DataFrame, out: CycleOutputs,
                      report: CycleReport) -> JobAnalyzer:
        """Analyze the whole iterations of ``ready`` not analyzed yet, but a restart's warm-up,
        and roll them all up; returns the job's analyzer. What reads (the analyzer's start, the
        events, a restart's windows) comes before the iterations are fed."""
        self._new_job_segment(job, reader, ready, out)
        ja = self._analyzer(job, reader, ready, out)
        events = reader.events(ja, ja.event_horizon_ms)   # once a cycle
        if events:   # a known event read again replaces itself
            ja.add_events([OutOfBandEvent.from_row(r) for r in events])
        ready = ready[ready[IT].to_numpy() > ja.last_iteration]   # a chunk handed on again: what is new
        if not len(ready):
            return ja
        cube = frame_to_cube(ready, ja.topo.world, ja.stages.names)
        rollups = self._rollups(job, reader, ja, cube)
        warm = reader.attempts.warm_up(ready[IT].to_numpy(), self.cfg.restart_warmup)
        t0 = time.perf_counter()
        if not warm.all():
            fed = cube if not warm.any() else frame_to_cube(ready[~warm], ja.topo.world, ja.stages.names)
            out.add(ja.feed(fed))
        reader.analyzed(ja.reporting_ranks, ja.last_iteration, ja.topo.world)
        rollups.add(ja.topo, cube)
        t1 = time.perf_counter()
        rollups.flush(self.store, ja.last_time_ms)   # only once it holds many rows: bounded memory
        report.analyze_s += t1 - t0
        report.write_s += time.perf_counter() - t1
        return ja

    def _new_job_segment(self, job: str, reader: IterationReader, ready: pd.DataFrame, out: CycleOutputs) -> None:
        """At a segment that starts a new job under the same name (:meth:`JobLife.new_job_at`), the
        old job ends: its open incidents close as "job ended", and the next analyzer starts afresh."""
        if job not in self.analyzers or not self.life.new_job_at(job, reader, ready):
            return
        old = self.analyzers.pop(job)
        log.info("job %s: the job ended at step %d; a new job under its name from its next point", job, old.last_iteration)
        k = int(ready[SEGMENT].iloc[0])
        self.life.end(job, old, JobEnd(int(old.last_time_ms), int(old.last_iteration)), reader.attempts.segments[k - 1], out)

    # --------------------------------------------------------------- start
    def _analyzer(self, job: str, reader: IterationReader, ready: pd.DataFrame, out: CycleOutputs) -> JobAnalyzer:
        """The job's analyzer for ``ready``: started from the first iterations; following the
        placement the rows describe (a replaced node, a scheduler's own placement); a new one
        when the layout itself changed (a job that shrank or grew at a restart), which takes
        over the job's incidents (those of ranks that left close)."""
        ja = self.analyzers.get(job)
        restart = reader.restarted(ready)
        if ja is None:
            return self._start_job(job, self.topology or reader.topology(ready),
                                   self.stages or reader.stages(ready, held=True), out, reader.job_start_ms())
        if restart:
            ja.restarted()
        if self.topology is not None:
            return ja
        topo = reader.placement(ready, ja.topo, restart)
        if topo is None:
            return ja
        if topo == ja.topo:   # the same layout (hosts are not compared): the ranks elsewhere
            ja.replace_placement(topo)
            return ja
        log.warning("job %s: the parallel layout changed (%s -> %s); a new analyzer takes over", job, ja.topo, topo)
        for inc in close_open(left_ranks(ja.incidents(), topo.world), ja.last_iteration, RANKS_LEFT):
            out.incidents[inc.id] = inc
        fresh = self._start_job(job, topo, self.stages or reader.stages(ready), out, incidents=ja.incidents())
        fresh.last_iteration = ja.last_iteration
        return fresh

    def _start_job(self, job: str, topo: Topology, stages: StageSet, out: CycleOutputs, since_ms: int | None = None,
                   incidents: list[Incident] | None = None) -> JobAnalyzer:
        """A job's analyzer, continuing ``incidents`` (default: those stored, of the job since
        ``since_ms``, where a job under the same name began). Open ones naming ranks the job no
        longer has (it shrank while no analyzer ran) close, written with ``out``."""
        if incidents is None:   # read first: no analyzer without its incidents
            incidents = [i for i in load_incidents(self.store, job) if since_ms is None or i.onset_ms >= since_ms]
        gone = left_ranks(incidents, topo.world)
        for inc in gone:
            close_open([inc], max(int(inc.last_onset), int(inc.onset_iteration)), RANKS_LEFT)
            out.incidents[inc.id] = inc
        ja = self.analyzers[job] = JobAnalyzer(job, topo, stages, self.cfg)
        ja.adopt([i for i in incidents if i not in gone])
        log.info("job %s: %d ranks (tp=%d pp=%d dp=%d ep=%d), %d stages", job, topo.world, topo.tp,
                 topo.pp, topo.dp, topo.ep, len(stages))
        return ja

    def _rollups(self, job: str, reader: IterationReader, ja: JobAnalyzer, cube) -> JobRollups:
        """The job's rollups. A restarted analyzer's windows start from those its predecessor
        stored (read once) and the iterations it replays; the predecessor's iterations are
        read again only for windows it left open before the replay (kept only once whole)."""
        rollups = self.rollups.get(job)
        if rollups is not None:
            return rollups
        rollups = JobRollups(job, LATE_MARGIN_MS)
        if reader.replay is not None:   # analyzed before: a restart
            since = rollups.resume(self.store, int(cube.times.min()), reader.replay.analyzed_ms)
            topo = None
            for frame in reader.before_replay(since, ja.topo.world):
                topo = self.topology or reader.chunk_topology(frame, topo or ja.topo)
                rollups.add(topo, frame_to_cube(frame, topo.world, ja.stages.names), write=False)
        self.rollups[job] = rollups
        return rollups

    def _end_idle(self, report: CycleReport) -> None:
        """Jobs with no new point for ``job_idle_s`` while the cluster wrote on have ended: their
        open incidents close as "job ended", an ``ended`` point is written, their state released.
        "Now" is the wall clock or the newest point of any job, whichever is older: when the
        whole cluster stops writing (the collectors' path or the database is down) no job ends."""
        newest = [r.read_until for r in list(self.readers.values()) if r.read_until is not None]
        now_ms = min(int(self.clock() * 1000), max(newest, default=0))
        running = [j for j in self.analyzers if j not in self.pending]
        for job in self.life.idle_jobs(self.readers, running, now_ms, self.cfg.job_idle_s):
            reader, ja = self.readers[job], self.analyzers[job]
            end = JobEnd(int(reader.read_until), int(max(ja.last_iteration, reader.attempts.high[-1])))
            out = CycleOutputs()
            self.life.end(job, ja, end, reader.attempts.segments[-1], out)
            try:
                if job in self.rollups:
                    self.rollups[job].flush(self.store, ja.last_time_ms, now_ms, final=True, force=True)
                self.kernels.run(job, ja, final=True, reader=reader)   # its last kernel windows
                out.write(self.store)
            except Exception as exc:  # noqa: BLE001 - tried again next cycle, state kept
                log.error("job %s: storing its end failed: %s: %s", job, type(exc).__name__, exc)
                continue
            log.info("job %s: ended (no point for %gs); %d incident(s) closed, its state released", job,
                     self.cfg.job_idle_s, len(out.incidents))
            report.incidents += list(out.incidents.values())
            report.ended.append(job)
            self.life.released(job, end)
            for held in (self.analyzers, self.readers, self.rollups, *self.kernels.per_job()):
                held.pop(job, None)

    def stored_incidents(self, job: str | None = None) -> list[Incident]:
        """Every incident of the analyzed jobs as the store holds them (also those resolved
        long ago, which the analyzers no longer keep in memory), oldest onset first."""
        out = [i for name in sorted(self.analyzers) if job is None or name == job
               for i in load_incidents(self.store, name)]
        return sorted(out, key=lambda i: (i.job, i.onset_ms, i.id))

    def incidents(self, job: str | None = None) -> list[Incident]:
        out = [i for name, ja in self.analyzers.items() if job is None or name == job for i in ja.incidents()]
        return sorted(out, key=lambda i: (i.job, i.onset_ms, i.id))
