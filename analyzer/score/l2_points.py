"""The L2 points a cycle writes back: ``l2_kind`` for every group kind and stage, ``l2_group``
for the notable groups, ``l2_rank`` above a floor.

All are computed from the per-rank medians over the last ``l2_window`` iterations (robust to
a single noisy iteration), vectorised over all groups of every kind. ``l2_rank`` carries only
ranks whose ratio to their reference group is at least ``report_ratio`` (or at most its
inverse: the short collectives of ranks that arrive last), at most ``report_max_ranks`` of
them, so the database is not flooded with 12,960 x 10 scores every cycle.

``l2_group`` is bounded the same way: per kind and stage, the ``l2_groups`` groups of highest
CV (every group of a kind that has no more), and the group and stage of each ``l2_rank`` point
(so a culprit's group is drawn beside it). Every
group x stage of a 100,000-rank job was 319,000 series and points a cycle (nine tenths of the
long policy's series and of the analyzer's writes, docs/scaling.md); the summary over all of
a kind's groups (worst CV, flagged count, transfer floor, median) is ``l2_kind``, a few dozen.
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


def notable_groups(cv: np.ndarray, keep: int) -> np.ndarray:
    """``[G, S]`` mask of the ``keep`` groups of highest CV in each stage (NaN last)."""
    mask = np.zeros(cv.shape, dtype=bool)
    if keep >= cv.shape[0]:
        mask[:] = True
    else:
        top = np.argpartition(np.where(np.isnan(cv), np.inf, -cv), keep - 1, axis=0)[:keep]
        np.put_along_axis(mask, top, True, axis=0)
    return mask


def l2_frames(job: str, topo: Topology, stages: StageSet, med: np.ndarray, time_ms: int,
              cfg: AnalyzerConfig, reported: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``l2_kind`` (one row per group kind and stage) and ``l2_group`` (the notable groups of
    each, see the module's docstring; ``reported``: the ``l2_rank`` frame, whose groups are
    written in their stage whatever their CV) for kinds with more than one member."""
    kinds, groups = [], []
    names = np.array(stages.names, dtype=object)
    for kind in GROUP_KINDS:
        if topo.group_size(kind) < 2:
            continue
        st = group_stats(med, topo.members(kind))
        flagged = np.nan_to_num(st.cv) > cfg.cv_threshold
        kinds.append(_kind_rows(kind, names, st, flagged))
        keep = notable_groups(st.cv, cfg.l2_groups)
        if len(reported):
            mine = reported[reported["group_type"] == kind]
            keep[mine["group_id"].to_numpy(np.int64), pd.Index(stages.names).get_indexer(mine["stage"])] = True
        gi, si = np.nonzero(keep & np.isfinite(st.mean))
        groups.append(pd.DataFrame({
            "group_type": kind, "group_id": gi.astype(np.int64), "stage": names[si],
            "cv": st.cv[gi, si], "mean": st.mean[gi, si], "median": st.median[gi, si],
            "min": st.min[gi, si], "max": st.max[gi, si], "std": st.std[gi, si],
            "size": st.count[gi, si].astype(np.int64), "anomalous": flagged[gi, si].astype(np.int64)}))
    return _stamped(kinds, job, time_ms), _stamped(groups, job, time_ms)


def _kind_rows(kind: str, names: np.ndarray, st, flagged: np.ndarray) -> pd.DataFrame:
    """A kind's summary over all its groups, one row per stage that any group has data of."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        df = pd.DataFrame({
            "group_type": kind, "stage": names, "groups": np.isfinite(st.mean).sum(axis=0).astype(np.int64),
            "anomalous": flagged.sum(axis=0).astype(np.int64), "cv_max": np.nanmax(st.cv, axis=0),
            "cv_median": nanmedian(st.cv, axis=0), "floor": np.nanmin(st.min, axis=0),
            "median": nanmedian(st.median, axis=0), "max": np.nanmax(st.max, axis=0)})
    return df[df["groups"].to_numpy() > 0]


def _stamped(frames: list[pd.DataFrame], job: str, time_ms: int) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    df.insert(0, "job", job)
    df.insert(0, "time", np.int64(time_ms))
    return df


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
