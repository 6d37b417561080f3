"""Conversions between long ``stage_latency`` frames and dense numpy cubes.

The analysis works on a cube ``values[iteration, rank, stage]`` (NaN where a rank
did not report); the store speaks frames with one row per (iteration, rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.stage_rows import LOCAL_GPU, stage_rows
from rankscope.topology import Topology


@dataclass
class LatencyCube:
    """Dense view of a ``stage_latency`` window.

    ``values[i, r, s]`` is stage ``stages[s]`` of rank ``r`` at iteration
    ``iterations[i]`` (ms, NaN when missing); ``iteration_ms[i, r]`` the rank's
    iteration time; ``times[i]`` the iteration's timestamp (epoch ms).
    """

    iterations: np.ndarray
    times: np.ndarray
    stages: list[str]
    values: np.ndarray
    iteration_ms: np.ndarray

    @property
    def world(self) -> int:
        return self.values.shape[1]

    def stage(self, name: str) -> np.ndarray:
        return self.values[:, :, self.stages.index(name)]


def frame_to_cube(df: pd.DataFrame, world: int, stages: list[str] | None = None) -> LatencyCube:
    """Pivot a ``stage_latency`` frame to a cube over all ``world`` ranks (vectorised)."""
    stages = stages or schema.stage_fields(df.columns)
    if not len(df):
        empty = np.empty((0, world, len(stages)))
        return LatencyCube(np.empty(0, np.int64), np.empty(0, np.int64), stages, empty, np.empty((0, world)))
    ranks = df["rank"].to_numpy(dtype=np.int64)
    if ranks.min() < 0 or ranks.max() >= world:
        bad = ranks[(ranks < 0) | (ranks >= world)][0]
        raise ValueError(f"rank {bad} in the data is outside the topology's world of {world} ranks")
    iters = df[schema.ITERATION_FIELD].to_numpy(dtype=np.int64)
    uniq, idx = np.unique(iters, return_inverse=True)
    times = np.zeros(len(uniq), dtype=np.int64)
    np.maximum.at(times, idx, df["time"].to_numpy(dtype=np.int64))
    values = np.full((len(uniq), world, len(stages)), np.nan)
    for s, name in enumerate(stages):
        if name in df.columns:
            values[idx, ranks, s] = df[name].to_numpy(dtype=float)
    it_ms = np.full((len(uniq), world), np.nan)
    if schema.ITERATION_MS_FIELD in df.columns:
        it_ms[idx, ranks] = df[schema.ITERATION_MS_FIELD].to_numpy(dtype=float)
    return LatencyCube(uniq, times, stages, values, it_ms)


def cube_to_frame(job: str, topo: Topology, iteration: int, time_ms: int,
                  values: np.ndarray, stages: list[str], iteration_ms: np.ndarray,
                  ranks: np.ndarray | None = None) -> pd.DataFrame:
    """One iteration's ``stage_latency`` frame: a row per rank with all tags (vectorised).

    ``values[k, s]`` is stage ``stages[s]`` of rank ``ranks[k]`` (default every rank). The
    topology is the ranks' placement, one GPU each: ``gpu`` is their local index
    (:data:`~rankscope.stage_rows.LOCAL_GPU`).
    """
    r = topo.ranks if ranks is None else np.asarray(ranks, dtype=np.int64)
    return stage_rows(job, r, iteration, time_ms, {name: values[:, s] for s, name in enumerate(stages)},
                      topo=topo, iteration_ms=iteration_ms, gpu=LOCAL_GPU)
