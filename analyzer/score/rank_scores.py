"""Per-rank L2 scores each iteration: which ranks are slow in which stage, against whom.

Every rank's stage time is divided by the median of its *peers*: the ranks of
its DP group (same pipeline stage, same TP index), which run the same layers
on the same shapes. The log of that ratio is compared with

- the rank's own baseline (:class:`~analyzer.detect.baseline.Baseline`), smoothed over
  a few iterations: a GPU that has always been 5% slow is not news, one that
  just became 20% slower is;
- the group itself, whatever the past: ``abs_ratio`` (1.5x) above the peers;
- a single iteration far out (``spike_ratio``): transient stalls;

each also ``z`` robust sigmas out, the sigma measured across all ranks of the
stage this iteration, at most twice its recent level (:mod:`analyzer.detect.noise_scale`). Communication stages are scored the same way against the
group their collective runs in (EP for dispatch/combine, DP for
reduce_scatter/all_gather, the pipeline for p2p), which is the evidence of who
waited and who arrived last.

With DP groups of 2 the peers are the pipeline (or the node), ranks that run other
layers; evidence against the group alone (``abs_ratio``, no change against the rank's
past) then counts only if the rank also stands ``min_change`` above its DP partner (a
partner with no point this iteration vetoes nothing). A whole PP stage long alike from
the start (both its DP ranks) is the pipeline's imbalance (:mod:`analyzer.score.stage_balance`),
not a straggler; a change (a node that throttles, even one holding both partners) still is.

All of it is array arithmetic over ``[rank, stage]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.detect.baseline import Baseline
from analyzer.detect.fast_median import median3, nanmedian
from analyzer.detect.group_scores import group_medians, group_quantiles, lower_sigma
from analyzer.detect.noise_scale import NoiseScale
from rankscope.schema import StageSet
from rankscope.topology import Topology


@dataclass
class RankScores:
    """One iteration's scores, arrays ``[rank, stage]`` (stages in StageSet order)."""

    ratio: np.ndarray        # value / peer-group median (comm: / own collective group median)
    smooth_ratio: np.ndarray  # the same, median over the last ``smooth`` iterations
    rel: np.ndarray          # smoothed log ratio minus the rank's own baseline
    z: np.ndarray            # rel in robust sigmas of this stage across ranks
    hot: np.ndarray          # bool: slow beyond the thresholds (cause stages only)
    z_now: np.ndarray        # this iteration alone: log ratio over own baseline, in this stage's sigmas
    #: bool: this iteration alone is out as a smoothed value must be (its change over the rank's own
    #: past, or its ratio to the group, and the z), and material: where a streak really began, the
    #: smoothing's median making it hot an iteration later
    out_now: np.ndarray | None = None


def peer_kind(topo: Topology) -> str:
    """The group whose members do the same work: DP when it has at least 3 ranks."""
    return "dp" if topo.dp >= 3 else "pipeline" if topo.pp >= 3 else "node"


