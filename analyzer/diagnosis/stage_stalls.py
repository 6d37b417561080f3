"""Short stalls of a whole pipeline stage: a DP group out all at once, with no healthy peer.

A rank's stall is seen against its DP group (the ranks doing the same work). When the whole
group stalls together (in a small job one node can hold a whole PP stage: 16 GPUs as pp=2 x
dp=8 on two nodes), no rank stands out in it; what stands out is the group against the other
stages (:class:`~analyzer.score.stage_balance.PipelineBalanceScorer`). A streak of at most
``transient_max`` iterations of such a group, ``abs_ratio`` above the others at its peak, that
ends is a transient stall of the stage's ranks; the transient-stall rule judges its cost as
any other's (a longer streak is the pipeline rule's imbalance).

Example::

    >>> import numpy as np
    >>> from analyzer.config import AnalyzerConfig
    >>> st = StageStreaks((2, 1))
    >>> for it, hot in enumerate([False, True, True, False]):
    ...     got = st.update(it, np.array([[False], [hot]]), np.array([[1.0], [9.0 if hot else 1.0]]),
    ...                     AnalyzerConfig())
    >>> [(int(g), int(s), int(onset), int(last), float(peak)) for g, s, onset, last, peak in got]
    [(1, 0, 1, 2, 9.0)]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from analyzer.config import AnalyzerConfig


class StageStall(NamedTuple):
    """A DP group's stall in stage ``s`` that ended: first and last hot iteration, peak ratio."""

    group: int
    s: int
    onset: int
    last: int
    peak: float


class StageStreaks:
    """Each (DP group, stage) cell's hot streak, its onset and peak; ``update`` per iteration."""

    def __init__(self, shape: tuple[int, int]):
        self.streak = np.zeros(shape, dtype=np.int64)
        self.onset = np.zeros(shape, dtype=np.int64)
        self.peak = np.zeros(shape)

    def update(self, iteration: int, hot: np.ndarray, ratio: np.ndarray, cfg: AnalyzerConfig) -> list[StageStall]:
        """Feed one iteration's ``hot``/``ratio`` ``[group, stage]``; the short, large streaks
        that ended with it."""
        ended = (~hot) & (self.streak > 0) & (self.streak <= cfg.transient_max) & (self.peak >= cfg.abs_ratio)
        out = [StageStall(int(g), int(s), int(self.onset[g, s]), iteration - 1, float(self.peak[g, s]))
               for g, s in np.argwhere(ended)]
        start = hot & (self.streak == 0)
        self.onset = np.where(start, iteration, self.onset)
        with np.errstate(invalid="ignore"):
            self.peak = np.where(hot, np.fmax(np.where(start, 0.0, self.peak), ratio), 0.0)
        self.streak = np.where(hot, self.streak + 1, 0)
        return out
