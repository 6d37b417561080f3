"""The base every diagnosis rule follows, and the helpers rules share to make incidents.

A rule owns one family of fault classes: it *detects* new incidents (and
updates the ones it owns) from an :class:`~analyzer.diagnosis.observation.Observation`,
writes their *evidence*, and says whether an incident of its own is still
*active* (the :class:`~analyzer.diagnosis.diagnoser.Diagnoser` resolves it after
``quiet_to_resolve`` inactive iterations). Adding a fault class is one new
rule module plus its entry in :data:`analyzer.diagnosis.diagnoser.RULES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.observation import Observation
from rankscope.incident import Incident, IncidentClass, incident_id
from rankscope.schema import StageSet
from rankscope.topology import Topology


class Rule(ABC):
    """One family of fault classes: detect, evidence, resolve.

    Holds what every rule works with (the job, its topology and stages, the thresholds) and
    the defaults most rules keep: resolve after ``resolve_after`` quiet iterations, nothing
    to release at resolution or to take over after a restart.
    """

    #: The incident classes this rule creates (and resolves).
    classes: tuple[IncidentClass, ...] = ()

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig):
        self.job, self.topo, self.stages, self.cfg = job, topo, stages, cfg

    @abstractmethod
    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        """New incidents, and own open incidents changed by this iteration (registered in ``book``)."""

    @abstractmethod
    def active(self, inc: Incident, obs: Observation) -> bool:
        """Whether an open incident of this rule still shows in this iteration."""

    def quiet_to_resolve(self, inc: Incident) -> int:
        """Inactive iterations in a row after which ``inc`` resolves."""
        return self.cfg.resolve_after

    def resolved(self, inc: Incident) -> None:  # noqa: B027 - most rules hold nothing
        """Release what the rule held for ``inc`` (it has just resolved)."""

    def adopt(self, inc: Incident) -> None:  # noqa: B027 - most rules hold nothing
        """Take over an open incident read back from the store (after a restart)."""


def culprit_incident(job: str, cls: IncidentClass, ranks, topo: Topology, onset_iteration: int,
                     onset_ms: int, **fields) -> Incident:
    """A new incident naming ``ranks``: its id, nodes and host names follow from them."""
    ranks = np.unique(np.asarray(ranks, dtype=np.int64))
    return Incident(id=incident_id(cls, onset_iteration, ranks), job=job, cls=cls, ranks=ranks.tolist(),
                    nodes=topo.nodes_of(ranks).tolist(), hosts=topo.hosts_of(ranks),
                    onset_iteration=int(onset_iteration), onset_ms=int(onset_ms), **fields)


def set_culprits(inc: Incident, ranks, topo: Topology) -> None:
    """Change an incident's culprit ranks (and with them its nodes and hosts)."""
    ranks = np.unique(np.asarray(ranks, dtype=np.int64))
    inc.ranks, inc.nodes, inc.hosts = ranks.tolist(), topo.nodes_of(ranks).tolist(), topo.hosts_of(ranks)


@dataclass(eq=False)
class Episode:
    """A group-level signal being confirmed over iterations (link floors, pipeline stages)."""

    ranks: np.ndarray
    stage: str | None
    ratio: float
    onset: int
    onset_ms: int
    streak: int = 1
    hits: dict[int, int] = field(default_factory=dict)

    def count(self, ranks: np.ndarray) -> None:
        """Tally the ranks implicated this iteration."""
        for r in ranks.tolist():
            self.hits[r] = self.hits.get(r, 0) + 1

    def steady(self) -> np.ndarray:
        """Ranks implicated in at least half of the episode's iterations."""
        if not self.hits:
            return self.ranks
        return np.array(sorted(r for r, n in self.hits.items() if n * 2 >= self.streak), dtype=np.int64)
