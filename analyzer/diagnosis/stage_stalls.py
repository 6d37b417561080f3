"""Short stalls of a whole pipeline stage: a DP group out all at once, with no healthy peer.

A rank's stall is seen against its DP group (the ranks doing the same work). When the whole
group stalls together (in a small job one node can hold a whole PP stage: 16 GPUs as pp=2 x
dp=8 on two nodes), no rank stands out in it; what stands out is the group against the other
stages (:class:`~analyzer.score.stage_balance.PipelineBalanceScorer`). A streak of such a group
of at most ``transient_max`` iterations (onset to end, gaps counted) that ends is a transient
stall of the stage's ranks when, at its peak, they took ``abs_ratio`` times their own time
before; the transient-stall rule judges its cost as any other's (the groups of one PP stage,
one per TP index, ending together are one stall; a longer streak is the pipeline rule's
imbalance).

Example::

    >>> import numpy as np
    >>> from analyzer.config import AnalyzerConfig
    >>> st = StageStreaks((2, 1))
    >>> for it, hot in enumerate([False, True, True, False]):
    ...     got = st.update(it, np.array([[False], [hot]]), np.array([True, True]), AnalyzerConfig())
    >>> [(int(g), int(s), int(onset), int(last)) for g, s, onset, last in got]
    [(1, 0, 1, 2)]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from analyzer.config import AnalyzerConfig


class StageStall(NamedTuple):
    """A DP group's stall in stage ``s`` that ended: its first and last hot iteration."""

    group: int
    s: int
    onset: int
    last: int


class StageStreaks:
    """Each (DP group, stage) cell's hot streak and its onset; ``update`` per iteration."""

    def __init__(self, shape: tuple[int, int]):
        self.streak = np.zeros(shape, dtype=np.int64)
        self.onset = np.zeros(shape, dtype=np.int64)
        self.last = np.zeros(shape, dtype=np.int64)

    def update(self, iteration: int, hot: np.ndarray, present: np.ndarray, cfg: AnalyzerConfig) -> list[StageStall]:
        """Feed one iteration's ``hot`` ``[group, stage]`` (``present[group]``: some rank
        of the group reported; an absent group's streak is held, neither going on nor ended: a
        stage that went silent did not recover); the streaks of at most ``transient_max``
        iterations that ended with it."""
        seen = present[:, None]
        ended = seen & (~hot) & (self.streak > 0) & (iteration - self.onset <= cfg.transient_max + 1)
        out = [StageStall(int(g), int(s), int(self.onset[g, s]), int(self.last[g, s])) for g, s in np.argwhere(ended)]
        on = seen & hot
        start = on & (self.streak == 0)
        self.onset = np.where(start, iteration, self.onset)
        self.last = np.where(on, iteration, self.last)
        self.streak = np.where(on, self.streak + 1, np.where(seen, 0, self.streak))
        return out
