"""L3 in the analyzer's cycle: each job's kernel windows stored since the last cycle, scored, written.

It runs every cycle beside L1 and L2, also when they see nothing (a collective slowed but hidden
by overlap leaves the iteration time flat). A window is scored once all of it is in: a later
window has begun and it holds every rank, or two later windows have begun (a ``final`` cycle, or
a job that ended, scores the last ones too). Its findings are
``l3_kernel`` points, keyed by the window's time, rank and kernel: a window scored again writes
the same points. A fresh analyzer scores the windows of the stretch its reader replays (from the
predecessor's last ``history`` iterations; a job never analyzed, from its first window).

A finding carries ``windows``, how many windows in a row (of those this analyzer scored) the
rank stood out in that kernel, and ``confirmed`` (1 from ``PERSIST`` windows on): one window
of a rank whose thread shared a core a while is a finding, not yet a verdict.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from analyzer.job_analyzer import JobAnalyzer
from analyzer.score.kernel_scores import kernel_columns, kernel_findings
from analyzer.write.outputs import CycleOutputs
from rankscope import schema
from rankscope.incident import Incident
from rankscope.store import Store

log = logging.getLogger(__name__)

#: Kernel points are read again from this far before the newest window scored (late points, the
#: ranks' own clocks); points of one window further apart than ``GAP_MS`` are two windows (a
#: restart that re-runs the same iteration numbers).
LATE_MS = 600_000
GAP_MS = 300_000
#: Windows in a row a rank must stand out in a kernel for the finding to be confirmed.
PERSIST = 2
#: Launch-gap findings kept per job, matched again against the stalls that come later.
KEEP_GAPS = 2000
#: Causes that can be confirmed: a compute kernel's own slowness, a collective's link.
CONFIRMABLE = ("own", "link")
IT = schema.ITERATION_FIELD


class KernelCycle:
    """Per job, the newest window scored (its newest point's time), the kernels' names and the
    findings' streaks (released with the job's other state when it ends: the service pops them)."""

    def __init__(self, store: Store):
        self.store = store
        self.done: dict[str, int] = {}                  # job -> newest point time of the newest scored window
        self.names: dict[str, dict[str, tuple[str, str, str]]] = {}
        # job -> (rank, kernel) -> (the window's number, windows in a row); job -> windows scored
        self.streaks: dict[str, dict[tuple[int, str], tuple[int, int]]] = {}
        self.windows: dict[str, int] = {}
        self.gaps: dict[str, pd.DataFrame] = {}                 # job -> its latest launch-gap findings
        self.unwritten: dict[str, dict[str, Incident]] = {}     # job -> incidents changed, not yet written

    def run(self, job: str, ja: JobAnalyzer, final: bool = False, reader: object = None) -> int:
        """Score the job's complete windows not scored yet; how many findings were written. The
        findings go to the job's analyzer too (:meth:`JobAnalyzer.note_kernels`: host-side
        stalls, the kernels of its incidents); the incidents that changed are written again.
        ``reader``: the job's stage reader (a fresh analyzer starts where its replay starts; its
        segments turn a window's iteration into the analyzer's step after a restart).
        A failure to read or write is logged and tried again next cycle, with the streaks as they
        were: L3 never holds up L1 and L2, and a retry counts no window twice."""
        try:
            found = self._score(job, ja, final, reader)
            self._explain(job, ja, found)
            return len(found)
        except Exception as exc:  # noqa: BLE001 - logged; the windows are scored next cycle
            log.error("job %s: kernel analysis (L3) failed: %s: %s", job, type(exc).__name__, exc)
            return 0

    def _score(self, job: str, ja: JobAnalyzer, final: bool, reader: object) -> pd.DataFrame:
        """The findings of the complete windows not scored yet, written, with the analyzer's step
        of each window's last iteration (``step``) and its ``steps``."""
        frame = self._read(job, getattr(getattr(reader, "replay", None), "cursor_ms", None))
        if not len(frame) or IT not in frame.columns:
            until = getattr(reader, "read_until", None)
            if until is not None and job not in self.done:   # none yet: later reads start near the stages'
                self.done[job] = int(until) - LATE_MS
            return pd.DataFrame()
        todo = ready_windows(frame, self.done.get(job), final, ja.topo.world)
        names = self._names(job, set(kernel_columns(frame.columns)))
        held, n = dict(self.streaks.get(job, {})), self.windows.get(job, 0)
        found = []
        for it, w in todo:
            try:
                f = kernel_findings(w, names, ja.topo)
            except Exception as exc:  # noqa: BLE001 - a window the data makes unscorable: skipped, said
                log.error("job %s: kernel window of iteration %d skipped: %s: %s", job, it, type(exc).__name__, exc)
                f = kernel_findings(w.iloc[:0], names, ja.topo)
            n += 1
            f = streaks(held, n, f)
            if len(f):
                steps = pd.to_numeric(w["steps"], errors="coerce").max() if "steps" in w else 1
                found.append(f.assign(time=int(w["time"].max()), job=job, iteration=int(it),
                                      steps=int(steps) if steps >= 1 else 1,
                                      step=int(it) + step_offset(reader, int(w["time"].min()))))
        rows = pd.concat(found, ignore_index=True) if found else pd.DataFrame()
        if len(rows):
            self.store.write_measurement(schema.L3_KERNEL, rows.drop(columns=["steps", "step"]))
        if todo:   # stored: the streaks and the cursor move on
            self.streaks[job], self.windows[job] = held, n
            self.done[job] = int(todo[-1][1]["time"].max())
        return rows

    def _explain(self, job: str, ja: JobAnalyzer, found: pd.DataFrame) -> None:
        """The findings to the job's analyzer (the launch gaps of the last ``KEEP_GAPS`` findings
        again: a stall whose incident comes later is still explained); the incidents it changed
        written, kept until they are."""
        if len(found) and (found["kernel"] == "launch_gap").any():
            gaps = pd.concat([self.gaps.get(job, pd.DataFrame()), found[found["kernel"] == "launch_gap"]])
            self.gaps[job] = gaps.tail(KEEP_GAPS)
        pending = self.unwritten.setdefault(job, {})
        pending.update({i.id: i for i in ja.note_kernels(found, self.gaps.get(job, pd.DataFrame()))})
        if pending:
            CycleOutputs(incidents=dict(pending)).write(self.store)   # incident and incident_host
            pending.clear()

    def per_job(self) -> tuple[dict, ...]:
        """Every per-job state held (released when the job ends)."""
        return self.done, self.names, self.streaks, self.windows, self.gaps, self.unwritten

    def _read(self, job: str, since_ms: int | None) -> pd.DataFrame:
        if job in self.done:
            start = self.done[job] - LATE_MS
        else:
            start = None if since_ms is None else since_ms - LATE_MS
        return self.store.read(schema.KERNEL_STATS, job, start_ms=start)

    def _names(self, job: str, needed: set[str]) -> dict[str, tuple[str, str, str]]:
        """The names of the job's kernels, read again only when one is not known yet."""
        names = self.names.setdefault(job, {})
        if needed <= names.keys():
            return names
        stored = self.store.read(schema.KERNEL_NAME, job)
        if len(stored):
            group = stored["group"].fillna("").astype(str) if "group" in stored.columns else pd.Series("", stored.index)
            for kid, name, kind, coll in zip(stored["kernel"], stored["name"], stored["kind"], group, strict=True):
                names[str(kid)] = (str(name), str(kind), coll)
        return names


