"""Each cycle, what rankscope did to a job's incidents and how long a drained job has waited.

The done drains come from the store (:func:`analyzer.read.action_times.drain_times`), never
from the actor's code; the wait is measured by the wall clock, so a job that hangs after its
drain (no iteration at all) still shows it, and the alert on a drained job that has not
recovered fires. The incidents changed are written at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from analyzer.job_analyzer import JobAnalyzer
from analyzer.read.action_times import drain_times
from analyzer.write.outputs import CycleOutputs
from rankscope.store import Store

log = logging.getLogger(__name__)


def follow_actions(store: Store, job: str, ja: JobAnalyzer, clock: Callable[[], float]) -> int:
    """Note the drains of ``job``'s held incidents; how many incidents were rewritten."""
    held = ja.incidents()
    if not held:
        return 0
    drains = drain_times(store, job, min(int(i.onset_ms) for i in held))
    changed = ja.note_actions(drains, int(clock() * 1000))
    if changed:
        CycleOutputs(incidents={i.id: i for i in changed}).write(store)
    return len(changed)
