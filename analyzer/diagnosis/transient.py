"""Rule: transient stalls, short hot streaks that end on their own (e.g. a JIT compile stall).

A streak of at most ``transient_max`` iterations that ends is a transient
stall when, at its peak, the cell was at least ``abs_ratio`` times its peers
and ``transient_z`` sigmas of its stage's one-iteration noise out: a noisy data
loader reaches 1.9x now and then; a stall is seconds. Cells a straggler incident
holds are not stalls.

Real jobs stall sporadically on random ranks (Python GC, page faults, OS jitter: most
stragglers in large fleets are not hardware, per the what-if study of ByteDance's fleet,
Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis",
OSDI 2025). A 12,960-rank job draws dozens of those an iteration; an incident for each is an
alert storm. So, in a job that stalls somewhere more than ``stall_rare`` times an iteration,
a stall is an incident only when it costs the job something beyond its own
jitter (its iteration time rose ``stall_min_excess`` above the level around it plus 3 robust
sigmas of the iteration-to-iteration jitter, or ``stall_min_gpu_hours`` in all) or the same ranks stall ``stall_repeat`` times within
``reopen_within`` iterations, and more often than the job's own sporadic-stall rate makes
likely on some rank by chance (:func:`repeats_needed`: at 0.2% of rank-iterations, 3 stalls
of one of 12,960 ranks within 20 iterations happen in most 150-iteration runs); the rest go into :class:`SporadicStalls`, one job-level
tally with an upper bound of their cost. The incident is written already resolved.

Example::

    >>> from analyzer.config import AnalyzerConfig
    >>> from rankscope.schema import DEFAULT_STAGES
    >>> from rankscope.topology import Topology
    >>> rule = TransientStallRule("j", Topology(dp=8, gpus_per_node=4), DEFAULT_STAGES,
    ...                           AnalyzerConfig(), RankCells(8, len(DEFAULT_STAGES)))
    >>> [c.value for c in rule.classes]
    ['transient_stall']
"""

from __future__ import annotations

import math
import warnings
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.rank_cells import RankCells
from analyzer.diagnosis.rank_evidence import (
    new_rank_incident,
    onset_gap,
    split_by_onset_and_place,
    write_rank_evidence,
)
from analyzer.diagnosis.rule import Rule
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology


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

    def top_hosts(self, n: int = 3) -> list[str]:
        return [f"{h} ({k})" for h, k in self.hosts.most_common(n)]

    def summary(self) -> str:
        if not self.stalls:
            return "no sporadic stalls"
        return (f"sporadic stalls on {len(self.ranks)} rank(s) ({self.stalls} stall(s), iterations "
                f"{self.first_iteration}-{self.last_iteration}), cost at most {self.gpu_hours:,.1f} "
                f"GPU-hours; top hosts {', '.join(self.top_hosts())}: noise, no incident")

    def to_row(self, job: str, time_ms: int) -> dict:
        return {"time": int(time_ms), "job": job, "stalls": int(self.stalls), "ranks": len(self.ranks),
                "gpu_hours": float(self.gpu_hours), "first_iteration": int(self.first_iteration),
                "last_iteration": int(self.last_iteration), "top_hosts": ", ".join(self.top_hosts()),
                "text": self.summary()}


#: Chance, over all ranks of a job, that one rank repeats by luck as often as a repeat needs.
REPEAT_ALPHA = 0.01


def _poisson_tail(k: int, lam: float) -> float:
    """P(X >= k) for X ~ Poisson(lam)."""
    term, cdf = math.exp(-lam), 0.0
    for i in range(k):
        cdf += term
        term *= lam / (i + 1)
    return max(0.0, 1.0 - cdf)


def repeats_needed(rate: float, window: int, world: int, least: int, alpha: float = REPEAT_ALPHA) -> int:
    """Stalls of one rank, each within ``window`` iterations of the last, that chance explains
    on no rank of ``world`` (probability below ``alpha``) when a rank-iteration stalls at ``rate``;
    at least ``least``.

        >>> repeats_needed(0.0, 20, 12_960, 3), repeats_needed(0.002, 20, 12_960, 3)
        (3, 7)
    """
    k = max(1, int(least))
    while k < 100:
        lam = rate * window * (k - 1)   # the span k stalls chained by gaps of ``window`` may cover
        if world * _poisson_tail(k - 1, lam) <= alpha:
            return k
        k += 1
    return k


