"""A job's life in the service: when it has ended, and what its end writes.

A job ends when it stops writing: after ``job_idle_s`` without a new point (the wall clock,
in a running service), or when its points resume only after such a gap (the data, in a
catch-up: analyzer/read/attempts.py calls that a new job under the same name). Its open
incidents then close as "job ended", not as silent ranks; its state is released; an
``ended`` ``job_lifecycle`` point remembers it, so a restarted service does not bring the job
back, and a later job with the same name starts afresh (its steps, and so its incident ids,
follow the old job's: nothing of the old one is overwritten).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rankscope import schema
from rankscope.incident import Incident
from rankscope.store import Store

if TYPE_CHECKING:
    from analyzer.read.iteration_reader import IterationReader

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
