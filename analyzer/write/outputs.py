"""What the analyzer's cycle writes for a job, and when.

- :class:`JobRollups` (kept for the job's life): the ``rollup_host`` and ``rollup_job`` points
  of every iteration processed (:mod:`analyzer.write.rollups`), held until the cycle ends or
  they make :data:`FLUSH_ROWS` rows (a cycle that catches up on hours of data), then written
  with the ``rollup_host_5m`` / ``rollup_host_1h`` windows closed meanwhile
  (:mod:`analyzer.write.window_rollups`, made in memory). Points a failed write left are
  written with the next.
- :class:`CycleOutputs` (one cycle, kept until stored): the ``l1_changepoint``,
  ``l2_rank``, ``l2_group``, ``job_health``, ``incident``, ``incident_host`` and ``l2_kind``
  points of what the cycle analyzed, ``l2_kind`` last.

Every point is keyed by time and tags, none by the wall clock or a counter of attempts, so
writing the same iterations again writes the same points.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from analyzer.write.rollups import incident_host_frame, rollup_frames
from analyzer.write.window_rollups import WindowRollups
from rankscope import schema
from rankscope.frames import LatencyCube
from rankscope.incident import Incident, incidents_frame
from rankscope.store import Store
from rankscope.topology import Topology


@dataclass(frozen=True)
class L2Points:
    """One window's L2 frames: ``l2_kind``, ``l2_group`` and ``l2_rank``."""

    kind: pd.DataFrame = field(default_factory=pd.DataFrame)
    group: pd.DataFrame = field(default_factory=pd.DataFrame)
    rank: pd.DataFrame = field(default_factory=pd.DataFrame)


#: ``rollup_host`` rows held before they are written: about what one read of raw points holds.
FLUSH_ROWS = 200_000


class JobRollups:
    """One job's rollups as its cycles make them."""

    def __init__(self, job: str, settle_ms: int):
        self.job = job
        self.windows = WindowRollups(settle_ms)
        self._held: dict[str, list[pd.DataFrame]] = {}
        self._rows = 0

    def resume(self, store: Store, first_ms: int, analyzed_ms: int) -> int:
        """A restarted analyzer's windows, from the first iteration it replays and the newest
        its predecessor analyzed. One bounded read: the ``rollup_host_5m`` points stored from
        the hour of the replay's first window, or of the oldest window the predecessor may
        have left open (one that had not closed by its newest iteration), whichever is older:
        a few hours of windows at most, never raw points. Returns from when the
        predecessor's iterations are wanted for the windows it left open: the end of its
        latest stored window (the read's start when it stored none there)."""
        w = self.windows.window_ms
        oldest = min(first_ms, analyzed_ms - self.windows.settle_ms - 2 * w)
        since = oldest // self.windows.hour_ms * self.windows.hour_ms
        stored = store.read(schema.ROLLUP_HOST_WINDOW, self.job, start_ms=since)
        after = self.windows.begin(first_ms, stored, analyzed_ms)
        return since if after is None else after

    def add(self, topo: Topology, cube: LatencyCube, write: bool = True) -> None:
        """The rollups of the iterations of ``cube`` (``write=False``: only for the windows,
        e.g. a predecessor's iterations, whose points are stored already)."""
        frames = rollup_frames(self.job, topo, cube)
        if not frames:
            return
        self.windows.add(frames[schema.ROLLUP_HOST])
        if write:
            for name, frame in frames.items():
                if name == schema.ROLLUP_HOST:   # the maxima make the windows' maxima; no panel reads them raw
                    frame = frame.drop(columns=[c for c in frame.columns if c.endswith("_max")])
                self._held.setdefault(name, []).append(frame)
            self._rows += len(frames[schema.ROLLUP_HOST])

    def flush(self, store: Store, last_ms: int, now_ms: int | None = None, final: bool = False,
              force: bool = False) -> None:
        """Write what is held, once it is :data:`FLUSH_ROWS` rows or with ``force`` (the cycle's
        end), and the windows closed since: by the newest iteration ``last_ms`` and the wall
        clock ``now_ms`` (None: the data alone), the open one too when ``final``."""
        if not force and self._rows < FLUSH_ROWS:
            return
        for name, frame in self.windows.close(last_ms, now_ms, final).items():
            self._held.setdefault(name, []).append(frame)
        self._rows = 0
        for name in list(self._held):   # what a failed write left is written again (the later point last)
            frames = [f for f in self._held[name] if len(f)]
            if frames:
                store.write_measurement(name, frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True))
            del self._held[name]


@dataclass
class CycleOutputs:
    """What one cycle found for a job: change points, incidents that changed, iterations; and,
    once it analyzed all it read, the analyzer's ``l2_group`` / ``l2_rank`` frames and
    ``job_health`` row then (:meth:`analyzed`). Kept until stored: a cycle that failed before
    it analyzed all it read leaves them to the next cycle, which adds its own; one that failed
    to store them has them stored, as they are, before the next cycle reads anything."""

    changepoints: list = field(default_factory=list)
    incidents: dict[str, Incident] = field(default_factory=dict)
    iterations: int = 0
    l2: L2Points | None = None
    health: dict | None = None
    lifecycle: list[dict] = field(default_factory=list)   # job_lifecycle: restarts, its end

    def add(self, result) -> None:
        """A :class:`~analyzer.job_analyzer.FeedResult`."""
        self.changepoints += result.changepoints
        for inc in result.incidents:
            self.incidents[inc.id] = inc
        self.iterations += len(result.iterations)

    def analyzed(self, l2: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame], health: dict) -> None:
        """The analyzer's state once the cycle analyzed all it read: its ``l2_kind``,
        ``l2_group`` and ``l2_rank`` frames, its ``job_health`` row."""
        self.l2, self.health = L2Points(*l2), health

    @property
    def complete(self) -> bool:
        """The cycle analyzed all it read: these are its outputs, whole."""
        return self.health is not None

    def write(self, store: Store) -> None:
        """``l1_changepoint``, ``incident`` and ``incident_host``, the ``l2_rank`` and
        ``l2_group`` frames, the ``job_health`` row and the ``l2_kind`` frame last: a restarted
        analyzer takes the newest ``l2_kind`` point for what was analyzed and stored (the cycle
        stores its rollups before these). Each is keyed by time and tags: written again, the same points.
        ``job_lifecycle`` first: the steps of everything else are numbered by it."""
        if self.lifecycle:
            store.write_measurement(schema.JOB_LIFECYCLE, pd.DataFrame(self.lifecycle))
        if self.changepoints:
            store.write_measurement(schema.L1_CHANGEPOINT, pd.DataFrame([c.to_row() for c in self.changepoints]))
        if self.incidents:
            incidents = list(self.incidents.values())
            store.write_measurement(schema.INCIDENT, incidents_frame(incidents))
            store.write_measurement(schema.INCIDENT_HOST, incident_host_frame(incidents))
        l2 = self.l2 if self.l2 is not None else L2Points()
        for name, frame in ((schema.L2_RANK, l2.rank), (schema.L2_GROUP, l2.group)):
            if len(frame):
                store.write_measurement(name, frame)
        if self.health is not None:
            store.write_measurement(schema.JOB_HEALTH, pd.DataFrame([self.health]))
        if len(l2.kind):
            store.write_measurement(schema.L2_KIND, l2.kind)
