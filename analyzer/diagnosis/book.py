"""A job's incidents and out-of-band events, as the rules see them: bounded in memory.

The book holds the open incidents, the recently resolved ones (for
``keep_resolved`` iterations, so a late update of one can still find it, and the
same fault coming back within ``reopen_within`` iterations reopens it) and
the out-of-band events that can still matter. Older incidents live on in the
store only; an always-on analyzer's memory does not grow with the job's age.
Every incident's events are judged here (:meth:`judge_events`), whatever rule
made it.

Events are kept per host by relevance and time (:mod:`analyzer.diagnosis.event_shelf`), not
as the newest N: a flood of events on machines outside the job never pushes out those on its
own hosts.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from analyzer.detect.window import Window
from analyzer.diagnosis.event_shelf import EventShelf
from analyzer.diagnosis.event_verdicts import OutOfBandEvent, category, verdict
from analyzer.diagnosis.rank_sets import overlap
from rankscope.incident import EventVerdict, Incident


class IncidentBook:
    """Open and recently resolved incidents of one job, and its recent events."""

    def __init__(self, event_lookback: int, keep_resolved: int, reopen_within: int = 0,
                 hosts: Iterable[str] = ()):
        self.event_lookback = event_lookback
        self.reopen_within = reopen_within
        self.keep_resolved = keep_resolved
        self._incidents: dict[str, Incident] = {}
        self._judge_from: dict[str, int] = {}   # incident id -> time its events are judged from
        self.shelf = EventShelf(hosts)

    @property
    def events(self) -> list[OutOfBandEvent]:
        """The events held (bounded per host: :class:`EventShelf`), oldest first."""
        return self.shelf.events()

    def watch_hosts(self, hosts: Iterable[str]) -> None:
        """The job's host names (its topology's): their events are kept per host, apart from
        those of every other machine."""
        self.shelf.set_hosts(hosts)

    # ------------------------------------------------------------ incidents
    @property
    def incidents(self) -> list[Incident]:
        """Incidents held in memory (open and recently resolved), oldest onset first."""
        return sorted(self._incidents.values(), key=lambda i: (i.onset_ms, i.id))

    def open(self) -> list[Incident]:
        return [i for i in self._incidents.values() if i.is_open]

    def register(self, inc: Incident) -> Incident:
        """Add an incident and return the one that stands for it from now on.

        One found again under the same id (after a restart) replaces it. One whose culprits
        (same class, overlapping ranks or on the same machines) resolved less than ``reopen_within`` iterations ago
        reopens that incident as a new episode of an intermittent fault: same id, the new
        episode's evidence, ``episodes`` counted.
        """
        if inc.id not in self._incidents:
            old = self._reopenable(inc)
            if old is not None:
                return self._reopen(old, inc)
        self._incidents[inc.id] = inc
        return inc

    def adopt(self, inc: Incident) -> None:
        """Hold an incident read back from the store, as it is (no reopening)."""
        self._incidents[inc.id] = inc

    def _reopenable(self, inc: Incident) -> Incident | None:
        ranks = np.asarray(inc.ranks, dtype=np.int64)
        best = None
        for old in self._incidents.values():
            if (old.cls == inc.cls and old.stage == inc.stage and not old.is_open and old.resolved_iteration >= 0
                    and inc.onset_iteration - old.resolved_iteration <= self.reopen_within
                    and (overlap(np.asarray(old.ranks, dtype=np.int64), ranks) >= 0.5
                         or (bool(inc.nodes) and set(inc.nodes) <= set(old.nodes)))   # the same machines
                    and (best is None or old.resolved_iteration > best.resolved_iteration)):
                best = old
        return best

    def next_episode(self, inc: Incident, iteration: int) -> None:
        """An open intermittent incident whose culprits, quiet for a while, are slow again."""
        episodes = [*(inc.evidence.get("episodes") or []), {"onset": int(iteration), "resolved": -1}]
        inc.episodes = len(episodes)
        inc.last_onset = int(iteration)
        summary = str(inc.evidence.get("summary", ""))
        rest = summary.split(". ", 1)[1] if summary.startswith("Intermittent:") else summary
        onsets = ", ".join(str(e["onset"]) for e in episodes)
        inc.evidence = {**inc.evidence, "episodes": episodes,
                        "summary": (f"Intermittent: episode {len(episodes)} of the same fault since "
                                    f"iteration {inc.first_onset} (onsets {onsets}). {rest}")}

    def _reopen(self, old: Incident, new: Incident) -> Incident:
        self._judge_from.pop(new.id, None)   # the new episode is judged under the old id from now on
        past = old.evidence.get("episodes") or [{"onset": old.first_onset, "resolved": old.resolved_iteration}]
        episodes = [*past, {"onset": new.onset_iteration, "resolved": new.resolved_iteration}]
        old.episodes = len(episodes)
        old.last_onset = new.onset_iteration
        old.ranks = sorted(set(old.ranks) | set(new.ranks))
        old.nodes = sorted(set(old.nodes) | set(new.nodes))
        old.hosts = sorted(set(old.hosts) | set(new.hosts))
        old.stage, old.ratio = new.stage, new.ratio
        old.group_type, old.group_ranks = new.group_type, new.group_ranks
        old.status, old.resolved_iteration = new.status, new.resolved_iteration
        onsets = ", ".join(str(e["onset"]) for e in episodes)
        old.evidence = {**new.evidence, "episodes": episodes, "intermittent": True,
                        "summary": (f"Intermittent: episode {len(episodes)} of the same fault since "
                                    f"iteration {old.first_onset} (onsets {onsets}). "
                                    + str(new.evidence.get("summary", "")))}
        old.events = new.events or old.events
        return old

    def known(self, incident_id: str) -> bool:
        return incident_id in self._incidents

    def forget_old(self, iteration: int) -> None:
        """Drop resolved incidents more than ``keep_resolved`` iterations old (they stay stored)."""
        old = [k for k, i in self._incidents.items()
               if not i.is_open and 0 <= i.resolved_iteration < iteration - self.keep_resolved]
        for k in old:
            del self._incidents[k]
            self._judge_from.pop(k, None)

    # --------------------------------------------------------------- events
    def add_events(self, events: list[OutOfBandEvent]) -> None:
        """New events; a newer read of a known event (e.g. now resolved) replaces it. Kept
        within the shelf's bounds (per host of the job; the rest shared)."""
        self.shelf.add(events)

    def horizon(self, win: Window) -> int | None:
        """The earliest event time that can still matter: the window's start (where a new
        incident's lookback starts at the earliest) or an open incident's lookback."""
        if not len(win):
            return None
        return min([int(win.times[0]), *[self._judge_start(i, win) for i in self._incidents.values()]])

    def forget_events(self, win: Window) -> None:
        """Drop events no incident can use any more (older than :meth:`horizon`)."""
        cutoff = self.horizon(win)
        if cutoff is not None:
            self.shelf.forget_before(cutoff)

    def _judge_start(self, inc: Incident, win: Window) -> int:
        """Fixed the first time an incident is judged, so its verdicts do not drift away as
        the window slides on."""
        start = self._judge_from.get(inc.id)
        if start is None:
            start = self._judge_from[inc.id] = win.time_of(inc.onset_iteration - self.event_lookback,
                                                           inc.onset_ms)
        return start

    def judge_events(self, inc: Incident, win: Window) -> None:
        """Set ``inc.events``: every event about the incident's culprits (by host, node or rank)
        since ``event_lookback`` iterations before its onset, with its verdict."""
        start = self._judge_start(inc, win)
        verdicts = []
        for e in self.shelf.events():
            if e.time_ms < start:
                continue
            if not e.names(inc.ranks, inc.nodes, inc.hosts):
                continue   # about another machine (of this job or not): not this incident's evidence
            v, reason = verdict(category(e.name, e.text), inc.cls, on_culprit=True, evidence=inc.evidence)
            verdicts.append(EventVerdict(e.name, e.node, v, reason, e.time_ms, host=e.host, rank=e.rank,
                                         status=e.status, source=e.source))
        inc.events = verdicts

    def rejudge_events(self, win: Window) -> list[Incident]:
        """Incidents held (open, or resolved lately) whose event verdicts changed: events arrive
        late (the write-up's port-down came one iteration later; Alertmanager waits group_wait,
        so a transient stall is resolved before its event arrives), and resolve later."""
        out = []
        for inc in self._incidents.values():
            before = [e.to_json() for e in inc.events]
            self.judge_events(inc, win)
            if [e.to_json() for e in inc.events] != before:
                out.append(inc)
        return out
