"""The diagnosis' health findings: how complete a job's data is, and the stalls that were noise.

Two rules count what makes no incident: the silence rule the points each rank was expected to
write against those received (writers drop points under back-pressure by design), and the
transient-stall rule the sporadic stalls too small to be incidents. :class:`DiagnosisHealth`
is the public face of both counters: the job's ``job_health`` point is built from it alone
(:meth:`DiagnosisHealth.row`), so nobody reaches into the rules' state.

Example::

    >>> from analyzer.config import AnalyzerConfig
    >>> from analyzer.diagnosis.rank_cells import RankCells
    >>> from analyzer.diagnosis.silence import SilenceRule
    >>> from analyzer.diagnosis.transient import TransientStallRule
    >>> from rankscope.schema import DEFAULT_STAGES
    >>> from rankscope.topology import Topology
    >>> topo, cfg = Topology(dp=8, gpus_per_node=4), AnalyzerConfig()
    >>> health = DiagnosisHealth(SilenceRule("j", topo, DEFAULT_STAGES, cfg), TransientStallRule(
    ...     "j", topo, DEFAULT_STAGES, cfg, RankCells(8, len(DEFAULT_STAGES))))
    >>> health.completeness, health.reporting_ranks, health.sporadic.summary()
    (Completeness(expected=0, received=0), 0, 'no sporadic stalls')
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.diagnosis.silence import SilenceRule
from analyzer.diagnosis.stall_tally import SporadicStalls
from analyzer.diagnosis.transient import TransientStallRule


@dataclass(frozen=True)
class Completeness:
    """Points expected (iterations since each rank first reported, summed) and received."""

    expected: int
    received: int

    @property
    def ratio(self) -> float:
        """Received over expected (1 before anything was expected)."""
        return float(self.received / self.expected) if self.expected else 1.0


class DiagnosisHealth:
    """Read-only view of the data-completeness and sporadic-stall counters of one job."""

    def __init__(self, silence: SilenceRule, transient: TransientStallRule):
        self._silence, self._transient = silence, transient

    @property
    def completeness(self) -> Completeness:
        expected, received = self._silence.gaps
        return Completeness(expected, received)

    @property
    def reporting_ranks(self) -> int:
        """Ranks that have reported at least once (0 before the first iteration)."""
        return self._silence.reporting_ranks

    @property
    def sporadic(self) -> SporadicStalls:
        """The tally of stalls counted as noise (read it, do not change it)."""
        return self._transient.sporadic

    def row(self, job: str, time_ms: int, iteration: int, late_points: int = 0) -> dict:
        """The job's ``job_health`` point: how complete its data is (points expected from the
        ranks that reported once, against points received; ``late_points`` came after their
        iteration was analyzed) and the sporadic stalls that were noise, not incidents."""
        c, sp = self.completeness, self.sporadic
        return {"time": int(time_ms), "job": job, "iteration": int(iteration),
                "points_expected": c.expected, "points_received": c.received,
                "completeness": c.ratio,
                "late_points": int(late_points), "sporadic_stalls": int(sp.stalls),
                "sporadic_ranks": len(sp.ranks), "sporadic_gpu_hours": float(sp.gpu_hours),
                "sporadic_top_hosts": ", ".join(sp.top_hosts()), "sporadic_text": sp.summary()}
