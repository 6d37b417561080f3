"""When an incident was detected, confirmed, acted on and recovered from, and how it recovered.

Per incident, in its ``timeline`` (epoch ms, None where none yet):

- ``onset``: its onset iteration's time; ``detected``: the iteration at which the analyzer first
  opened it (``time_to_detect_s`` = detected - onset);
- ``confirmed``: the iteration at which it had stayed open for ``resolve_after`` iterations
  more (it outlived what a passing blip lasts: the actor acts on confirmed incidents only);
- ``action``: the first drain done on it (the ``action`` points the actor wrote, read through
  the store by the service: :meth:`RecoveryTracker.note_actions`);
- ``recovered``: the first iteration of the run of iterations back within 10% of the what-if
  (``iteration_s_if_restored``; the level before where a class has none) that ends the fault:
  ``resolve_after`` iterations in a row, or the incident's resolution. The first iteration back,
  not the moment the analyzer became sure: ``time_to_recover_s`` = recovered - onset.

``recovery``: ``{"how", "iteration_s_after", "within_what_if"}``; ``how`` is ``drain`` when the
job restarted or its culprit ranks moved to other hosts after rankscope's drain, ``node_swap``
when they moved without one, ``job_ended`` when the job ended first, ``fault_ended`` otherwise;
``iteration_s_after`` the median job iteration time over the (up to 10) iterations from the
recovery; ``within_what_if`` whether that is within 10% of the what-if.

Example::

    >>> WITHIN, round(within_target(31.0, 30.0), 3)
    (1.1, 1.033)
"""

from __future__ import annotations

from collections import deque

import numpy as np

from analyzer.config import AnalyzerConfig
from rankscope.hostnames import same_host
from rankscope.incident import Incident
from rankscope.topology import Topology

#: "Back within 10% of the what-if".
WITHIN = 1.1
#: Iterations whose median is the iteration time after the recovery.
AFTER_ITERATIONS = 10
TIMELINE = ("onset", "detected", "confirmed", "action", "recovered")


def within_target(job_s: float, target_s: float) -> float:
    """The job's iteration time as a share of the target (NaN when either is unknown)."""
    return job_s / target_s if np.isfinite(job_s) and np.isfinite(target_s) and target_s > 0 else float("nan")


def target_s(inc: Incident) -> float:
    """What the job should take back to health: the what-if, else the level before the onset."""
    imp = inc.impact
    return imp.iteration_s_if_restored if np.isfinite(imp.iteration_s_if_restored) else imp.iteration_s_before


