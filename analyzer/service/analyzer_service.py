"""One analyzer cycle: read what is new, feed the job analyzers, write the results back.

Each cycle, per job:

1. **read**: the job's :class:`~analyzer.read.iteration_reader.IterationReader` (the only
   reader of ``stage_latency``) finds the new points, from a margin before the newest point
   read (late writers), and hands on whole iterations, a chunk at a time; the job's events
   are read once;
2. **feed**: the iterations to the job's :class:`~analyzer.job_analyzer.JobAnalyzer`, started
   from the layout of its first iterations, following the placement the rows describe;
3. **write**: ``l1_changepoint``, ``l2_group``, ``l2_rank``, ``job_health``, ``incident`` and
   ``incident_host`` points, and the rollups of the iterations processed (``rollup_host``,
   ``rollup_job``, and the ``rollup_host_5m`` windows and ``rollup_host_1h`` hours closed,
   made in memory: :mod:`analyzer.write.outputs`), all keyed by time and tags, so a re-run
   writes the same points again. Iterations written while no analyzer ran are rolled up by
   ``rankscope rollup``.

A cycle is a unit: its cursor moves on only once what it analyzed is stored. When a read or a
write fails (the database down, hung or restarted), the outputs of the iterations it fed stay
pending (the analyzer's state cannot be taken back, and need not be: an iteration is fed
once, whatever is read again), the cursor goes back to where the cycle began, and the next
cycle first stores the outputs of a cycle that analyzed all it read, as they were, then
reads again; a cycle that failed before it analyzed all it read leaves its outputs to the
next, which adds its own (its L2 and health points are those of the state it ends in).

After a restart the state is rebuilt from the database: the job's incidents
are read back (an open one keeps its id; the diagnosis joins the re-detected
culprits to it rather than opening a second one), the last ``history``
iterations are replayed to warm the detectors up, and the ``rollup_host_5m``
windows its predecessor stored are read once, from the hour of the first window
to write (:meth:`~analyzer.write.outputs.JobRollups.resume`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
from tqdm import tqdm

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.event_verdicts import OutOfBandEvent
from analyzer.job_analyzer import JobAnalyzer
from analyzer.read.iteration_reader import IT, LATE_MARGIN_MS, IterationReader
from analyzer.read.read_size import MAX_READ_ROWS
from analyzer.service.shards import Shard
from analyzer.write.outputs import CycleOutputs, JobRollups
from rankscope.frames import frame_to_cube
from rankscope.incident import Incident, load_incidents
from rankscope.schema import StageSet
from rankscope.store import Store
from rankscope.topology import Topology

log = logging.getLogger(__name__)


@dataclass
class CycleReport:
    """What one cycle did, per job."""

    iterations: dict[str, int] = field(default_factory=dict)
    changepoints: int = 0
    incidents: list[Incident] = field(default_factory=list)
    read_s: float = 0.0
    analyze_s: float = 0.0
    write_s: float = 0.0


class AnalyzerService:
    """Keeps a :class:`JobAnalyzer` per job and runs cycles against a store."""

    def __init__(self, store: Store, config: AnalyzerConfig | None = None, stages: StageSet | None = None,
                 jobs: list[str] | None = None, topology: Topology | None = None,
                 chunk_iterations: int = 20, progress: bool = False,
                 clock: Callable[[], float] = time.time, max_read_rows: int = MAX_READ_ROWS,
                 shard: Shard | None = None):
        self.store = store
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
        """One pass over every job. ``final`` also processes a possibly incomplete last iteration."""
        report = CycleReport()
        failed: list[str] = []
        for job in self._jobs():
            try:
                self._cycle_job(job, report, final)
            except Exception as exc:  # noqa: BLE001 - one job's trouble must not stop the others
                log.error("job %s: analysis failed: %s: %s", job, type(exc).__name__, exc)
                failed.append(f"{job} ({type(exc).__name__}: {exc})")
        if failed:
            raise RuntimeError(f"the analysis of {len(failed)} job(s) failed, the others went on: "
                               + "; ".join(failed))
        return report

    def _cycle_job(self, job: str, report: CycleReport, final: bool) -> None:
        """Store what a failed cycle analyzed, then read, feed, write. Nothing is taken as done
        before it is stored: on any failure the outputs made stay pending and the cursor goes
        back to where the cycle began."""
        reader = self.readers.get(job) or self.readers.setdefault(
            job, IterationReader(self.store, job, self.chunk, self.max_read_rows))
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
        """Every chunk of whole iterations the reader hands on, fed and rolled up."""
        with tqdm(desc=f"analyze {job}", unit="it", disable=None if self.progress else True, leave=False,
                  dynamic_ncols=True) as bar:
            for ready in reader.chunks(final, self.clock):
                before = out.iterations
                ja = self._feed(job, reader, ready, out, report)
                bar.update(out.iterations - before)
                bar.set_postfix_str(f"iteration {ja.last_iteration}", refresh=False)
        reader.log_late()
        report.read_s += reader.read_s

    def _store(self, job: str, out: CycleOutputs, report: CycleReport, final: bool) -> None:
        """The rollups held and the windows closed (by the data and the clock: a job that ended
        or hangs still gets its last ones), then what the cycle analyzed, ``l2_group`` last."""
        ja, rollups = self.analyzers[job], self.rollups.get(job)
        t0 = time.perf_counter()
        if rollups is not None:
            rollups.flush(self.store, ja.last_time_ms, int(self.clock() * 1000), final, force=True)
        if out.complete:
            out.write(self.store)
            report.iterations[job] = report.iterations.get(job, 0) + out.iterations
            report.changepoints += len(out.changepoints)
            report.incidents += list(out.incidents.values())
        report.write_s += time.perf_counter() - t0

    def _feed(self, job: str, reader: IterationReader, ready: pd.DataFrame, out: CycleOutputs,
              report: CycleReport) -> JobAnalyzer:
        """Analyze the whole iterations of ``ready`` not analyzed yet and roll them up; returns
        the job's analyzer. What reads (the analyzer's start, the events, a restart's windows)
        comes before the iterations are fed."""
        ja = self._analyzer(job, reader, ready)
        events = reader.events(ja, ja.event_horizon_ms)   # once a cycle
        if events:   # a known event read again replaces itself
            ja.add_events([OutOfBandEvent.from_row(r) for r in events])
        ready = ready[ready[IT].to_numpy() > ja.last_iteration]   # a chunk handed on again: what is new
        if not len(ready):
            return ja
        cube = frame_to_cube(ready, ja.topo.world, ja.stages.names)
        rollups = self._rollups(job, reader, ja, cube)
        t0 = time.perf_counter()
        out.add(ja.feed(cube))
        reader.analyzed(ja.reporting_ranks, ja.last_iteration, ja.topo.world)
        rollups.add(ja.topo, cube)
        t1 = time.perf_counter()
        rollups.flush(self.store, ja.last_time_ms)   # only once it holds many rows: bounded memory
        report.analyze_s += t1 - t0
        report.write_s += time.perf_counter() - t1
        return ja

    # --------------------------------------------------------------- start
    def _analyzer(self, job: str, reader: IterationReader, ready: pd.DataFrame) -> JobAnalyzer:
        """The job's analyzer for ``ready``: started from the first iterations; following the
        placement the rows describe (a replaced node, a scheduler's own placement); a new one
        when the layout itself changed (a job resized under the same name), which takes over
        the job's stored incidents."""
        ja = self.analyzers.get(job)
        if ja is None:
            return self._start_job(job, self.topology or reader.topology(ready),
                                   self.stages or reader.stages(ready, held=True))
        if self.topology is not None:
            return ja
        topo = reader.placement(ready, ja.topo)
        if topo is None:
            return ja
        if topo == ja.topo:   # the same layout (hosts are not compared): the ranks elsewhere
            ja.replace_placement(topo)
            return ja
        log.warning("job %s: the parallel layout changed (%s -> %s); a new analyzer takes over", job, ja.topo, topo)
        fresh = self._start_job(job, topo, self.stages or reader.stages(ready))
        fresh.last_iteration = ja.last_iteration
        return fresh

    def _start_job(self, job: str, topo: Topology, stages: StageSet) -> JobAnalyzer:
        stored = load_incidents(self.store, job)   # read first: no analyzer without its incidents
        ja = self.analyzers[job] = JobAnalyzer(job, topo, stages, self.cfg)
        ja.adopt(stored)
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

    def stored_incidents(self, job: str | None = None) -> list[Incident]:
        """Every incident of the analyzed jobs as the store holds them (also those resolved
        long ago, which the analyzers no longer keep in memory), oldest onset first."""
        out = []
        for name in sorted(self.analyzers):
            if job is None or name == job:
                out += load_incidents(self.store, name)
        return sorted(out, key=lambda i: (i.job, i.onset_ms, i.id))

    def incidents(self, job: str | None = None) -> list[Incident]:
        out = []
        for name, ja in self.analyzers.items():
            if job is None or name == job:
                out += ja.incidents()
        return sorted(out, key=lambda i: (i.job, i.onset_ms, i.id))


def run_once(store: Store, job: str | None = None, topology: Topology | None = None,
             config: AnalyzerConfig | None = None, stages: StageSet | None = None,
             progress: bool = False) -> list[dict]:
    """One cycle over everything stored; the incidents (``to_json`` dicts) it knows of."""
    svc = AnalyzerService(store, config, stages, jobs=[job] if job else None, topology=topology,
                          progress=progress)
    svc.cycle(final=True)
    return [i.to_json() for i in svc.stored_incidents(job)]
