"""A job's life in the service: when it has ended, and what its end writes.

A job ends when it stops writing: after ``job_idle_s`` without a new point (the wall clock,
in a running service), or when its points resume only after such a gap (the data, in a
catch-up: analyzer/read/attempts.py calls that a new job under the same name). Its open
incidents then close as "job ended", not as silent ranks; its state is released; an
``ended`` ``job_lifecycle`` point remembers it, so a restarted service does not bring the job
back, and a later job with the same name starts afresh (its steps, and so its incident ids,
follow the old job's: nothing of the old one is overwritten).

:class:`JobLife` makes these decisions for the service, in one place: which reader a job gets
(none for one that ended and wrote nothing since; one from its first point after the end for a
new job under the name), whether a segment the reader found starts a new job, which jobs went
idle, and what an end writes. Restarts are found by the read (analyzer/read/attempts.py), never here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from analyzer.read.attempts import SEGMENT, Segment
from rankscope import schema
from rankscope.incident import Incident
from rankscope.store import Store

if TYPE_CHECKING:
    import pandas as pd

    from analyzer.job_analyzer import JobAnalyzer
    from analyzer.read.iteration_reader import IterationReader
    from analyzer.write.outputs import CycleOutputs

log = logging.getLogger(__name__)

#: What the verdict of an incident closed by its job's end says.
JOB_ENDED = "job ended"
#: ... and of one whose ranks left the job (it shrank at a restart).
RANKS_LEFT = "its ranks left the job"


@dataclass(frozen=True)
class JobEnd:
    """Where an ended job stopped: its newest point's time and the analyzer's last step."""

    end_ms: int
    step: int


def idle(reader: IterationReader, now_ms: int, idle_s: float) -> bool:
    """Whether the job ``reader`` reads wrote nothing for ``idle_s`` before ``now_ms``: nothing
    read within it, and nothing stored after the newest point read (a reader behind, as in a
    catch-up stopped by its deadline, has not seen the job's end)."""
    last = reader.read_until
    return last is not None and now_ms - last >= idle_s * 1000 and reader.first_point_after(last) is None


def close_open(incidents: list[Incident], step: int, reason: str = JOB_ENDED) -> list[Incident]:
    """Resolve the open ``incidents`` at ``step`` saying why (the job ended, its ranks left);
    the ones closed, to be written."""
    closed = []
    for inc in incidents:
        if inc.is_open:
            inc.resolve(step)
            inc.evidence["closed"] = reason
            if reason == JOB_ENDED and not inc.recovery:   # the job ended before it recovered
                inc.recovery = {"how": "job_ended", "iteration_s_after": None, "within_what_if": False}
                inc.awaiting_recovery_s = -1.0
            closed.append(inc)
    return closed


def ended_row(job: str, end: JobEnd, attempt: int, iteration: int, ranks: int) -> dict:
    """The ``job_lifecycle`` point of a job's end (time = its newest point)."""
    return {"time": int(end.end_ms), "job": job, "event": "ended", "attempt": int(attempt),
            schema.ITERATION_FIELD: int(iteration), "step": int(end.step), "ranks": int(ranks),
            "text": f"job ended: no point for the idle time after iteration {iteration}"}


def stored_end(store: Store, job: str) -> JobEnd | None:
    """The job's end, when its newest ``job_lifecycle`` point says it ended (None: it runs,
    or it never ended)."""
    rows = store.read(schema.JOB_LIFECYCLE, job)
    if not len(rows) or "event" not in rows.columns:
        return None
    last = rows.sort_values("time", kind="stable").iloc[-1]
    if last["event"] != "ended":
        return None
    return JobEnd(int(last["time"]), int(last["step"]))


def left_ranks(incidents: list[Incident], world: int) -> list[Incident]:
    """Open incidents naming ranks outside a job of ``world`` ranks (it shrank): their
    evidence no longer fits the job."""
    return [i for i in incidents if i.is_open and i.ranks and int(np.max(i.ranks)) >= world]


class JobLife:
    """The service's decisions on its jobs' lives (see the module doc); ``ended`` holds the jobs
    that ended and were released, until a new job takes the name."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.ended: dict[str, JobEnd] = {}
        self._began: dict[str, int] = {}   # the segment each job's current analyzer began in

    def reader(self, job: str, make: Callable[[int | None, int], IterationReader]) -> IterationReader | None:
        """The job's reader from ``make(since_ms, base_step)``: from the job's first point, or, for
        a job that ended (here or as the store says), from its first point after the end with its
        steps after the old job's; None while nothing came after the end."""
        reader = make(None, 0)
        end = self.ended.get(job) or stored_end(self.store, job)
        if end is None:
            return reader
        after = reader.first_point_after(end.end_ms)
        if after is None:
            self.ended[job] = end
            return None
        log.info("job %s: a new job under the name of one that ended", job)
        self.ended.pop(job, None)
        return make(after, end.step + 1)

    def new_job_at(self, job: str, reader: IterationReader, ready: pd.DataFrame) -> bool:
        """Whether ``ready`` (a segment's rows) begins a segment the read found to be a new job under
        the name (its points resumed after the idle time), not seen before: the old job ended there."""
        if SEGMENT not in ready.columns or not len(ready):
            return False
        k = int(ready[SEGMENT].iloc[0])
        if reader.attempts.segments[k].kind != "start" or k <= self._began.get(job, 0):
            return False
        self._began[job] = k
        return True

    @staticmethod
    def end(job: str, ja: JobAnalyzer, end: JobEnd, segment: Segment, out: CycleOutputs) -> None:
        """What the end of ``job`` (its analyzer ``ja``, its last segment) writes, into ``out``: its
        open incidents closed as "job ended" and its ``ended`` point."""
        for inc in close_open(ja.incidents(), ja.last_iteration):
            out.incidents[inc.id] = inc
        out.lifecycle.append(ended_row(job, end, segment.attempt, end.step - segment.offset, ja.topo.world))

    @staticmethod
    def idle_jobs(readers: dict[str, IterationReader], running: Iterable[str], now_ms: int, idle_s: float) -> list[str]:
        """The ``running`` jobs whose readers saw no new point for ``idle_s`` before ``now_ms``."""
        return [j for j in running if j in readers and idle(readers[j], now_ms, idle_s)]

    def released(self, job: str, end: JobEnd) -> None:
        """``job`` ended at ``end`` and its state is gone: a later point under its name is a new job."""
        self.ended[job] = end
        self._began.pop(job, None)
