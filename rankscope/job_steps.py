"""A job's steps: one order over every iteration it executed, across its restarts.

After a restart from a checkpoint a job's iteration numbers go back and the same numbers run
again, later. The analyzer numbers every iteration by **step** (its iteration plus its
segment's offset) and stores each segment's start as a ``job_lifecycle`` point (``event``
restart, jump or start; ``iteration``: the framework's first number; ``step``: its step).
This maps stored rows to those steps, as the analyzer numbered them, for whatever reads
stage latencies beside the analyzer's outputs (the incident report).

    >>> import pandas as pd
    >>> life = pd.DataFrame({"time": [200_000], "event": ["restart"], "iteration": [10], "step": [30]})
    >>> step_numbers([1_000, 2_000, 201_000], [28, 29, 10], life).tolist()
    [28, 29, 30]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rankscope import schema

#: The ``job_lifecycle`` events that begin a segment (``ended`` does not).
SEGMENT_EVENTS = ("restart", "jump", "start")


def segments(lifecycle: pd.DataFrame | None) -> pd.DataFrame:
    """The segment starts among ``job_lifecycle`` rows, by time (columns time, iteration, step)."""
    cols = ["time", schema.ITERATION_FIELD, "step"]
    if lifecycle is None or not len(lifecycle) or not {"event", *cols} <= set(lifecycle.columns):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
    seg = lifecycle[lifecycle["event"].isin(SEGMENT_EVENTS)][cols].dropna()
    return seg.astype("int64").sort_values("time").reset_index(drop=True)


def step_numbers(times, iterations, lifecycle: pd.DataFrame | None) -> np.ndarray:
    """Each row's step: its iteration moved by the offset of the newest segment begun at or
    before its time (before any: the iteration itself)."""
    t = np.asarray(times, dtype=np.int64)
    it = np.asarray(iterations, dtype=np.int64)
    seg = segments(lifecycle)
    if not len(seg):
        return it.copy()
    k = np.searchsorted(seg["time"].to_numpy(), t, side="right") - 1
    offset = np.r_[0, (seg["step"] - seg[schema.ITERATION_FIELD]).to_numpy()]
    return it + offset[k + 1]
