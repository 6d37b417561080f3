"""The L2 points a cycle writes back: ``l2_group`` for every group and stage, ``l2_rank`` above a floor.

Both are computed from the per-rank medians over the last ``l2_window``
iterations (robust to a single noisy iteration), vectorised over all groups
of every kind. ``l2_rank`` carries only ranks whose ratio to their reference
group is at least ``report_ratio`` (or at most its inverse: the short
collectives of ranks that arrive last), at most ``report_max_ranks`` of them,
so the database is not flooded with 12,960 x 10 scores every cycle.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analyzer.config import AnalyzerConfig
from analyzer.detect.fast_median import nanmedian
from analyzer.detect.group_scores import group_stats
from analyzer.score.rank_scores import RankScores
from rankscope.schema import StageSet
from rankscope.topology import GROUP_KINDS, Topology


def window_medians(values: np.ndarray) -> np.ndarray:
    """``[T, R, S]`` -> ``[R, S]`` medians over time (NaN-aware)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return nanmedian(values, axis=0)


def l2_group_frame(job: str, topo: Topology, stages: StageSet, med: np.ndarray, time_ms: int,
                   cfg: AnalyzerConfig) -> pd.DataFrame:
    """One row per (group kind, group, stage) for kinds with more than one member."""
    frames = []
    for kind in GROUP_KINDS:
        if topo.group_size(kind) < 2:
            continue
        st = group_stats(med, topo.members(kind))
        g, s = st.mean.shape
        gid = np.repeat(np.arange(g), s)
        sid = np.tile(np.arange(s), g)
        frames.append(pd.DataFrame({
            "group_type": kind, "group_id": gid, "stage": np.array(stages.names, dtype=object)[sid],
            "cv": st.cv.reshape(-1), "mean": st.mean.reshape(-1), "median": st.median.reshape(-1),
            "min": st.min.reshape(-1), "max": st.max.reshape(-1), "std": st.std.reshape(-1),
            "size": st.count.reshape(-1).astype(np.int64),
            "anomalous": (np.nan_to_num(st.cv.reshape(-1)) > cfg.cv_threshold).astype(np.int64),
        }))
    df = pd.concat(frames, ignore_index=True)
    df = df[np.isfinite(df["mean"].to_numpy())]
    df.insert(0, "job", job)
    df.insert(0, "time", np.int64(time_ms))
    return df.reset_index(drop=True)


def l2_rank_frame(job: str, topo: Topology, stages: StageSet, med: np.ndarray, scores: RankScores,
                  ref_kind: list[str], time_ms: int, cfg: AnalyzerConfig) -> pd.DataFrame:
    """Ranks whose (window) ratio to their reference group is out by ``report_ratio``."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        ratio = scores.smooth_ratio
        lr = np.abs(np.log(ratio))
    out = np.nan_to_num(lr) >= np.log(cfg.report_ratio)
    out |= scores.hot
    r, s = np.nonzero(out)
    if len(r) > cfg.report_max_ranks:
        keep = np.argsort(-np.nan_to_num(lr[r, s]), kind="stable")[: cfg.report_max_ranks]
        r, s = r[keep], s[keep]
    kinds = np.array(ref_kind, dtype=object)
    gids = np.stack([topo.group_ids(k) for k in ref_kind], axis=1) if ref_kind else np.zeros((topo.world, 0))
    return pd.DataFrame({
        "time": np.full(len(r), time_ms, dtype=np.int64), "job": job, "rank": r.astype(np.int64),
        "stage": np.array(stages.names, dtype=object)[s], "node": topo.node_index[r],
        **({"host": np.asarray(topo.hosts, dtype=object)[topo.node_index[r]]} if topo.hosts else {}),
        "value": med[r, s], "ratio": ratio[r, s], "z": np.nan_to_num(scores.z[r, s]),
        "baseline_ratio": np.exp(np.nan_to_num(scores.rel[r, s])),
        "group_type": kinds[s], "group_id": gids[r, s].astype(np.int64),
    })
