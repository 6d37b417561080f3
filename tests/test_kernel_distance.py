"""L3's score per kernel (issue 32, item 4, first part): each rank's W1 distance to its own
group's reference distribution, O(ranks), and the outliers beyond the job's fences."""

import numpy as np
import pytest

from analyzer.score.kernel_distance import kernel_distances
from collector.kernel_modes import compress
from rankscope.topology import Topology

TOPO = Topology(tp=1, pp=4, dp=16, ep=8, gpus_per_node=8)   # 64 ranks, DP groups of 16


def _modes(rng, medians):
    """Every rank's modes from 2,000 events of a kernel at its median (bimodal: 10% 2.5x)."""
    out = [compress(np.r_[rng.lognormal(np.log(m), 0.05, 1800), rng.lognormal(np.log(2.5 * m), 0.05, 200)])
           for m in medians]
    k = max(len(o) for o in out)
    arr = np.full((3, len(out), k), np.nan)
    for r, modes in enumerate(out):
        for j, md in enumerate(modes):
            arr[:, r, j] = (md.count, md.p50_us, md.p99_us)
    return arr


def _scores(medians, seed=1):
    count, p50, p99 = _modes(np.random.default_rng(seed), medians)
    return kernel_distances(count, p50, p99, TOPO.members("dp"), TOPO.group_ids("dp"))


def test_the_rank_whose_kernel_slowed_is_the_outlier_against_its_own_group():
    # each pipeline stage runs the kernel on other shapes: 100, 200, 300, 400 us by stage
    medians = 100.0 * (1 + TOPO.pp_index)
    medians[37] *= 1.4
    d = _scores(medians)
    assert np.flatnonzero(d.outlier).tolist() == [37]
    # the mean of the body (quantiles up to 0.9) moved by about 40 us
    assert d.shift_us[37] == pytest.approx(0.4 * medians[37] / 1.4, rel=0.2)


def test_a_faster_rank_a_missing_kernel_and_healthy_ranks_are_no_outliers():
    medians = 100.0 * (1 + TOPO.pp_index)
    medians[5] *= 0.6                                   # faster than its group: not a fault
    count, p50, p99 = _modes(np.random.default_rng(2), medians)
    count[9], p50[9], p99[9] = np.nan, np.nan, np.nan   # rank 9 never ran this kernel
    d = kernel_distances(count, p50, p99, TOPO.members("dp"), TOPO.group_ids("dp"))
    assert not d.outlier.any()
    assert np.isnan(d.w1_us[9]) and np.isfinite(np.delete(d.w1_us, 9)).all()


def test_a_kernel_no_rank_ran_is_refused():
    nan = np.full((TOPO.world, 1), np.nan)
    with pytest.raises(ValueError, match="no rank has a mode"):
        kernel_distances(nan, nan, nan, TOPO.members("dp"), TOPO.group_ids("dp"))
