"""Transfer floors of collectives: where a slow link shows.

A collective finishes when its last member arrives plus the transfer time;
the last arriver waits for nobody, so the group's *minimum* measured duration
approximates the pure transfer time. A rising floor means slow transfers (a
degraded link somewhere in the group); a wide spread with a steady floor means
waiting on a straggler. The ranks behind a degraded link are those at the
intersection of the groups (of every kind) whose floor rose.

Each iteration, per communication stage, the floor of every group of the
stage's kind is compared with its own baseline and with the median floor of
all groups of that kind, in log space, vectorised over groups.

A minimum is fragile to a missing member: when the rank that sets a group's floor (the
pipeline stage that sends least, the last arriver) had its point dropped, the floor of the
others is higher, and with 1% of points dropped many groups "rise" every iteration. A
rank's missing value is therefore taken as its last one, for up to ``silent_after``
iterations (after that the rank is silent, a matter for the silence rule).

Example::

    >>> import numpy as np
    >>> from rankscope.schema import DEFAULT_STAGES
    >>> from rankscope.topology import Topology
    >>> t = Topology(tp=1, pp=2, dp=8, ep=4, gpus_per_node=4)
    >>> f = TransferFloorScorer(t, DEFAULT_STAGES)
    >>> v = np.full((16, len(DEFAULT_STAGES)), 5.0)
    >>> for _ in range(6):
    ...     _ = f.update(v)
    >>> # node 1 (ranks 4-7) has a slow NIC: its EP all-to-all (column 2) and its
    >>> # DP reduce-scatter (column 6) take longer for every member of those groups
    >>> v[t.group_ranks("ep", 4), 2] = 15.0
    >>> v[t.group_ranks("dp", 4), 6] = 15.0
    >>> culprits, stage, ratio = intersect_risen(t, f.update(v))
    >>> culprits.tolist()
    [4, 5, 6, 7]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.detect.baseline import Baseline
from analyzer.detect.group_scores import robust_sigma
from rankscope.schema import StageSet
from rankscope.topology import Topology


@dataclass
class FloorScores:
    """Per communication stage: its group kind, each group's floor ratio and risen mask."""

    stage: list[str]
    kind: list[str]
    floor: list[np.ndarray]   # [G_k] ms
    ratio: list[np.ndarray]   # floor / baseline (or / median floor of the kind before trusted)
    risen: list[np.ndarray]   # bool [G_k]


class TransferFloorScorer:
    """Floors of every collective group, per comm stage; ``update`` once per iteration."""

    def __init__(self, topo: Topology, stages: StageSet, config: AnalyzerConfig | None = None):
        self.topo, self.cfg = topo, config or AnalyzerConfig()
        self.comm = [(i, s.name, s.group) for i, s in enumerate(stages)
                     if s.kind == "comm" and topo.group_size(s.group) > 1]
        self.base = {name: Baseline((topo.group_count(kind),), alpha=self.cfg.baseline_alpha,
                                    warmup=self.cfg.baseline_warmup) for _, name, kind in self.comm}
        cols = [i for i, _, _ in self.comm]
        self._cols = np.asarray(cols, dtype=np.int64)
        self._last = np.full((topo.world, len(cols)), np.nan)   # each rank's last value
        self._age = np.zeros((topo.world, len(cols)), dtype=np.int64)   # iterations since

    def _filled(self, values: np.ndarray) -> np.ndarray:
        """The comm columns with a dropped point taken as the rank's last value (recent only)."""
        v = values[:, self._cols]
        seen = ~np.isnan(v)
        self._age = np.where(seen, 0, self._age + 1)
        self._last = np.where(seen, v, self._last)
        return np.where(seen | (self._age > self.cfg.silent_after), v, self._last)

    def update(self, values: np.ndarray) -> FloorScores:
        out = FloorScores([], [], [], [], [])
        cfg = self.cfg
        filled = self._filled(values)
        for j, (_, name, kind) in enumerate(self.comm):
            g = filled[:, j][self.topo.members(kind)]
            with np.errstate(all="ignore"):
                import warnings
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    floor = np.nanmin(g, axis=1)
                    lf = np.log(np.where(floor > 0, floor, np.nan))
                    cross = lf - np.nanmedian(lf)
            b = self.base[name]
            if b.trusted().all():
                # against each group's own past, in units of its own noise
                rel = b.deviation(lf)
                sig = np.maximum(b.sigma(), cfg.min_sigma)
            else:
                rel = cross
                sig = max(float(np.nan_to_num(robust_sigma(rel[:, None], axis=0)[0], nan=0.0)), cfg.min_sigma)
            with np.errstate(invalid="ignore"):
                risen = (rel > np.log1p(cfg.floor_change)) & (rel > cfg.z * sig)
            b.update(lf, learn=~risen)
            out.stage.append(name)
            out.kind.append(kind)
            out.floor.append(floor)
            out.ratio.append(np.exp(rel))
            out.risen.append(risen)
        return out


def intersect_risen(topo: Topology, scores: FloorScores) -> tuple[np.ndarray, str | None, float]:
    """The ranks in risen groups of the most kinds (a degraded link slows every kind of
    collective its ranks take part in), with those of their nodes one kind short of that; the
    stage whose floor rose most among their groups. Kinds with no risen group do not constrain,
    and a group risen by chance elsewhere (a TP group's floor is a sum of waits, and noisy) is in
    fewer kinds. Where no rank is in risen groups of two kinds, the smallest set. Empty when
    nothing rose.
    """
    sets: dict[str, np.ndarray] = {}
    rose: list[tuple[str, str, np.ndarray, np.ndarray]] = []
    for name, kind, ratio, risen in zip(scores.stage, scores.kind, scores.ratio, scores.risen, strict=True):
        if not risen.any():
            continue
        # the groups behind the link rise most; groups that only wait on them rise less
        with np.errstate(all="ignore"):
            lr = np.log(ratio)
        risen = risen & (lr >= 0.5 * np.nanmax(lr[risen]))
        sets[kind] = np.union1d(sets.get(kind, np.empty(0, np.int64)), topo.members(kind)[risen].reshape(-1))
        rose.append((name, kind, ratio, risen))
    if not sets:
        return np.empty(0, np.int64), None, 1.0
    count = np.zeros(topo.world, dtype=np.int64)
    for ranks in sets.values():
        count[ranks] += 1
    top = int(count.max())
    if top >= 2:
        # the ranks in risen groups of the most kinds, and those of their nodes one kind short of
        # it (a noisy floor of one kind missed them this iteration); a group risen by chance
        # elsewhere, in a kind or two, is not the link
        core = np.flatnonzero(count == top)
        near = (count >= top - 1) & np.isin(topo.node_index, topo.node_index[core])
        culprits = np.flatnonzero(near) if top >= 3 else core
    else:
        culprits = min(sets.values(), key=len)
    best_stage, best_ratio = None, 1.0
    for name, kind, ratio, risen in rose:
        mine = risen & np.isin(topo.members(kind), culprits).any(axis=1)
        r = float(np.nanmax(ratio[mine])) if mine.any() else 1.0
        if r > best_ratio:
            best_stage, best_ratio = name, r
    return np.sort(culprits), best_stage, best_ratio
