"""Hot (rank, stage) cells over time: how long each has been hot, since when, how far out.

Shared by the rank-level rules (stragglers and host stalls, transient stalls):
both read the same streaks, and a cell that a straggler incident holds
(``assigned``) is neither confirmed again nor taken for a transient stall.
All state is ``[rank, stage]`` arrays, updated once per iteration.
"""

from __future__ import annotations

import numpy as np

from analyzer.diagnosis.observation import Observation


class RankCells:
    """Streaks of hot cells and the incidents' claims on them."""

    def __init__(self, world: int, n_stages: int):
        shape = (world, n_stages)
        self.streak = np.zeros(shape, dtype=np.int64)
        self.prev_streak = np.zeros(shape, dtype=np.int64)
        self.onset = np.zeros(shape, dtype=np.int64)
        self.peak = np.ones(shape)
        self.peak_z = np.zeros(shape)
        self.assigned = np.zeros(shape, dtype=bool)
        self.prev_out = np.zeros(shape, dtype=bool)

    def update(self, obs: Observation) -> None:
        """Lengthen the streaks of hot cells; a reporting rank's cold cells start again."""
        hot = obs.scores.hot
        prev = self.prev_streak = self.streak
        started = hot & (prev == 0)
        # a cell the smoothing made hot an iteration late began where that iteration alone was out
        late = started & self.prev_out
        self.onset = np.where(started, obs.iteration - late, self.onset)
        self.streak = np.where(hot, prev + 1 + late, np.where(obs.present[:, None], 0, prev))
        out = obs.scores.out_now
        self.prev_out = out if out is not None else np.zeros_like(hot)
        with np.errstate(invalid="ignore"):
            cur = np.fmax(obs.scores.smooth_ratio, obs.scores.ratio)
        self.peak = np.where(started, cur, np.where(hot, np.fmax(self.peak, cur), self.peak))
        zn = np.nan_to_num(obs.scores.z_now)
        self.peak_z = np.where(started, zn, np.where(hot, np.maximum(self.peak_z, zn), self.peak_z))

    def claim(self, ranks, stage: int, held: bool = True) -> None:
        """Mark (or release) cells an incident holds."""
        self.assigned[np.asarray(ranks, dtype=np.int64), stage] = held
