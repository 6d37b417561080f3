"""Conversions between long ``stage_latency`` frames and dense numpy cubes.

The analysis works on a cube ``values[iteration, rank, stage]`` (NaN where a rank
did not report); the store speaks frames with one row per (iteration, rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope import schema
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
    """One iteration's ``stage_latency`` frame: a row per rank with all tags (vectorised)."""
    r = topo.ranks if ranks is None else np.asarray(ranks, dtype=np.int64)
    data = {
        "time": np.full(len(r), time_ms, dtype=np.int64),
        "job": job,
        "rank": r,
        "pp": topo.pp_index[r],
        "dp": topo.dp_index[r],
        "tp": topo.tp_index[r],
        "ep_group": topo.group_ids("ep")[r],
        "node": topo.node_index[r],
        **({"host": np.asarray(topo.hosts, dtype=object)[topo.node_index[r]]} if topo.hosts else {}),
        "gpu": topo.local_index[r],
        schema.ITERATION_FIELD: np.full(len(r), iteration, dtype=np.int64),
        schema.ITERATION_MS_FIELD: np.asarray(iteration_ms, dtype=float),
    }
    for s, name in enumerate(stages):
        data[name] = np.asarray(values[:, s], dtype=float)
    return pd.DataFrame(data)