class TransientStallRule(Rule):
    """Short, large rank-level stalls that passed (and cost something, or keep coming back)."""

    classes = (IncidentClass.TRANSIENT_STALL,)

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig, cells: RankCells):
        super().__init__(job, topo, stages, cfg)
        self.cells = cells
        self.job_ms: deque[tuple[int, float]] = deque(maxlen=max(cfg.history, 2 * cfg.l1_window))
        self.stall_count = np.zeros(topo.world, dtype=np.int64)
        self.stall_last = np.full(topo.world, -(10**9), dtype=np.int64)
        self.sporadic = SporadicStalls()
        self.stalled_cells = 0   # rank-stalls seen (every part, incident or not)
        self.iterations = 0

    def _cost(self, onset: int, end: int) -> tuple[float, float]:
        """What iterations ``[onset, end)`` cost the job beyond its own jitter: the largest
        excess of its iteration time over the higher of the level before ``onset`` (the median
        of the last three iterations) and ``end``'s (the first without the stall: when the whole
        job stepped up, e.g. a straggler elsewhere began, that step is not the stall's cost),
        plus 3 robust sigmas of the recent iteration-to-iteration jitter; as a fraction of that
        level, and summed in GPU-hours. A job that stalls sporadically somewhere every iteration
        jitters by the largest stall of each; a stall within that jitter cost nothing the job
        does not pay anyway."""
        hist = {it: ms for it, ms in self.job_ms if np.isfinite(ms)}
        n = max(3, self.cfg.l1_min_history)
        before = np.array([ms for it, ms in hist.items() if it < onset][-n:])
        during = np.array([ms for it, ms in hist.items() if onset <= it < end])
        if len(before) < n or not len(during):
            return 0.0, 0.0   # no reference yet: not a cost anybody can state
        base = max(float(np.median(before[-3:])), hist.get(end, 0.0))
        if base <= 0:
            return 0.0, 0.0
        d = np.diff(before)
        sigma = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2)
        excess = np.maximum(during - base - 3 * sigma, 0.0)
        return float(excess.max() / base), float(excess.sum() * self.topo.world / 3.6e6)

    def _lost_ms(self, ranks: np.ndarray, s: int, onset: int, end: int, obs: Observation) -> float:
        """What the stalled cells lost against their iteration's median (the upper bound of a
        noise stall's cost: the job waits for it in full)."""
        win = obs.window
        v = win.values[win.since(onset, end)][:, :, s]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # an iteration the stage is absent
            lost = np.nanmax(v[:, ranks] - np.nanmedian(v, axis=1)[:, None], axis=1)
        return float(np.nansum(np.maximum(lost, 0.0)))

    def _repeats(self, ranks: np.ndarray, iteration: int) -> bool:
        """Count a stall of ``ranks``; whether one of them stalled, with at most
        ``reopen_within`` iterations between stalls, as often as :func:`repeats_needed` asks at
        the other ranks' stall rate (at least ``stall_repeat`` times)."""
        near = iteration - self.stall_last[ranks] <= self.cfg.reopen_within
        own = int(np.where(near, self.stall_count[ranks], 0).sum())   # these ranks' recent stalls
        self.stall_count[ranks] = np.where(near, self.stall_count[ranks] + 1, 1)
        self.stall_last[ranks] = iteration
        # the job's rate without these ranks' own stalls: a GPU that stalls often must not
        # raise its own bar
        others = max(1, (self.topo.world - len(ranks)) * self.iterations)
        rate = max(0, self.stalled_cells - own) / others
        self.stalled_cells += len(ranks)
        need = repeats_needed(rate, self.cfg.reopen_within, self.topo.world, max(1, self.cfg.stall_repeat))
        return bool((self.stall_count[ranks] >= need).any())

    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        cfg, cells = self.cfg, self.cells
        self.job_ms.append((obs.iteration, obs.job_ms))
        self.iterations += 1
        prev = cells.prev_streak
        ended = ((~obs.hot) & (prev > 0) & (prev <= cfg.transient_max) & ~cells.assigned
                 & obs.present[:, None])
        ended &= (cells.peak >= cfg.abs_ratio) & (cells.peak_z >= cfg.transient_z)
        if not ended.any():
            return []
        # a job that rarely stalls (fewer than ``stall_rare`` stalls an iteration so far, once
        # there is a history to say so): a stall is news whatever it cost; the cost gate is for
        # jobs that stall somewhere every iteration
        rare = (self.iterations > max(3, cfg.l1_min_history)
                and self.stalled_cells / (self.iterations - 1) < cfg.stall_rare)
        parts = []   # (ranks, onsets, stage index, cost fraction, GPU-hours, repeated, lost ms)
        ranks_c, stages_c = np.nonzero(ended)
        for s in np.unique(stages_c):
            ranks = np.unique(ranks_c[stages_c == s])
            onsets = cells.onset[ranks, s]
            for part_r, part_o in split_by_onset_and_place(ranks, onsets, onset_gap(cfg.transient_max),
                                                           self.topo):
                onset = int(part_o.min())
                frac, gpu_h = self._cost(onset, obs.iteration)
                parts.append((part_r, part_o, int(s), frac, gpu_h, self._repeats(part_r, obs.iteration),
                              self._lost_ms(part_r, int(s), onset, obs.iteration, obs)))
        # every stall ending now includes the last iteration, so the job's excess there is
        # charged to the one that lost the most (a 40x stall on a node explains it, not a 2x
        # blip on one rank beside it); the others are incidents only when they keep coming back
        costly = [k for k, p in enumerate(parts)
                  if rare or p[3] >= cfg.stall_min_excess or p[4] >= cfg.stall_min_gpu_hours]
        charged = max(costly, key=lambda k: parts[k][6]) if costly else -1
        out = []
        for k, (part_r, part_o, s, _, _, repeated, _) in enumerate(parts):
            onset = int(part_o.min())
            if k != charged and not repeated:
                self._count_sporadic(part_r, s, onset, obs)
                continue
            inc = new_rank_incident(self.job, IncidentClass.TRANSIENT_STALL, self.stages.stages[s].name,
                                    part_r, part_o, obs, self.topo)
            write_rank_evidence(inc, obs, self.topo, self.stages)
            book.judge_events(inc, obs.window)
            inc.resolve(obs.iteration)
            inc = book.register(inc)
            out.append(inc)
        return out

    def _count_sporadic(self, ranks: np.ndarray, s: int, onset: int, obs: Observation) -> None:
        sp = self.sporadic
        sp.stalls += 1
        sp.ranks.update(int(r) for r in ranks)
        sp.hosts.update(self.topo.hosts_of(ranks) or [f"node {n}" for n in self.topo.nodes_of(ranks)])
        sp.gpu_hours += self._lost_ms(ranks, s, onset, obs.iteration, obs) * self.topo.world / 3.6e6
        sp.first_iteration = onset if sp.first_iteration < 0 else sp.first_iteration
        sp.last_iteration = obs.iteration

    def active(self, inc: Incident, obs: Observation) -> bool:
        return False  # written resolved

    def quiet_to_resolve(self, inc: Incident) -> int:
        return 1

