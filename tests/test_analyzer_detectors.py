"""The analyzer's building blocks on synthetic series with known answers."""

import numpy as np
import pytest

from analyzer.config import AnalyzerConfig
from analyzer.detect.baseline import Baseline
from analyzer.detect.fast_median import nanmedian
from analyzer.detect.group_scores import group_stats, ratio_to_group
from analyzer.detect.spike import SpikeDetector
from analyzer.detect.step import StepDetector
from analyzer.diagnosis.event_verdicts import category, verdict
from rankscope.topology import Topology


def _series(rng, n_series, n, level=30_000.0, noise=0.01):
    return level * np.exp(rng.normal(0, noise, size=(n, n_series)))


def test_step_detector_finds_onset_levels_and_recovery_per_series():
    rng = np.random.default_rng(1)
    x = _series(rng, 3, 60)
    x[30:, 1] *= 3.0          # series 1 steps up at 30
    x[20:40, 2] *= 1.5        # series 2 steps at 20 and recovers at 40
    d = StepDetector(3)
    found, recovered = {}, {}
    for t in range(60):
        u = d.update(x[t])
        for s in np.flatnonzero(u.confirmed):
            found[int(s)] = (t, int(u.onset_index[s]), float(u.before[s]), float(u.after[s]))
        for s in np.flatnonzero(u.recovered):
            recovered[int(s)] = int(u.recovered_index[s])
    assert set(found) == {1, 2}
    t, onset, before, after = found[1]
    assert onset == 30 and t == 31          # confirmed one iteration after onset
    assert after / before == pytest.approx(3.0, rel=0.05)
    assert found[2][1] == 20 and recovered == {2: 40}


def test_step_detector_ignores_single_spikes_and_noise():
    rng = np.random.default_rng(2)
    x = _series(rng, 500, 300, noise=0.02)
    x[100, :] *= 4            # a one-iteration spike everywhere
    d = StepDetector(500)
    s = SpikeDetector(500)
    steps = spikes = 0
    for t in range(300):
        steps += int(d.update(x[t]).confirmed.sum())
        spikes += int(s.update(x[t]).spike.sum())
    assert steps == 0
    assert spikes == 500      # every series' spike, and nothing else


def test_baseline_absorbs_permanent_offsets_not_new_changes():
    b = Baseline((2,), alpha=0.2, warmup=3)
    for _ in range(10):
        b.update(np.log([1.05, 1.0]), learn=np.ones(2, bool))
    dev = np.exp(b.deviation(np.log([1.05, 1.2])))
    assert dev[0] == pytest.approx(1.0) and dev[1] == pytest.approx(1.2)
    b.update(np.log([9.0, 9.0]), learn=np.zeros(2, bool))   # frozen while anomalous
    assert np.exp(b.mean).tolist() == pytest.approx([1.05, 1.0])


def test_group_stats_match_the_incident_numbers():
    # IL-0477's EP group: 24 healthy ranks at ~40 ms, 8 at ~228 ms
    t = Topology(tp=1, pp=1, dp=64, ep=32, gpus_per_node=8)
    v = np.full((64, 1), 40.0)
    v[16:24] = 228.0
    st = group_stats(v, t.members("ep"))
    assert st.cv[0, 0] == pytest.approx(0.94, abs=0.01) and st.cv[1, 0] == 0
    r = ratio_to_group(v, t.members("ep"), t.group_ids("ep"))
    assert r[16, 0] == pytest.approx(5.7) and r[0, 0] == 1.0


def test_fast_nanmedian_agrees_with_numpy():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(7, 50, 3))
    a[rng.random(a.shape) < 0.3] = np.nan
    a[:, 0, 0] = np.nan
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        ref = np.nanmedian(a, axis=0)
    np.testing.assert_allclose(nanmedian(a, axis=0), ref, equal_nan=True)
    np.testing.assert_allclose(nanmedian(a[:, :, 1], axis=1), np.nanmedian(a[:, :, 1], axis=1))


def test_event_verdicts():
    assert category("server port down") == "network"
    assert verdict("network", "compute_straggler", True)[0] == "contradicted"
    assert verdict("network", "link_degradation", True)[0] == "supported"
    assert verdict("network", "link_degradation", False)[0] == "unrelated"
    assert verdict(category("GPU Xid 48: double-bit ECC"), "compute_straggler", True)[0] == "supported"
    assert verdict(None, "compute_straggler", True)[0] == "unrelated"


def test_config_refuses_unknown_and_negative_settings():
    with pytest.raises(ValueError, match="unknown analyzer setting"):
        AnalyzerConfig().with_overrides(cv_treshold=0.5)
    with pytest.raises(ValueError, match="must not be negative"):
        AnalyzerConfig(z=-1)


