"""Pipeline balance: a whole PP stage that computes more than it used to.

When one pipeline stage gets more work (an uneven layer split, a heavier
loss/embedding stage), its ranks are all equally slow, so no rank stands out
inside its DP group; what stands out is the DP group itself against the other
stages of the pipeline, and every other stage waits in pipeline bubbles. Each
iteration the low quantile of every DP group (a PP stage at one TP index) and
compute stage, relative to the median of all DP groups, is compared with

- its own baseline: a stage that became ``min_change`` slower than it was;
- the other stages, whatever the past (compute stages only; host stages differ between
  stages by design): ``abs_ratio`` (1.5x) and ``min_excess_ms`` above the median of the
  other stages once ``baseline_warmup`` iterations are in, a stage that has been long from the
  first step (an uneven layer split, the loss and LM head on the last stage:
  the "stage" stragglers of Lin et al., "Understanding Stragglers in Large
  Model Training Using What-if Analysis", OSDI 2025);

vectorised over groups and stages.

Example::

    >>> import numpy as np
    >>> from rankscope.schema import DEFAULT_STAGES
    >>> from rankscope.topology import Topology
    >>> t = Topology(tp=1, pp=4, dp=8, ep=4, gpus_per_node=8)
    >>> b = PipelineBalanceScorer(t, DEFAULT_STAGES)
    >>> v = np.full((32, len(DEFAULT_STAGES)), 40.0)
    >>> for _ in range(6):
    ...     _ = b.update(v)
    >>> v[t.pp_index == 2, 1] *= 1.8        # stage pp=2 does 1.8x the mlp work
    >>> hot = b.update(v)
    >>> np.argwhere(hot).tolist()           # [dp group, stage]
    [[2, 1]]
    >>> b = PipelineBalanceScorer(t, DEFAULT_STAGES)
    >>> v = np.full((32, len(DEFAULT_STAGES)), 40.0)
    >>> v[t.pp_index == 3, 1] *= 1.6        # the last stage has been long from the start
    >>> hots = [b.update(v) for _ in range(8)]
    >>> np.argwhere(hots[-1]).tolist(), bool(b.static[3, 1]), round(float(b.last_ratio[3, 1]), 2)
    ([[3, 1]], True, 1.6)
"""

from __future__ import annotations

import warnings

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.detect.baseline import Baseline
from analyzer.detect.group_scores import group_quantiles
from rankscope.schema import StageSet
from rankscope.topology import Topology


class PipelineBalanceScorer:
    """Hot (DP group, stage) cells: a PP stage slower than its own past, relative to the others."""

    def __init__(self, topo: Topology, stages: StageSet, config: AnalyzerConfig | None = None):
        self.topo, self.cfg = topo, config or AnalyzerConfig()
        self.cause = np.array([s.kind in ("compute", "host") for s in stages])
        # host stages (the data loader on the first stage only, the optimizer) differ between
        # stages by design: only compute is compared with the other stages
        self.compute = np.array([s.kind == "compute" for s in stages])
        self.enabled = topo.pp >= 2
        self.base = Baseline((topo.group_count("dp"), len(stages)), alpha=self.cfg.baseline_alpha,
                             warmup=self.cfg.baseline_warmup)
        self.last_ratio = np.ones((topo.group_count("dp"), len(stages)))
        #: Cells hot against the other stages only (long from the start, not a change).
        self.static = np.zeros((topo.group_count("dp"), len(stages)), dtype=bool)
        self.t = 0
        g = topo.group_count("dp")   # pp x tp groups: few, so the index of the others is small
        self._others = np.array([np.r_[0:i, i + 1:g] for i in range(g)]) if g > 1 else None

    def update(self, values: np.ndarray) -> np.ndarray:
        """Bool ``[dp_group, stage]``: the group's stage is hot."""
        # a stage that has more work is slow on all its ranks: its low quantile moves too;
        # a few slow ranks inside it (stragglers) do not move it
        med = group_quantiles(values, self.topo.members("dp"), self.cfg.reference_quantile)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            lg = np.log(med) - np.nanmedian(np.log(med), axis=0, keepdims=True)
        rel = self.base.deviation(lg)
        trusted = self.base.trusted()
        self.t += 1
        on = self.cause[None, :] & self.enabled
        others = _median_of_others(med, self._others)
        with np.errstate(invalid="ignore"):
            changed = trusted & (rel > np.log1p(self.cfg.min_change)) & on
            # against the median of the *other* stages (with pp=2 the median of both is their
            # midpoint), by abs_ratio and by at least min_excess_ms
            lo = np.log(med) - np.log(others)
            static = ((lo > np.log(self.cfg.abs_ratio)) & (med - others >= self.cfg.min_excess_ms)
                      & self.compute[None, :] & self.enabled & (self.t > self.cfg.baseline_warmup))
        # while a stage column has a changed group, none of its groups learns: the reference is
        # the others' median (with pp=2 the midpoint of both), so one stage slowing drags the
        # others down; learned, that dip would make them "slower than they were" once it ends
        self.base.update(lg, learn=~changed & ~changed.any(axis=0, keepdims=True))
        self.static = static & ~changed
        with np.errstate(all="ignore"):
            self.last_ratio = np.where(self.static, np.exp(lo), np.exp(rel))
        return changed | static


def _median_of_others(med: np.ndarray, others: np.ndarray | None) -> np.ndarray:
    """``[G, S]``: for every group, the median over the other groups (NaN-aware);
    ``others[g]`` lists the groups other than g (None: a single group)."""
    if others is None:
        return np.full(med.shape, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(med[others], axis=1)
