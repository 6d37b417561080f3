"""The what-if: the job's iteration time with an incident's culprits restored.

In a synchronous job every collective ends when its last member arrives, so a culprit's
excess reaches everyone: its own slow work, and the waits it causes the others in every
collective it shares with them (and, through those, in the collectives they share with the
rest). Restoring the culprits removes all of it; what stays is the rest of the job's own work,
at whatever level that has drifted to since the onset. So the what-if is the job's level
before the onset, moved by what the **non-culprits' own work** did since:

- where compute or host stages are recorded, their own work is the sum of those stages
  (median over the non-culprit ranks and the iterations): the level before is scaled by its
  ratio now / before. A ratio, because collectors write a stage either as its total in the
  iteration or as the mean of its occurrences (the simulator), and a ratio reads both alike;
- where only collectives are recorded (``import-nccl``: every stage a comm stage, written as
  its total in the iteration), the non-culprits' own work is the time outside their
  collectives, so the what-if is the job's time now less the rise of the non-culprits'
  collectives (their waits for the culprits): ``now - (comm_now - comm_before)``.

The figure is never above the job's time now (restoring the culprits cannot slow the job).
What it cannot see: a job-wide drift in a stage that is not recorded (the first way), a
job-wide change of the network's speed (the second way counts it as the culprits' excess),
and a later incident open at the same time (its excess is taken away too: no timing says what
it alone would cost; the later incident's own level before holds the earlier one's excess).

Example (16 ranks; rank 11 arrives 0.5 s late at every collective, its peers wait for it)::

    >>> import numpy as np
    >>> from rankscope.schema import Stage, StageSet
    >>> stages = StageSet((Stage("reduce_scatter", "comm", "dp"),))
    >>> before = np.full((5, 16, 1), 20.0)                   # ms in collectives, per rank
    >>> now = before + 500.0
    >>> now[:, 11] = 20.0                                    # the late rank waits for nobody
    >>> then, later = footing(before, [11], stages), footing(now, [11], stages)
    >>> round(restored_s(0.25, 0.75, then, later), 3)
    0.25
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from rankscope.schema import StageSet


@dataclass(frozen=True)
class Footing:
    """The non-culprits' time over some iterations (ms, medians over their ranks and those
    iterations): ``own_ms`` their compute and host stages summed (NaN where none is recorded),
    ``comm_ms`` their collectives summed (NaN where none is recorded)."""

    own_ms: float = float("nan")
    comm_ms: float = float("nan")

    @property
    def known(self) -> bool:
        return bool(np.isfinite(self.own_ms) or np.isfinite(self.comm_ms))


def _summed_median(values: np.ndarray, columns: np.ndarray) -> float:
    """Median over rank-iterations of ``values[..., columns]`` summed (those with any recorded)."""
    if not columns.any() or not values.size:
        return float("nan")
    part = values[..., columns]
    recorded = np.isfinite(part).any(axis=-1)
    if not recorded.any():
        return float("nan")
    return float(np.median(np.nansum(part, axis=-1)[recorded]))


def footing(values: np.ndarray, culprits, stages: StageSet) -> Footing:
    """The :class:`Footing` of the ranks not in ``culprits`` over ``values`` (``[T, R, S]``)."""
    if values.ndim != 3 or not values.shape[0]:
        return Footing()
    keep = np.ones(values.shape[1], dtype=bool)
    keep[np.asarray(culprits, dtype=np.int64)] = False
    rest = values[:, keep]
    kinds = np.array([st.kind for st in stages])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Footing(_summed_median(rest, kinds != "comm"), _summed_median(rest, kinds == "comm"))


def restored_s(before_s: float, now_s: float, then: Footing, now: Footing) -> float:
    """The job's iteration time (s) with the culprits restored, from its level ``before_s``
    and ``now_s`` and the non-culprits' footing before the onset (``then``) and now."""
    if not (np.isfinite(before_s) and np.isfinite(now_s)):
        return float("nan")
    if np.isfinite(then.own_ms) and np.isfinite(now.own_ms) and then.own_ms > 0:
        estimate = before_s * now.own_ms / then.own_ms
    elif np.isfinite(then.comm_ms) and np.isfinite(now.comm_ms):
        estimate = now_s - (now.comm_ms - then.comm_ms) / 1000.0
    else:
        estimate = before_s
    return float(np.clip(estimate, 0.0, now_s))
