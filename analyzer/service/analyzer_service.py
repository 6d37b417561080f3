"""One analyzer cycle: read what is new, feed the job analyzers, write the results back.

The analyzer's I/O, through the store (the rollups it writes from stored points are in
:mod:`analyzer.write.rollup_backfill`). Each cycle, per job:

1. find the new ``stage_latency`` points by time (from a margin before the newest point read,
   for late writers), in chunks of about ``chunk_iterations`` iterations (fewer in a job so
   large that a read would outgrow :data:`~analyzer.read.read_size.MAX_READ_ROWS`), and read contiguous
   time ranges: each rank stamps its own clock, so one iteration's points spread over
   milliseconds to seconds;
2. assemble whole iterations by their ``iteration`` field (:mod:`analyzer.read.iteration_assembler`): an
   iteration goes on when every rank reported or after a bounded wait
   (``iteration_wait_s``), so a half-written iteration or a skewed host does not look like
   silent ranks, and the topology is inferred from whole iterations only;
3. feed them to the job's :class:`~analyzer.job_analyzer.JobAnalyzer`;
4. write ``l1_changepoint``, ``l2_group``, ``l2_rank`` and ``incident`` points, and the
   rollups of the iterations it processed (``rollup_host``, ``rollup_job``, ``incident_host``:
   :mod:`analyzer.write.rollups`) and ``rollup_host_5m`` for each 5-minute window once it closed
   by the data or the clock (read back from ``rollup_host``) with the ``rollup_host_1h`` hour
   it falls in (read back from the windows), all keyed by time and tags,
   so a re-run writes the same points again. Iterations written while no analyzer ran are
   rolled up by ``rankscope rollup``.

After a restart the state is rebuilt from the database: the job's incidents
are read back (an open one keeps its id; the diagnosis joins the re-detected
culprits to it rather than opening a second one) and the last ``history``
iterations are replayed to warm the detectors up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from tqdm import tqdm

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.event_verdicts import OutOfBandEvent
from analyzer.job_analyzer import JobAnalyzer
from analyzer.read.iteration_assembler import IterationAssembler
from analyzer.read.read_size import MAX_READ_ROWS, iterations_per_read
from analyzer.write.rollup_backfill import write_windows
from analyzer.write.rollups import closed_windows, incident_host_frame, rollup_frames, window_span
from rankscope import schema
from rankscope.frames import frame_to_cube
from rankscope.incident import Incident, incidents_frame, load_incidents
from rankscope.schema import DEFAULT_STAGES, StageSet
from rankscope.store import Store
from rankscope.topology import Topology, TopologyError
from rankscope.topology_inference import infer_topology

log = logging.getLogger(__name__)

#: Late points of an iteration are looked for this far before the last one processed.
LATE_MARGIN_MS = 120_000


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
        self.assemblers: dict[str, IterationAssembler] = {}   # whole iterations out of the points
        self.read_until: dict[str, int] = {}   # time (ms) of the newest point read
        self._late_logged: dict[str, int] = {}
        self.windows_done: dict[str, int] = {}   # end (ms) of the rollup_host_5m windows written

    # --------------------------------------------------------------- start
    def _start_job(self, job: str, first: pd.DataFrame) -> JobAnalyzer:
        topo = self.topology or _topology_of(first)
        stages = self.stages or _stages_of(first.columns)
        ja = JobAnalyzer(job, topo, stages, self.cfg)
        ja.adopt(load_incidents(self.store, job))
        log.info("job %s: %d ranks (tp=%d pp=%d dp=%d ep=%d), %d stages", job, topo.world, topo.tp,
                 topo.pp, topo.dp, topo.ep, len(stages))
        return ja

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
        ja = self.analyzers.get(job)
        asm = self.assemblers.get(job)
        cut = False   # the first read starts inside the data: its oldest iteration may be partial
        if asm is None:
            asm = self.assemblers[job] = IterationAssembler(int(self.cfg.iteration_wait_s * 1000))
        if job not in self.read_until:   # nothing read yet (or the first cycle failed)
            cursor = self._replay_start(job)
            cut = cursor is not None
        else:   # again from a margin before what was read: points written late are read too
            cursor = self.read_until[job] - LATE_MARGIN_MS
        asm.wait_ms = int(self.cfg.iteration_wait_s * 1000)
        changed: dict[str, Incident] = {}
        cps = []
        n_iters = 0
        first_ms: int | None = None
        bar = tqdm(desc=f"analyze {job}", unit="it", disable=None if self.progress else True, leave=False,
                   dynamic_ncols=True)
        tail = False
        while not tail:
            t0 = time.perf_counter()
            # which points are new, by time; the probe series gives about one time per iteration
            # one iteration at a time until the job's size is known from a whole iteration
            n = iterations_per_read(ja.topo.world if ja is not None else None, self.chunk, self.max_read_rows)
            times = self.store.next_times(schema.STAGE_LATENCY, job, cursor, n)
            tail = len(times) < n   # then read on to the newest point of any rank
            if tail and cursor is None and not times:
                break
            start = None if cursor is None else cursor + 1
            frame = self.store.read_stage_latency(job, start_ms=start, end_ms=None if tail else times[-1])
            report.read_s += time.perf_counter() - t0
            if len(frame):
                cursor = max(int(frame["time"].max()), cursor if cursor is not None else int(frame["time"].max()))
                if cut:   # the oldest iteration read is partial: it, and the rest of it read later, go
                    asm.skip_through(int(frame[schema.ITERATION_FIELD].min()))
                    cut = False
            elif times:
                cursor = times[-1]
            self.read_until[job] = cursor if cursor is not None else self.read_until.get(job, 0)
            if ja is not None:
                asm.last_iteration = max(asm.last_iteration, ja.last_iteration)
            asm.add(frame)
            now = int(self.clock() * 1000) if tail else None   # the clock counts once all is read
            ready = asm.ready(ja.reporting_ranks or None if ja is not None else None, now, final and tail)
            if not len(ready):
                continue
            if ja is None:
                ja = self.analyzers[job] = self._start_job(job, pd.concat([ready, asm.pending()]))
            ja = self._follow_placement(ja, ready)
            self._read_events(job, ja)
            t1 = time.perf_counter()
            cube = frame_to_cube(ready, ja.topo.world, ja.stages.names)
            first_ms = int(cube.times.min()) if first_ms is None else first_ms
            res = ja.feed(cube)
            report.analyze_s += time.perf_counter() - t1
            t2 = time.perf_counter()
            for name, rolled in rollup_frames(job, ja.topo, cube).items():   # chunk by chunk: bounded memory
                self.store.write_measurement(name, rolled)
            report.write_s += time.perf_counter() - t2
            cps += res.changepoints
            for inc in res.incidents:
                changed[inc.id] = inc
            n_iters += len(res.iterations)
            bar.update(len(res.iterations))
            bar.set_postfix_str(f"iteration {ja.last_iteration}", refresh=False)
        bar.close()
        if asm.counts.late_rows and asm.counts.late_rows != self._late_logged.get(job, 0):
            log.info("job %s: %d point(s) arrived after their iteration was analyzed (ignored)",
                     job, asm.counts.late_rows)
            self._late_logged[job] = asm.counts.late_rows
        if ja is None:
            return
        t2 = time.perf_counter()
        # windows close by the clock too: a job that ended or hangs still gets its last ones
        self._write_windows(job, ja, first_ms, final)
        report.write_s += time.perf_counter() - t2
        if not n_iters:
            return
        report.iterations[job] = n_iters
        t2 = time.perf_counter()
        self._write(ja, cps, list(changed.values()))
        report.write_s += time.perf_counter() - t2
        report.changepoints += len(cps)
        report.incidents += list(changed.values())

    def _write_windows(self, job: str, ja: JobAnalyzer, first_ms: int | None, final: bool) -> None:
        """``rollup_host_5m`` for every window that has closed since the last cycle and every
        closed one this cycle's iterations fell into (late points), read back from ``rollup_host``,
        and ``rollup_host_1h`` for the hours they fall in.

        A window closes when the newest iteration or the clock is ``LATE_MARGIN_MS`` past its
        end, so a job that ended or hangs gets its last windows too. A fresh analyzer (a restart)
        starts from the latest window stored, so the windows of the downtime that the replay
        rolled up are written too. A final cycle also writes the open window; a later cycle
        rewrites it whole."""
        w = schema.ROLLUP_WINDOW_MS
        done = self.windows_done.get(job)
        if done is None:
            stored = self.store.latest_times(schema.ROLLUP_HOST_WINDOW, job, 1)
            starts = [t for t in (first_ms, stored[-1] if stored else None) if t is not None]
            if not starts:
                return
            done = min(starts)
        since = min(done, first_ms) if first_ms is not None else done
        last_window_end = window_span(ja.last_time_ms, ja.last_time_ms, w)[1]   # none after the newest's
        newest = min(max(ja.last_time_ms, int(self.clock() * 1000)), last_window_end + LATE_MARGIN_MS)
        start, closed = closed_windows(since, newest, LATE_MARGIN_MS, w)
        write_windows(self.store, job, start, last_window_end if final else closed, w)
        self.windows_done[job] = max(done // w * w, closed)

    def _follow_placement(self, ja: JobAnalyzer, frame: pd.DataFrame) -> JobAnalyzer:
        """When the hosts the ranks report put them elsewhere than the analyzer thinks (a
        replaced node, a scheduler's own placement), follow the data; a job whose layout itself
        changed (resized under the same name) gets a new analyzer, which takes over its stored
        incidents. Returns the job's analyzer from now on."""
        if "host" not in frame.columns or not len(frame) or self.topology is not None:
            return ja
        # each rank's newest row: dropped points leave hardly any iteration with every rank
        last = frame.drop_duplicates("rank", keep="last")
        if len(last) < ja.topo.world:
            return ja   # not every rank seen: that does not describe the placement
        try:
            topo = _topology_of(last)
        except TopologyError as exc:
            log.warning("job %s: host tags do not describe a placement (%s); keeping the old one", ja.job, exc)
            return ja
        if topo != ja.topo:   # tp, pp, dp, ep, gpus_per_node or order differ (hosts are not compared)
            log.warning("job %s: the parallel layout changed (%s -> %s); a new analyzer takes over",
                        ja.job, ja.topo, topo)
            fresh = self.analyzers[ja.job] = self._start_job(ja.job, last)
            fresh.last_iteration = ja.last_iteration
            return fresh
        if not ja.topo.same_placement(topo):
            moved = np.flatnonzero(ja.topo.node_index != topo.node_index)
            if len(moved):
                log.warning("job %s: rank placement changed (%d rank(s) on other nodes; hosts now %s...)",
                            ja.job, len(moved), ", ".join((topo.hosts or ())[:3]))
            else:   # same nodes, their names now complete (the first iteration lacked some ranks)
                log.info("job %s: host names of the placement updated (no rank moved; hosts now %s...)",
                         ja.job, ", ".join((topo.hosts or ())[:3]))
            ja.replace_placement(topo)
        return ja

    def _read_events(self, job: str, ja: JobAnalyzer) -> None:
        """The job's events and the cluster's (matched by host) that can still matter, read
        again each time: monitoring posts late (Alertmanager's group_wait) and resolves later."""
        ev = self.store.read_events(job, start_ms=ja.event_horizon_ms())
        if len(ev):
            ja.add_events([OutOfBandEvent.from_row(r) for r in ev.to_dict("records")])

    def _replay_start(self, job: str) -> int | None:
        """Where a fresh analyzer starts reading: everything, or the last ``history`` iterations
        when the job has been analyzed before (a restart)."""
        if not self.store.latest_times(schema.L2_GROUP, job, 1):   # never analyzed
            return None
        times = self.store.latest_times(schema.STAGE_LATENCY, job, self.cfg.history)
        return times[-1] - 1 if times else None

    def _write(self, ja: JobAnalyzer, cps, incidents: list[Incident]) -> None:
        if cps:
            self.store.write_measurement(schema.L1_CHANGEPOINT, pd.DataFrame([c.to_row() for c in cps]))
        g, r = ja.l2_frames()
        if len(g):
            self.store.write_measurement(schema.L2_GROUP, g)
        if len(r):
            self.store.write_measurement(schema.L2_RANK, r)
        late = self.assemblers[ja.job].counts.late_rows if ja.job in self.assemblers else 0
        self.store.write_measurement(schema.JOB_HEALTH, pd.DataFrame([ja.health_row(late)]))
        if incidents:
            self.store.write_measurement(schema.INCIDENT, incidents_frame(incidents))
            self.store.write_measurement(schema.INCIDENT_HOST, incident_host_frame(incidents))

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


def _topology_of(frame: pd.DataFrame) -> Topology:
    """The topology (and, from ``host`` tags, the placement) that the rows' tags describe."""
    hosts = frame["host"] if "host" in frame.columns else None
    return infer_topology(frame["rank"], frame["tp"], frame["pp"], frame["dp"], frame["ep_group"],
                          frame["node"], host=hosts)


def _stages_of(columns) -> StageSet:
    """The known stages present in the data: the default set's and the model-agnostic trace
    set's (``schema.TRACE_STAGES``, what ``import-trace`` writes); unknown columns are ignored
    with a warning."""
    cols = set(schema.stage_fields(columns))
    known = [s for s in (*DEFAULT_STAGES, *schema.TRACE_STAGES) if s.name in cols]
    unknown = cols - {s.name for s in known}
    if unknown:
        log.warning("ignoring stage field(s) the analyzer has no declaration for: %s "
                    "(declare them in the [stages] table of --config)", ", ".join(sorted(unknown)))
    if not known:
        raise ValueError("no known stage field in stage_latency; declare the stages in --config")
    return StageSet(tuple(known))


def run_once(store: Store, job: str | None = None, topology: Topology | None = None,
             config: AnalyzerConfig | None = None, stages: StageSet | None = None,
             progress: bool = False) -> list[dict]:
    """One cycle over everything stored; the incidents (``to_json`` dicts) it knows of."""
    svc = AnalyzerService(store, config, stages, jobs=[job] if job else None, topology=topology,
                          progress=progress)
    svc.cycle(final=True)
    return [i.to_json() for i in svc.stored_incidents(job)]
