"""Rule: silent ranks, ranks that stop reporting while the rest of the job goes on.

A rank seen before and missing for ``silent_after`` iterations in a row (or for two or more
iterations spanning ``silent_after_s`` seconds of its peers' time), or for fewer (down to
:data:`SILENT_MIN`) where the job's own record of dropped points makes that many in a row by
chance rarer than :data:`FALSE_SILENCE_RATE` per iteration (:meth:`SilenceRule.needed`), while at least half of
the job reports (otherwise the whole job paused, or the collector pipeline did), is silent;
ranks going silent in the same iteration form one incident. It resolves as soon as all of
its ranks report again.

A rank missing now and then is not silent: writers drop points under back-pressure by
design. Those gaps are counted per rank (:attr:`SilenceRule.gaps`, points expected against
points received, read through :mod:`analyzer.diagnosis.health`) and never make an incident.

Example::

    >>> from analyzer.config import AnalyzerConfig
    >>> from rankscope.topology import Topology
    >>> from rankscope.schema import DEFAULT_STAGES
    >>> [c.value for c in SilenceRule("j", Topology(dp=8, gpus_per_node=4), DEFAULT_STAGES,
    ...                               AnalyzerConfig()).classes]
    ['silent_rank']
"""

from __future__ import annotations

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.rule import Rule, culprit_incident
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology, rank_phrase

#: The fewest iterations in a row a rank must miss to be silent, however clean the job's record.
SILENT_MIN = 3
#: Chance per iteration, at most, that some rank of the job misses the needed iterations in a
#: row by dropped points alone (one false silence in 10^7 iterations, ~10 years of 30 s steps).
FALSE_SILENCE_RATE = 1e-7


class SilenceRule(Rule):
    """Hung or crashed processes (or their collectors)."""

    classes = (IncidentClass.SILENT_RANK,)

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig):
        super().__init__(job, topo, stages, cfg)
        self.seen = np.zeros(topo.world, dtype=bool)
        self.missing = np.zeros(topo.world, dtype=np.int64)
        self.missing_since = np.zeros(topo.world, dtype=np.int64)
        self.last_seen_ms = np.zeros(topo.world, dtype=np.int64)
        self.expected = np.zeros(topo.world, dtype=np.int64)   # iterations since first seen
        self.received = np.zeros(topo.world, dtype=np.int64)
        self.dropped = 0          # points missed in gaps shorter than silent_after

    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        present = obs.present
        self.missing_since = np.where(present, 0, np.where(self.missing == 0, obs.iteration, self.missing_since))
        self.missing = np.where(present, 0, self.missing + 1)
        self.seen |= present
        self.last_seen_ms = np.where(present, obs.time_ms, self.last_seen_ms)
        self.expected += self.seen
        self.received += present
        self.dropped += int((self.seen & (self.missing > 0) & (self.missing < self.cfg.silent_after)).sum())
        if present.mean() < 0.5:
            return []
        long_gap = (self.missing >= 2) & (obs.time_ms - self.last_seen_ms >= self.cfg.silent_after_s * 1000)
        silent = self.seen & ((self.missing >= self.needed()) | long_gap)
        taken = np.zeros_like(silent)
        for inc in book.open():
            if inc.cls == IncidentClass.SILENT_RANK:
                taken[np.asarray(inc.ranks, dtype=np.int64)] = True
        new = np.flatnonzero(silent & ~taken)
        if not len(new):
            return []
        onset = int(self.missing_since[new].min())
        nodes = self.topo.nodes_of(new)
        inc = culprit_incident(self.job, IncidentClass.SILENT_RANK, new, self.topo, onset, obs.time_ms,
                               stage=None, ratio=0.0, group_type="node",
                               group_ranks=self.topo.node_ranks(nodes).tolist())
        inc.evidence = {"summary": (f"{rank_phrase(new, capital=True)} ({inc.where}) stopped reporting "
                                    f"at iteration {onset} while the other ranks go on: a hung or crashed "
                                    f"process, or its collector.")}
        inc = book.register(inc)
        return [inc]

    def needed(self) -> int:
        """Iterations in a row a rank must miss to be silent: the fewest from :data:`SILENT_MIN`
        (never more than ``silent_after``) for which the job's drop rate (an upper bound: the
        dropped points + 3 over the points expected) makes any of its ranks miss that many by
        chance at most :data:`FALSE_SILENCE_RATE` per iteration; ``silent_after`` on a young
        record or a lossy one."""
        top = max(1, self.cfg.silent_after)
        n = int(self.expected.sum())
        if top <= SILENT_MIN or n <= 0:
            return top
        p = min(1.0, (self.dropped + 3) / n)
        world = max(int(self.seen.sum()), 1)
        for k in range(SILENT_MIN, top):
            if world * p ** k <= FALSE_SILENCE_RATE:
                return k
        return top

    @property
    def gaps(self) -> tuple[int, int]:
        """Points expected (iterations since each rank first reported) and received."""
        return int(self.expected.sum()), int(self.received.sum())

    @property
    def reporting_ranks(self) -> int:
        """Ranks that have reported at least once."""
        return int(self.seen.sum())

    def active(self, inc: Incident, obs: Observation) -> bool:
        return not obs.present[np.asarray(inc.ranks, dtype=np.int64)].all()

    def quiet_to_resolve(self, inc: Incident) -> int:
        return 1