class RecoveryTracker:
    """The timeline and recovery of one job's incidents, fed each iteration."""

    def __init__(self, cfg: AnalyzerConfig, keep: int = 512):
        self.cfg = cfg
        self._times: deque[tuple[int, int, float]] = deque(maxlen=keep)   # (iteration, time_ms, job s)
        self._first_open: dict[str, int] = {}      # id -> first iteration this analyzer saw it open
        self._run: dict[str, tuple[int, int]] = {}  # id -> (iteration, time_ms) the within-run began
        self._moved: dict[str, int] = {}            # id -> when its culprits were seen on other hosts
        self._restarts: list[int] = []              # when the job restarted (ms)
        self._out: set[str] = set()                 # ids whose job was seen out of 10% of the what-if

    # ------------------------------------------------------------ what happened to the job
    def note_restart(self, time_ms: int) -> None:
        self._restarts = [*self._restarts[-31:], int(time_ms)]

    def note_placement(self, topo: Topology, incidents: list[Incident], time_ms: int) -> None:
        """A new placement: incidents whose culprit ranks are all on other hosts now moved."""
        if topo.hosts is None:
            return
        for inc in incidents:
            if inc.id in self._moved or not inc.hosts or not inc.ranks:
                continue
            now = set(topo.hosts_of(inc.ranks))
            if not any(same_host(a, b) for a in now for b in inc.hosts):
                self._moved[inc.id] = int(time_ms)

    def note_actions(self, incidents: list[Incident], drains: dict[str, int], now_ms: int) -> list[Incident]:
        """The first drain done on each incident (``drains``: id -> ms), and how long a drained one
        has waited for its recovery (the wall clock ``now_ms``); the incidents changed."""
        changed = []
        for inc in incidents:
            before = (inc.timeline.get("action"), _key(inc.awaiting_recovery_s))
            if inc.id in drains and inc.timeline.get("action") is None:
                inc.timeline = {**self._base(inc), "action": int(drains[inc.id])}
            action = inc.timeline.get("action")
            waiting = action is not None and inc.timeline.get("recovered") is None and inc.recovery.get("how") != "job_ended"
            inc.awaiting_recovery_s = max(0.0, (now_ms - action) / 1000.0) if waiting else -1.0
            if (inc.timeline.get("action"), _key(inc.awaiting_recovery_s)) != before:
                changed.append(inc)
        return changed

    # ------------------------------------------------------------ each iteration
    def push(self, iteration: int, time_ms: int, job_s: float) -> None:
        if np.isfinite(job_s):
            self._times.append((int(iteration), int(time_ms), float(job_s)))

    def update(self, inc: Incident, iteration: int, time_ms: int, job_s: float) -> bool:
        """Bring ``inc``'s timeline and recovery up to this iteration; whether they changed."""
        before = (dict(inc.timeline), dict(inc.recovery), inc.time_to_detect_s, inc.time_to_recover_s)
        tl = self._base(inc)
        if tl.get("detected") is None:
            tl["detected"] = int(time_ms)
            inc.time_to_detect_s = max(0.0, (time_ms - inc.onset_ms) / 1000.0)
        if inc.is_open:
            first = self._first_open.setdefault(inc.id, iteration)
            if tl.get("confirmed") is None and iteration - first >= self.cfg.resolve_after:
                tl["confirmed"] = int(time_ms)
        inc.timeline = tl
        if tl.get("recovered") is None and tl.get("detected") is not None:
            self._follow(inc, iteration, time_ms, job_s)
        return before != (inc.timeline, inc.recovery, inc.time_to_detect_s, inc.time_to_recover_s)

    def _follow(self, inc: Incident, iteration: int, time_ms: int, job_s: float) -> None:
        """The run of iterations back within 10% of the target, once the job was out of it; the
        recovery when the run ends the fault. A fault that never took the job out of it
        recovered when it resolved."""
        share = within_target(job_s, target_s(inc))
        back = share == share and share <= WITHIN
        if not back and share == share and iteration >= inc.onset_iteration:
            self._out.add(inc.id)
        if back and inc.id in self._out and iteration > inc.last_onset:
            self._run.setdefault(inc.id, (iteration, time_ms))
        else:
            self._run.pop(inc.id, None)
        run = self._run.get(inc.id)
        long_enough = run is not None and iteration - run[0] + 1 >= self.cfg.resolve_after
        if run is not None and (long_enough or not inc.is_open):
            self._recovered(inc, run[0], run[1])
        elif not inc.is_open and inc.id not in self._out:
            self._recovered(inc, iteration, time_ms)
        elif not inc.is_open and not inc.recovery:
            self._recovered(inc, None, None)

    def _recovered(self, inc: Incident, iteration: int | None, time_ms: int | None) -> None:
        after = [s for it, _, s in self._times if iteration is not None and it >= iteration][:AFTER_ITERATIONS]
        after_s = float(np.median(after)) if after else float("nan")
        share = within_target(after_s, target_s(inc))
        inc.recovery = {"how": self._how(inc, time_ms), "iteration_s_after": round(after_s, 3) if after else None,
                        "within_what_if": bool(share == share and share <= WITHIN)}
        if time_ms is not None:
            inc.timeline = {**inc.timeline, "recovered": int(time_ms)}
            inc.time_to_recover_s = max(0.0, (time_ms - inc.onset_ms) / 1000.0)
            inc.awaiting_recovery_s = -1.0

    def _how(self, inc: Incident, time_ms: int | None) -> str:
        action = inc.timeline.get("action")
        moved = self._moved.get(inc.id)
        if inc.evidence.get("closed") == "job ended":
            return "job_ended"
        if action is not None and (any(r >= action for r in self._restarts) or (moved is not None and moved >= action)
                                   or inc.evidence.get("closed")):
            return "drain"
        if moved is not None or inc.evidence.get("closed"):
            return "node_swap"
        return "fault_ended"

    def _base(self, inc: Incident) -> dict:
        tl = {k: inc.timeline.get(k) for k in TIMELINE}
        if tl["onset"] is None:
            tl["onset"] = int(inc.onset_ms)
        return tl

    def retain(self, ids: set[str]) -> None:
        """Forget the incidents no longer held."""
        for table in (self._first_open, self._run, self._moved):
            for key in [k for k in table if k not in ids]:
                del table[key]
        self._out &= ids


def _key(x: float) -> float | None:
    """A float for comparing (none: None)."""
    return None if x != x or x < 0 else round(x, 1)