def test_event_categories_match_words_not_fragments():
    """A GPU's own NVLink, a report of something: not the network; a camelCase alert name and,
    when the name says nothing, the event's text are read too."""
    from analyzer.diagnosis.event_verdicts import category

    assert category("NVLink error count high") == "compute"
    assert category("GPU thermal violation reported by DCGM") == "compute"
    assert category("PCIe link degraded") == "compute"
    assert category("transport support ticket") is None
    assert category("NodeNetworkDown") == "network"
    assert category("IB port flapping") == "network"
    assert category("HostProbeFailed", "switch port facing the server down") == "network"
    assert category("HostProbeFailed", "probe timed out") is None


def _pp4_dp2(stall_both: bool):
    """8 ranks, pp=4 x dp=2 (one rank per worker): the last stage's mlp 1.6x on one or both ranks."""
    from analyzer.score.rank_scores import RankScorer
    from analyzer.score.stage_balance import PipelineBalanceScorer
    from rankscope.schema import DEFAULT_STAGES

    topo = Topology(tp=1, pp=4, dp=2, ep=1, gpus_per_node=8)
    mlp = DEFAULT_STAGES.index("mlp")
    rng = np.random.default_rng(3)
    ranks, balance = RankScorer(topo, DEFAULT_STAGES), PipelineBalanceScorer(topo, DEFAULT_STAGES)
    last = np.flatnonzero(topo.pp_index == 3)
    for _ in range(12):
        v = 400.0 * np.exp(rng.normal(0, 0.01, size=(topo.world, len(DEFAULT_STAGES))))
        v[last if stall_both else last[:1], mlp] *= 1.6
        scores, hot = ranks.update(v, np.ones(topo.world, bool)), balance.update(v)
    return topo, last, scores.hot[:, mlp], hot[:, mlp], balance.static[:, mlp]


def test_a_whole_stage_slow_from_the_start_is_the_pipelines_not_a_straggler():
    topo, last, rank_hot, group_hot, static = _pp4_dp2(stall_both=True)
    # both DP ranks of the last stage alike: no rank stands out against its DP partner ...
    assert not rank_hot.any()
    # ... and the stage stands out against the other stages, with no past to compare with
    assert np.flatnonzero(group_hot).tolist() == [3] and static[3]


def test_one_rank_of_a_dp_pair_slow_is_still_a_straggler():
    topo, last, rank_hot, group_hot, static = _pp4_dp2(stall_both=False)
    assert np.flatnonzero(rank_hot).tolist() == [int(last[0])]


def test_a_node_holding_both_dp_partners_that_throttles_is_still_a_straggler():
    # DP groups of 2 on one 2-GPU node: the partners slow alike, but it is a change against
    # their own past (a throttling node), not a stage long from the start
    from analyzer.score.rank_scores import RankScorer
    from rankscope.schema import DEFAULT_STAGES

    topo = Topology(tp=1, pp=4, dp=2, ep=1, gpus_per_node=2)
    first = np.flatnonzero(topo.pp_index == 0)
    assert len(set(topo.node_index[first])) == 1
    mlp = DEFAULT_STAGES.index("mlp")
    rng = np.random.default_rng(4)
    scorer = RankScorer(topo, DEFAULT_STAGES)
    for t in range(16):
        v = 400.0 * np.exp(rng.normal(0, 0.01, size=(topo.world, len(DEFAULT_STAGES))))
        if t >= 10:
            v[first, mlp] *= 1.6
        hot = scorer.update(v, np.ones(topo.world, bool)).hot[:, mlp]
    assert np.flatnonzero(hot).tolist() == first.tolist()


def test_noise_that_grows_for_the_whole_job_is_followed_and_raises_no_stall():
    """The noise scale is capped by its recent past (half a job stalling at once cannot widen
    it), yet the whole job's noise tripling for good takes no cell to the transient-stall bar."""
    from analyzer.detect.noise_scale import NoiseScale
    from analyzer.score.rank_scores import RankScorer
    from rankscope.schema import DEFAULT_STAGES

    cfg = AnalyzerConfig()
    topo = Topology(tp=1, pp=4, dp=128, ep=8, gpus_per_node=8)
    scorer, rng = RankScorer(topo, DEFAULT_STAGES, cfg), np.random.default_rng(3)
    base = rng.uniform(20, 60, len(DEFAULT_STAGES))
    worst = 0.0
    for it in range(80):
        sigma = 0.03 if it < 40 else 0.09
        v = base * np.exp(sigma * rng.standard_normal((topo.world, len(DEFAULT_STAGES))))
        s = scorer.update(v, np.ones(topo.world, dtype=bool))
        if it >= 40:
            bar = (s.ratio >= cfg.abs_ratio) & (s.z_now >= cfg.transient_z)
            assert not bar.any(), f"iteration {it}: {int(bar.sum())} cell(s) at the stall bar"
            worst = max(worst, float(np.nanmax(s.z_now)))
    assert worst < cfg.transient_z
    ns = NoiseScale(1)
    for _ in range(8):
        ns.update(np.array([0.03]))
    assert ns.update(np.array([0.09]))[0] == pytest.approx(0.06)      # capped at first
    for _ in range(4):
        ns.update(np.array([0.09]))
    assert ns.update(np.array([0.09]))[0] == pytest.approx(0.09)      # then followed
