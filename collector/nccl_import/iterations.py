"""Step 3, summarise: iterations delimited by the anchor communicator, each stage's total per
rank per iteration, the iterations' ends and lengths (see the package's doc)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Assignment:
    """Every record's iteration, and the anchor records that close an iteration."""

    #: The record belongs to an iteration that a closing anchor record of its rank ended.
    ok: np.ndarray
    #: Its iteration (-1 when not ``ok``).
    iteration: np.ndarray
    #: Rank, iteration and end (epoch us) of each closing anchor record.
    anchor_rank: np.ndarray
    anchor_iteration: np.ndarray
    anchor_end_us: np.ndarray


@dataclass(frozen=True)
class Summary:
    """One entry per rank per closed iteration, ordered by rank then iteration."""

    rank: np.ndarray
    iteration: np.ndarray
    #: The rank's own end of the iteration (ms) and the time since its previous end.
    end_ms: np.ndarray
    iteration_ms: np.ndarray
    #: The entry's rank is the previous entry's.
    same_rank: np.ndarray
    #: Each stage's total (ms), one row per entry, one column per stage seen.
    per_stage: pd.DataFrame


def choose_anchor(records: pd.DataFrame) -> str:
    """The communicator with the most members (ties: the lowest id)."""
    size = records.groupby("comm")["members"].first().map(len)
    best = size[size == size.max()].index
    return str(sorted(best)[0])


def assign_iterations(df: pd.DataFrame, anchor: str, per_iteration: int, first_sn: int | None) -> Assignment:
    """The iteration of every record of ``df`` (sorted by rank, then the rank's own order)."""
    pos = np.arange(len(df))
    rank = df["rank"].to_numpy(np.int64)
    is_anchor = (df["comm"] == anchor).to_numpy()
    sn = df["sn"].to_numpy(np.int64)
    first = int(sn[is_anchor].min()) if first_sn is None else int(first_sn)
    block = (sn - first) // per_iteration
    closes = is_anchor & ((sn - first) % per_iteration == per_iteration - 1) & (sn >= first)
    a_pos, a_rank, a_iter = pos[closes], rank[closes], block[closes]
    a_end = df["end_us"].to_numpy(np.float64)[closes]
    idx = np.searchsorted(a_pos, pos, side="left")
    ok = idx < len(a_pos)
    idx_c = np.minimum(idx, max(len(a_pos) - 1, 0))
    ok &= (a_rank[idx_c] == rank) if len(a_pos) else False
    # anchor records of a later block of the same rank belong to their own block's closing record
    it = np.where(ok, a_iter[idx_c] if len(a_pos) else 0, -1)
    ok &= ~is_anchor | (block == it)
    return Assignment(ok, it, a_rank, a_iter, a_end)


def summarise(df: pd.DataFrame, assign: Assignment, stage: np.ndarray) -> Summary:
    """Each stage's total per rank per closed iteration (``stage``: of the assigned records)."""
    ok = assign.ok
    rank = df["rank"].to_numpy(np.int64)
    work = pd.DataFrame({"rank": rank[ok], "iteration": assign.iteration[ok], "stage": stage,
                         "ms": df["ms"].to_numpy()[ok]})
    per_stage = work.groupby(["rank", "iteration", "stage"])["ms"].sum().unstack("stage")
    keys = pd.MultiIndex.from_arrays([assign.anchor_rank, assign.anchor_iteration], names=["rank", "iteration"])
    ends = pd.Series(assign.anchor_end_us, index=keys)
    ends = ends[~ends.index.duplicated(keep="last")].sort_index()
    per_stage = per_stage.reindex(ends.index)
    r = ends.index.get_level_values("rank").to_numpy(np.int64)
    k = ends.index.get_level_values("iteration").to_numpy(np.int64)
    end_ms = ends.to_numpy() / 1000.0
    prev = np.r_[np.nan, end_ms[:-1]]
    same = np.r_[False, r[1:] == r[:-1]]
    start_ms = work.assign(s=df["end_us"].to_numpy()[ok] / 1000.0 - df["ms"].to_numpy()[ok]) \
        .groupby("rank")["s"].min()
    iter_ms = np.where(same, end_ms - prev, end_ms - start_ms.reindex(r).to_numpy())
    return Summary(r, k, end_ms, iter_ms, same, per_stage)


def missing_records(df: pd.DataFrame) -> dict[str, int]:
    """Records lost to sampling per communicator: gaps in each rank's sequence numbers."""
    span = df.groupby(["comm", "rank"])["sn"].agg(["min", "max", "nunique"])
    gaps = (span["max"] - span["min"] + 1 - span["nunique"]).groupby(level="comm").sum()
    return {str(c): int(n) for c, n in gaps[gaps > 0].items()}


def closed_iterations(assign: Assignment) -> dict[int, int]:
    """The last iteration each rank closed."""
    closed = pd.Series(assign.anchor_iteration, index=assign.anchor_rank).groupby(level=0).max()
    return {int(a): int(b) for a, b in closed.items()}
