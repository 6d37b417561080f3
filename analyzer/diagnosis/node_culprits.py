"""A slow node is one fault: the ranks of a node several of which a rule found slow, that rose with
them but stayed under the bar (noise kept them there this time), are its culprits too.

A node throttling (power, thermal, a host-wide fault) slows all its GPUs; at a small factor and
with noise, some of them cross the thresholds a few iterations after the others, or not at all,
and an incident naming five of a node's eight GPUs (or three incidents on parts of it) makes an
operator guess. :func:`complete_nodes` adds, on every node where a quarter of the ranks at
least (two at least) are culprits, the node's other ranks whose own time in the stage rose since the
onset by at least :data:`SHARE` of the culprits' median rise (their time since the onset over
their time before it). Members that only waited for a culprit of their inner group look slow too;
the descent into inner groups (:mod:`analyzer.diagnosis.inner_groups`) that follows takes them
out again.

Example (node 1 of an 8-GPU job: ranks 4-7 rose 1.3x, rank 6 crossed no bar)::

    >>> import numpy as np
    >>> from rankscope.topology import Topology
    >>> before, now = np.full((3, 8, 1), 10.0), np.full((3, 8, 1), 10.0)
    >>> now[:, 4:] = 13.0
    >>> complete_nodes(np.array([4, 5, 7]), now, before, 0, Topology(dp=8, gpus_per_node=4)).tolist()
    [4, 5, 6, 7]
"""

from __future__ import annotations

import warnings

import numpy as np

from rankscope.topology import Topology

#: Share of the culprits' median rise a rank of their node must show to join them.
SHARE = 0.5


def complete_nodes(ranks: np.ndarray, now: np.ndarray, before: np.ndarray, s: int, topo: Topology) -> np.ndarray:
    """``ranks`` with the risen ranks of their nodes (module doc); ``now`` and
    ``before``: values ``[T, R, S]`` since the onset and before it."""
    ranks = np.unique(np.asarray(ranks, dtype=np.int64))
    if len(ranks) < 2 or not len(now) or not len(before):
        return ranks
    node = topo.node_index
    nodes, counts = np.unique(node[ranks], return_counts=True)
    sizes = np.bincount(node, minlength=int(node.max()) + 1)
    mostly = nodes[(counts >= 2) & (4 * counts >= sizes[nodes])]
    if not len(mostly):
        return ranks
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        rise = np.nanmedian(now[:, :, s], axis=0) / np.nanmedian(before[:, :, s], axis=0)
        bar = 1.0 + SHARE * (np.nanmedian(rise[ranks]) - 1.0)
    if not bar > 1.0:
        return ranks
    join = np.isin(node, mostly) & (rise >= bar)
    return np.union1d(ranks, np.flatnonzero(join))


def rises(ranks: np.ndarray, onsets: np.ndarray, s: int, culprits: np.ndarray, s_culprits: int, onset: int,
          values: np.ndarray, iterations: np.ndarray) -> tuple[np.ndarray, float]:
    """How far each of ``ranks`` rose in stage ``s`` since its own onset (``onsets``), and how far
    ``culprits`` rose in their stage since their ``onset`` (medians). Each rise is measured from its
    own onset: a rank that turned slow long after the incident began, measured from the incident's
    onset, would average its slow stretch with the healthy one before it. Where the window keeps no
    iteration before an onset (an incident older than the window), that rise is the time since the
    onset against the job's median in the stage, iteration by iteration. ``values``: the window
    ``[T, R, S]`` of the kept ``iterations``."""
    ranks, culprits = np.asarray(ranks, dtype=np.int64), np.asarray(culprits, dtype=np.int64)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        late = iterations[:, None] >= np.asarray(onsets)[None, :]                   # [T, ranks]
        own = values[:, ranks, s]
        rise = np.nanmedian(np.where(late, own, np.nan), axis=0) / np.nanmedian(np.where(late, np.nan, own), axis=0)
        rise = np.where(np.isfinite(rise), rise, np.nanmedian(np.where(late, _against_job(values, s, ranks), np.nan), axis=0))
        then = iterations < onset
        if then.any() and (~then).any():
            theirs = np.nanmedian(np.nanmedian(values[~then][:, culprits, s_culprits], axis=0)
                                  / np.nanmedian(values[then][:, culprits, s_culprits], axis=0))
        else:
            theirs = np.nanmedian(np.nanmedian(_against_job(values[~then], s_culprits, culprits), axis=0))
    return rise, float(theirs)


def _against_job(values: np.ndarray, s: int, ranks: np.ndarray) -> np.ndarray:
    """``[T, ranks]``: each rank's time in stage ``s`` over the job's median of that iteration."""
    return values[:, ranks, s] / np.nanmedian(values[:, :, s], axis=1)[:, None]


def far_slower(rise: np.ndarray | float, theirs: np.ndarray | float) -> np.ndarray:
    """Rises far above the culprits' (theirs under :data:`SHARE` of them): a fault of its own.
    Where the culprits did not rise, any rise is; where nothing could be measured (NaN), none.
    Either side may be one number or an array (``far_slower(theirs, rise)``: the ranks far less
    risen than the culprits)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(theirs, dtype=float) < 1.0 + SHARE * (np.asarray(rise, dtype=float) - 1.0)


def rose_with(ranks: np.ndarray, onsets: np.ndarray, s: int, culprits: np.ndarray, s_culprits: int, onset: int,
              values: np.ndarray, iterations: np.ndarray) -> np.ndarray:
    """Which of ``ranks`` (slow in stage ``s`` from ``onsets``) rose about as much as ``culprits`` in
    their stage (:func:`rises`; each rise at least :data:`SHARE` of the other): a rank of a slow
    node that is slow by the node's fault, not a GPU the OS preempted for a while beside a far
    slower one, nor a far slower GPU beside a few preempted ones (culprits that did not rise at all
    are like no risen rank). Where nothing could be measured, every rank counts."""
    rise, theirs = rises(ranks, onsets, s, culprits, s_culprits, onset, values, iterations)
    if not np.isfinite(theirs):
        return np.ones(len(rise), dtype=bool)
    return ~far_slower(theirs, rise) & ~far_slower(rise, theirs)
