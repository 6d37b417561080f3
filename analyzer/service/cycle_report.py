"""What one analyzer cycle did: per job, its iterations, findings, times and fate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rankscope.incident import Incident


@dataclass
class CycleReport:
    """What one cycle did, per job."""

    iterations: dict[str, int] = field(default_factory=dict)
    changepoints: int = 0
    incidents: list[Incident] = field(default_factory=list)
    read_s: float = 0.0
    analyze_s: float = 0.0
    write_s: float = 0.0
    job_s: dict[str, float] = field(default_factory=dict)   # each job's wall time in the cycle
    deferred: list[str] = field(default_factory=list)        # jobs cut at their deadline
    ended: list[str] = field(default_factory=list)           # jobs found ended

    def merge(self, other: CycleReport) -> None:
        """Add one job's report (jobs run in threads, each with its own)."""
        for job, n in other.iterations.items():
            self.iterations[job] = self.iterations.get(job, 0) + n
        self.changepoints += other.changepoints
        self.incidents += other.incidents
        self.read_s += other.read_s
        self.analyze_s += other.analyze_s
        self.write_s += other.write_s
        self.job_s.update(other.job_s)
        self.deferred += other.deferred
        self.ended += other.ended


class CycleFailed(RuntimeError):
    """Some jobs' analysis failed in a cycle; ``report`` holds what the others did (stored)."""

    def __init__(self, message: str, report: CycleReport):
        super().__init__(message)
        self.report = report


class IncidentEvidence(Protocol):
    """A source of evidence on incidents outside the stage latencies (the GPUs' own telemetry,
    say): the service hands it each job's incidents changed in a cycle, with the job's analyzer
    (its topology, its window), before they are written. It fills in what it knows and must not
    raise or block for long: a source that is down says so in the incident and the log."""

    def attach(self, job: str, incidents: list[Incident], analyzer: Any) -> None: ...
