"""What the rules see of one iteration: the window, the L2 scores, the floors, who reported.

Built once per iteration by :class:`~analyzer.job_analyzer.JobAnalyzer` from its
scorers and handed to every rule; rules read it and never change it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.detect.window import Window
from analyzer.score.rank_scores import RankScores
from analyzer.score.transfer_floors import FloorScores


@dataclass(frozen=True)
class Observation:
    """One iteration's evidence.

    ``present[r]``: rank r reported; ``balance_hot[g, s]``/``balance_ratio``: the
    pipeline-balance scorer's verdict per DP group and stage (``balance_static``: hot against
    the other stages only, long from the start rather than a change); ``l1_step``: the
    job's open L1 step (``iteration``, ``before_ms``, ``after_ms``) or None; ``job_ms``: the
    job's iteration time this iteration (what a stall costs shows there).
    """

    iteration: int
    time_ms: int
    window: Window
    scores: RankScores
    floors: FloorScores
    balance_hot: np.ndarray
    balance_ratio: np.ndarray
    present: np.ndarray
    l1_step: dict | None = None
    job_ms: float = float("nan")   # the job's iteration time (median over the ranks reporting)
    balance_static: np.ndarray | None = None

    @property
    def hot(self) -> np.ndarray:
        """``[rank, stage]`` cells slow beyond the L2 thresholds this iteration."""
        return self.scores.hot
