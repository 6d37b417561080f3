"""The L2 points a cycle writes: bounded ``l2_group`` (the highest CV and the reported ranks'
groups), ``l2_kind`` over all groups, and what the restarted analyzer takes from them."""

import numpy as np
import pandas as pd

from analyzer.config import AnalyzerConfig
from analyzer.detect.group_scores import group_stats
from analyzer.score.l2_points import l2_frames, notable_groups
from rankscope import schema
from rankscope.topology import Topology

STAGES = schema.DEFAULT_STAGES


def _window(topo: Topology, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.lognormal(np.log(100.0), 0.05, (topo.world, len(STAGES)))


def test_notable_groups_keep_the_highest_cv():
    cv = np.array([[0.1, 0.9], [0.5, np.nan], [0.3, 0.2], [np.nan, 0.4]])
    mask = notable_groups(cv, 2)
    assert mask[:, 0].tolist() == [False, True, True, False]    # 0.5, 0.3 (NaN last)
    assert mask[:, 1].tolist() == [True, False, False, True]    # 0.9, 0.4
    assert notable_groups(cv, 9).all()


def test_l2_group_is_bounded_and_l2_kind_summarises_every_group():
    topo = Topology(tp=1, pp=4, dp=256, ep=8, gpus_per_node=8)   # 1,024 ranks, 256 pipeline groups
    med = _window(topo)
    slow = 517
    med[slow, STAGES.index("mlp")] *= 6.0
    cfg = AnalyzerConfig(l2_groups=5)
    # l2_rank reports rank 3 in its ep group's attention (its CV is not among the highest)
    reported = pd.DataFrame({"rank": [3], "stage": ["attention"], "group_type": ["ep"],
                             "group_id": [topo.group_ids("ep")[3]]})
    kind, group = l2_frames("j", topo, STAGES, med, 1_000, cfg, reported)
    per = group.groupby(["group_type", "stage"]).size()
    for k in ("pipeline", "ep", "node"):
        assert topo.group_count(k) > 5
        assert per.loc[k].drop("attention", errors="ignore").eq(5).all(), (k, per.loc[k])
    assert per.loc[("ep", "attention")] == 6 and per.loc[("pipeline", "attention")] == 5
    ep_att = group[(group["group_type"] == "ep") & (group["stage"] == "attention")]
    assert topo.group_ids("ep")[3] in set(ep_att["group_id"])
    dp = group[group["group_type"] == "dp"]
    assert len(dp) == topo.group_count("dp") * len(STAGES)          # 4 groups: every one
    for k in ("pipeline", "ep", "node"):
        g = group[(group["group_type"] == k) & (group["stage"] == "mlp")]
        assert topo.group_ids(k)[slow] in set(g["group_id"])     # the slow rank's: highest CV
    st = group_stats(med, topo.members("pipeline"))
    row = kind[(kind["group_type"] == "pipeline") & (kind["stage"] == "mlp")].iloc[0]
    s = STAGES.index("mlp")
    assert row["groups"] == topo.group_count("pipeline")
    assert row["cv_max"] == np.nanmax(st.cv[:, s])
    assert row["floor"] == np.nanmin(st.min[:, s]) and row["max"] == np.nanmax(st.max[:, s])
    assert row["anomalous"] == int((st.cv[:, s] > cfg.cv_threshold).sum()) >= 1
    top = group[(group["group_type"] == "pipeline") & (group["stage"] == "mlp")]
    assert top["cv"].max() == row["cv_max"] and top["anomalous"].sum() == row["anomalous"]
    assert set(kind.columns) >= set(schema.MEASUREMENTS[schema.L2_KIND].fields) | {"time", "job"}


def test_a_kind_with_no_data_in_a_stage_writes_no_row_for_it():
    topo = Topology(tp=2, pp=1, dp=4, ep=1, gpus_per_node=8)
    med = _window(topo)
    med[:, STAGES.index("dispatch")] = np.nan
    kind, group = l2_frames("j", topo, STAGES, med, 1, AnalyzerConfig(), pd.DataFrame())
    assert "dispatch" not in set(kind["stage"]) and "dispatch" not in set(group["stage"])
    assert len(kind) == (len(STAGES) - 1) * kind["group_type"].nunique()


def test_restarted_analyzer_resumes_at_l2_kind_or_at_l2_group_of_older_versions(influx_store):
    from analyzer.read.iteration_reader import IterationReader

    frames = []
    for i in range(12):
        frames.append(pd.DataFrame({"time": 1_000_000 + i * 1_000 + np.arange(4), "job": "j",
                                    "rank": np.arange(4), "pp": 0, "dp": np.arange(4), "tp": 0,
                                    "iteration": i, "iteration_ms": 1000.0, "mlp": 10.0}))
    influx_store.write_stage_latency(pd.concat(frames, ignore_index=True))
    old = pd.DataFrame({"time": [1_004_000], "job": "j", "group_type": "dp", "group_id": 0, "stage": "mlp",
                        "cv": 0.1, "mean": 1.0, "median": 1.0, "min": 1.0, "max": 1.0, "std": 0.1,
                        "size": 4, "anomalous": 0})
    influx_store.write_measurement(schema.L2_GROUP, old)
    reader = IterationReader(influx_store, "j")
    reader.resume(history=2, wait_ms=0)
    assert reader.replay is not None and reader.replay.analyzed_ms == 1_004_000
    kind = pd.DataFrame({"time": [1_008_000], "job": "j", "group_type": "dp", "stage": "mlp", "groups": 1,
                         "anomalous": 0, "cv_max": 0.1, "cv_median": 0.1, "floor": 1.0, "median": 1.0,
                         "max": 1.0})
    influx_store.write_measurement(schema.L2_KIND, kind)
    reader = IterationReader(influx_store, "j")
    reader.resume(history=2, wait_ms=0)
    assert reader.replay.analyzed_ms == 1_008_000