def step_offset(reader: object, time_ms: int) -> int:
    """What turns a framework iteration stamped at ``time_ms`` into the analyzer's step: the
    offset of the reader's segment (restart) that began last at or before it; 0 without one."""
    segments = getattr(getattr(reader, "attempts", None), "segments", None) or []
    before = [seg for seg in segments if seg.start_ms <= time_ms]
    return int(before[-1].offset) if before else 0


def ready_windows(frame: pd.DataFrame, done_ms: int | None, final: bool,
                  world: int) -> list[tuple[int, pd.DataFrame]]:
    """The windows of ``frame`` to score now, oldest first: newer than ``done_ms``, and complete (a
    newer one begun and all ``world`` ranks in, or two newer ones begun; a ``final`` cycle takes
    every one). A window is the points of one iteration number lying within ``GAP_MS`` of each
    other: a restart that runs the same numbers again makes new windows."""
    its = pd.to_numeric(frame[IT], errors="coerce")
    frame = frame[its.notna()].assign(**{IT: its[its.notna()].astype("int64")}).sort_values([IT, "time"])
    t = frame["time"].to_numpy(np.int64)
    it = frame[IT].to_numpy()
    cut = np.r_[True, (it[1:] != it[:-1]) | (np.diff(t) > GAP_MS)]
    groups = [g for _, g in frame.groupby(np.cumsum(cut), sort=False)]
    groups.sort(key=lambda g: int(g["time"].max()))
    out = []
    for k, g in enumerate(groups):
        if done_ms is not None and int(g["time"].max()) <= done_ms:
            continue
        if final or g["rank"].nunique() >= world and k < len(groups) - 1 or k < len(groups) - 2:
            out.append((int(g[IT].iloc[0]), g))
        else:
            break   # the rest wait for this one: windows are scored in order
    return out


def streaks(held: dict[tuple[int, str], tuple[int, int]], n: int, found: pd.DataFrame) -> pd.DataFrame:
    """``windows`` and ``confirmed`` of window ``n``'s findings, ``held`` (rank, kernel -> last
    window flagged, run) moved on; a cause other than own or link is never confirmed."""
    runs = []
    for key in zip(found["rank"].astype(int), found["kernel"].astype(str), strict=True):
        seen, run = held.get(key, (0, 0))
        held[key] = (n, run + 1 if seen == n - 1 else 1)
        runs.append(held[key][1])
    for key in [k for k, (seen, _) in held.items() if seen < n]:
        del held[key]
    ok = found["cause"].isin(CONFIRMABLE).to_numpy() if len(found) else np.zeros(0, dtype=bool)
    return found.assign(windows=runs, confirmed=((np.asarray(runs) >= PERSIST) & ok).astype(int))
