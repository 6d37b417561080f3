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

After a restart the state is rebuilt from the database: the job's incidents
are read back (an open one keeps its id; the diagnosis joins the re-detected
culprits to it rather than opening a second one), the last ``history``
iterations are replayed to warm the detectors up, and the iterations before them
that share rollup windows with them are read for those windows.
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
from analyzer.read.iteration_reader import LATE_MARGIN_MS, IterationReader
from analyzer.read.read_size import MAX_READ_ROWS
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
                 clock: Callable[[], float] = time.time, max_read_rows: int = MAX_READ_ROWS):
        self.store = store
        self.cfg = config or AnalyzerConfig()
        self.stages = stages
        self.jobs = jobs
        self.topology = topology
        self.chunk = chunk_iterations
        self.max_read_rows = max_read_rows
        self.progress = progress
        self.clock = clock   # wall clock (s): closes the windows of a job that stopped writing
        self.analyzers: dict[str, JobAnalyzer] = {}
        self.readers: dict[str, IterationReader] = {}   # each job's stage_latency, whole iterations
        self.rollups: dict[str, JobRollups] = {}        # each job's rollups, windows made in memory

    def reconfigure(self, cfg: AnalyzerConfig) -> None:
        """New thresholds for every job from the next cycle on, no state lost."""
        self.cfg = cfg
        for ja in self.analyzers.values():
            ja.reconfigure(cfg)

    def _jobs(self) -> list[str]:
        return self.jobs if self.jobs else self.store.jobs()

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
        """Read, feed, write."""
        reader = self.readers.get(job) or self.readers.setdefault(
            job, IterationReader(self.store, job, self.chunk, self.max_read_rows))
        reader.resume(self.cfg.history, int(self.cfg.iteration_wait_s * 1000))
        out = CycleOutputs()
        with tqdm(desc=f"analyze {job}", unit="it", disable=None if self.progress else True, leave=False,
                  dynamic_ncols=True) as bar:
            for ready in reader.chunks(final, self.clock):
                before = out.iterations
                ja = self._feed(job, reader, ready, out, report)
                bar.update(out.iterations - before)
                bar.set_postfix_str(f"iteration {ja.last_iteration}", refresh=False)
        reader.log_late()
        report.read_s += reader.read_s
        ja = self.analyzers.get(job)
        if ja is None:
            return
        t0 = time.perf_counter()
        # windows close by the clock too: a job that ended or hangs still gets its last ones
        self.rollups[job].flush(self.store, ja.last_time_ms, int(self.clock() * 1000), final, force=True)
        if out.iterations:
            out.write(self.store, ja.l2_frames(), ja.health_row(reader.counts.late_rows))
            report.iterations[job] = out.iterations
            report.changepoints += len(out.changepoints)
            report.incidents += list(out.incidents.values())
        report.write_s += time.perf_counter() - t0

    def _feed(self, job: str, reader: IterationReader, ready: pd.DataFrame, out: CycleOutputs,
              report: CycleReport) -> JobAnalyzer:
        """Analyze the whole iterations of ``ready`` and roll them up; returns the job's analyzer."""
        ja = self._analyzer(job, reader, ready)
        events = reader.events(ja, ja.event_horizon_ms)   # once a cycle
        if events:
            ja.add_events([OutOfBandEvent.from_row(r) for r in events])
        t0 = time.perf_counter()
        cube = frame_to_cube(ready, ja.topo.world, ja.stages.names)
        out.add(ja.feed(cube))
        reader.analyzed(ja.reporting_ranks, ja.last_iteration, ja.topo.world)
        t1 = time.perf_counter()
        rollups = self._rollups(job, reader, ja, cube)
        rollups.add(ja.topo, cube)
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
        ja = self.analyzers[job] = JobAnalyzer(job, topo, stages, self.cfg)
        ja.adopt(load_incidents(self.store, job))
        log.info("job %s: %d ranks (tp=%d pp=%d dp=%d ep=%d), %d stages", job, topo.world, topo.tp,
                 topo.pp, topo.dp, topo.ep, len(stages))
        return ja

    def _rollups(self, job: str, reader: IterationReader, ja: JobAnalyzer, cube) -> JobRollups:
        """The job's rollups. A restarted analyzer starts its windows at the latest one stored
        (its predecessor's), with the predecessor's iterations that share windows or hours
        with the replayed ones, read again for them."""
        rollups = self.rollups.get(job)
        if rollups is not None:
            return rollups
        rollups = self.rollups[job] = JobRollups(job, LATE_MARGIN_MS)
        if reader.replay is None:   # never analyzed: every iteration is read
            return rollups
        since = rollups.resume(self.store, int(cube.times.min()), reader.replay.analyzed_ms)
        topo = None
        for frame in reader.before_replay(since):
            topo = self.topology or reader.chunk_topology(frame, topo or ja.topo)
            rollups.add(topo, frame_to_cube(frame, topo.world, ja.stages.names), write=False)
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