class RankScorer:
    """State of the per-rank scores of one job; ``update`` once per iteration."""

    def __init__(self, topo: Topology, stages: StageSet, config: AnalyzerConfig | None = None):
        self.topo, self.stages = topo, stages
        self.cfg = config or AnalyzerConfig()
        n, s = topo.world, len(stages)
        self.ref_kind = [st.group if st.kind == "comm" else peer_kind(topo) for st in stages]
        self.cause = np.array([st.kind in ("compute", "host") for st in stages])
        self.baseline = Baseline((n, s), alpha=self.cfg.baseline_alpha, warmup=self.cfg.baseline_warmup)
        self.hist = np.full((self.cfg.smooth, n, s), np.nan)
        self.prev_hot = np.zeros((n, s), dtype=bool)
        self.t = 0
        # each sigma capped by its recent past: half a group stalling at once cannot inflate it
        self.noise = {k: NoiseScale(s) for k in ("smooth", "now", "lr")}
        self._kinds = sorted(set(self.ref_kind))
        # peers from other layers: the DP partner decides whether a rank stands out at all
        self._dp_check = topo.dp == 2 and peer_kind(topo) != "dp" and bool(self.cause.any())
        if self._dp_check:
            m = topo.members("dp")[topo.group_ids("dp")]           # [R, 2]
            self._partner = np.where(m[:, 0] == topo.ranks, m[:, 1], m[:, 0])

    def ratios(self, values: np.ndarray) -> np.ndarray:
        """Each rank's value over its reference group's norm, ``[R, S]``.

        Compute and host stages are divided by the peers' ``reference_quantile``
        (default the 25th percentile): what healthy peers achieve, even when a
        third or a half of the group is slow. Communication stages by the median
        of the group the collective runs in (the evidence of waits and short arrivals).
        """
        out = np.full(values.shape, np.nan)
        for kind in self._kinds:
            for cause in (True, False):
                cols = [i for i, k in enumerate(self.ref_kind) if k == kind and self.cause[i] == cause]
                if not cols:
                    continue
                v = values[:, cols]
                members = self.topo.members(kind)
                if cause:
                    ref = group_quantiles(v, members, self.cfg.reference_quantile)
                else:
                    ref = group_medians(v, members)
                ref = ref[self.topo.group_ids(kind)]
                with np.errstate(all="ignore"):
                    out[:, cols] = np.where(ref > 0, v / ref, np.nan)
        return out

    def stands_out_in_dp(self, values: np.ndarray) -> np.ndarray:
        """Bool ``[R, S]`` (DP groups of 2): the rank stands ``min_change`` above its DP partner,
        or the partner has no value to compare with."""
        partner = values[self._partner]
        with np.errstate(invalid="ignore"):
            return ~(values <= partner * (1.0 + self.cfg.min_change))

    def update(self, values: np.ndarray, present: np.ndarray) -> RankScores:
        cfg = self.cfg
        ratio = self.ratios(values)
        with np.errstate(all="ignore"):
            lr = np.log(ratio)
        self.hist[self.t % cfg.smooth] = lr
        self.t += 1
        k = min(self.t, cfg.smooth)
        if k == 3:
            lr_s = median3(self.hist[0], self.hist[1], self.hist[2])
        else:
            lr_s = nanmedian(self.hist[:k], axis=0)
        rel = self.baseline.deviation(lr_s)
        rel_now = self.baseline.deviation(lr)
        sig = np.maximum(self.noise["smooth"].update(lower_sigma(rel)), cfg.min_sigma)   # [S]
        sig_now = np.maximum(self.noise["now"].update(lower_sigma(rel_now)), cfg.min_sigma)
        sig_lr = np.maximum(self.noise["lr"].update(lower_sigma(lr_s)), cfg.min_sigma)
        with np.errstate(invalid="ignore"):
            hot_smooth = (rel > np.log1p(cfg.min_change)) & (rel > cfg.z * sig)
            hot_abs = (lr_s > np.log(cfg.abs_ratio)) & (lr_s > cfg.z * sig_lr)
            hot_now = (rel_now > np.log(cfg.spike_ratio)) & (rel_now > cfg.z * sig_now)
            # smoothed evidence counts only while this iteration is still out too, so a
            # streak ends the iteration the rank recovers (transient stalls keep their length)
            # (out by half the change floor and by twice this stage's iteration-to-iteration noise)
            still = rel_now > np.maximum(0.5 * np.log1p(cfg.min_change), 2 * sig_now)
            # hysteresis: a cell already hot stays hot down to half the thresholds, so a
            # straggler just above the floor does not flicker in and out
            hot_cont = self.prev_hot & (rel > 0.5 * np.log1p(cfg.min_change)) & (rel > 0.5 * cfg.z * sig)
            # and the baseline learns only what is clearly normal, so a slowdown near the
            # threshold is not absorbed into "normal" bit by bit
            calm = rel < 0.5 * np.log1p(cfg.min_change)
            # material: the time lost must matter (a 1 ms kernel inflated tenfold by the
            # OS scheduler is not a fail-slow; a 40 ms mlp at 1.2x is)
            material = (values - values / ratio) >= cfg.min_excess_ms
        ok = material & present[:, None] & self.cause[None, :]
        if self._dp_check:
            hot_abs &= self.stands_out_in_dp(values)
        # evidence against the rank's own past needs a past: until its baseline is trusted a
        # cell is hot only far above its group (a GPU that has always been a little slow must
        # become its own normal first, not latch hot from the first iteration)
        trusted = self.baseline.trusted()
        hot_smooth &= trusted
        hot_cont &= trusted
        sustained = (hot_smooth | hot_abs | hot_cont) & still & ok
        hot = sustained | (hot_now & ok)
        # only sustained evidence carries the hysteresis on: a one-iteration spike (a sporadic
        # stall) must not keep a GPU a few percent slow hot while its baseline is young
        self.prev_hot = sustained
        # (comm stages learn too: their ratio is evidence)
        # (until a cell's baseline is trusted it learns whatever is not hot: a GPU that has
        # always been a little slow must become its own normal first)
        learn = ~(hot_smooth | hot_abs | hot_now | hot) & (calm | ~trusted) & present[:, None]
        self.baseline.update(lr_s, learn=learn)
        with np.errstate(all="ignore"):
            z = rel / sig
            z_now = rel_now / sig_now
            out_now = ((((rel_now > np.log1p(cfg.min_change)) & trusted) | (lr > np.log(cfg.abs_ratio)))
                       & (rel_now > cfg.z * sig_now) & ok)
        return RankScores(ratio=ratio, smooth_ratio=np.exp(lr_s), rel=rel, z=z, hot=hot, z_now=z_now,
                          out_now=out_now)
