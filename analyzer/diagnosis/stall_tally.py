"""The tally of sporadic stalls: transient stalls too small to be incidents, counted for the job.

Real jobs stall sporadically on random ranks (Python GC, page faults, OS jitter); the
transient-stall rule (:mod:`analyzer.diagnosis.transient`) makes an incident only of the stalls
that cost the job something or keep coming back, and counts the rest here: one job-level
finding, written in the ``job_health`` point (:mod:`analyzer.diagnosis.health`).

Example::

    >>> sp = SporadicStalls()
    >>> sp.count([3, 4], ["n1"], 0.5, onset=10, iteration=11)
    >>> sp.stalls, sorted(sp.ranks), sp.top_hosts()
    (1, [3, 4], ['n1 (1)'])
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class SporadicStalls:
    """Stalls too small to be incidents, counted for the job: how many, on how many ranks,
    an upper bound of what they cost (each iteration's largest stall, the job waiting for it
    in full) and the hosts that stalled most."""

    stalls: int = 0
    gpu_hours: float = 0.0
    first_iteration: int = -1
    last_iteration: int = -1
    ranks: set[int] = field(default_factory=set)
    hosts: Counter = field(default_factory=Counter)

    def count(self, ranks: Iterable[int], hosts: Iterable[str], gpu_hours: float, onset: int,
              iteration: int) -> None:
        """One stall of ``ranks`` (on ``hosts``) from ``onset``, ended at ``iteration``."""
        self.stalls += 1
        self.ranks.update(int(r) for r in ranks)
        self.hosts.update(hosts)
        self.gpu_hours += gpu_hours
        self.first_iteration = onset if self.first_iteration < 0 else self.first_iteration
        self.last_iteration = iteration

    def top_hosts(self, n: int = 3) -> list[str]:
        return [f"{h} ({k})" for h, k in self.hosts.most_common(n)]

    def summary(self) -> str:
        if not self.stalls:
            return "no sporadic stalls"
        return (f"sporadic stalls on {len(self.ranks)} rank(s) ({self.stalls} stall(s), iterations "
                f"{self.first_iteration}-{self.last_iteration}), cost at most {self.gpu_hours:,.1f} "
                f"GPU-hours; top hosts {', '.join(self.top_hosts())}: noise, no incident")
