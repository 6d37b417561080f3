"""L3 in the analyzer's cycle: each job's kernel windows stored since the last cycle, scored, written.

It runs every cycle beside L1 and L2, also when they see nothing (a collective slowed but hidden
by overlap leaves the iteration time flat). A window is scored once all of it is in: when a
later window of the job has begun (a ``final`` cycle scores the last one too). Its findings are
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

from analyzer.score.kernel_scores import kernel_columns, kernel_findings
from rankscope import schema
from rankscope.store import Store
from rankscope.topology import Topology

log = logging.getLogger(__name__)

#: How far before a replay's start a window's points are read (the ranks stamp their own clocks).
SKEW_MS = 60_000
#: Windows in a row a rank must stand out in a kernel for the finding to be confirmed.
PERSIST = 2
IT = schema.ITERATION_FIELD


class KernelCycle:
    """Per job, the newest window scored (its iteration), the kernels' names and the findings'
    streaks (released with the job's other state when it ends: the service pops them)."""

    def __init__(self, store: Store):
        self.store = store
        self.done: dict[str, tuple[int, int]] = {}      # job -> (time_ms, iteration) of the newest scored
        self.names: dict[str, dict[str, tuple[str, str, str]]] = {}
        # job -> (rank, kernel) -> (the window's number, windows in a row); job -> windows scored
        self.streaks: dict[str, dict[tuple[int, str], tuple[int, int]]] = {}
        self.windows: dict[str, int] = {}

    def run(self, job: str, topo: Topology, final: bool = False, reader: object = None) -> int:
        """Score the job's complete windows not scored yet; how many findings were written.
        ``reader``: the job's stage reader (a fresh analyzer starts where its replay starts).
        A failure is logged and tried again next cycle: L3 never holds up L1 and L2."""
        since = getattr(getattr(reader, "replay", None), "cursor_ms", None)
        try:
            return self._run(job, topo, final, since, getattr(reader, "read_until", None))
        except Exception as exc:  # noqa: BLE001 - logged; the window is scored next cycle
            log.error("job %s: kernel analysis (L3) failed: %s: %s", job, type(exc).__name__, exc)
            return 0

    def _run(self, job: str, topo: Topology, final: bool, since_ms: int | None, until_ms: int | None) -> int:
        frame = self._read(job, since_ms)
        if not len(frame) or IT not in frame.columns:
            if until_ms is not None:   # none so far: the next read starts near the stage reader's
                self.done[job] = (max(self.done.get(job, (0, -1))[0], int(until_ms) - SKEW_MS),
                                  self.done.get(job, (0, -1))[1])
            return 0
        its = pd.to_numeric(frame[IT], errors="coerce")
        frame = frame[its.notna()].assign(**{IT: its[its.notna()].astype("int64")})
        last = self.done.get(job, (0, -1))[1]
        newest = int(frame[IT].max())
        todo = sorted(i for i in frame[IT].unique() if i > last and (final or i < newest))
        names = self._names(job, set(kernel_columns(frame.columns)))
        found = []
        for it in todo:
            w = frame[frame[IT] == it]
            f = self._streaks(job, kernel_findings(w, names, topo))
            if len(f):
                found.append(f.assign(time=int(w["time"].max()), job=job, iteration=int(it)))
        if found:
            self.store.write_measurement(schema.L3_KERNEL, pd.concat(found, ignore_index=True))
        if todo:
            w = frame[frame[IT] == todo[-1]]
            self.done[job] = (int(w["time"].min()), int(todo[-1]))
        return sum(len(f) for f in found)

    def _streaks(self, job: str, found: pd.DataFrame) -> pd.DataFrame:
        """``windows`` and ``confirmed`` of one window's findings, the job's streaks moved on."""
        n = self.windows[job] = self.windows.get(job, 0) + 1
        held = self.streaks.setdefault(job, {})
        runs = []
        for key in zip(found["rank"].astype(int), found["kernel"].astype(str), strict=True):
            seen, run = held.get(key, (0, 0))
            held[key] = (n, run + 1 if seen == n - 1 else 1)
            runs.append(held[key][1])
        for key in [k for k, (seen, _) in held.items() if seen < n]:
            del held[key]
        own = (found["cause"] != "wait").to_numpy() if len(found) else np.zeros(0, dtype=bool)
        return found.assign(windows=runs, confirmed=(np.asarray(runs) >= PERSIST) & own).astype({"confirmed": int})

    def _read(self, job: str, since_ms: int | None) -> pd.DataFrame:
        if job in self.done:
            start = self.done[job][0]
        else:
            start = None if since_ms is None else since_ms - SKEW_MS
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
