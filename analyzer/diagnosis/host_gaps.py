"""Host-side stalls: a transient stall whose window of kernels shows the device idle, not slow.

The stage timer measures a stage on the host, so a stall of the host (a JIT compile for a new
shape, a garbage collection, a data loader) looks like a slow stage on those ranks, and a
transient stall blames their GPUs. The kernel channel sees what the GPU did meanwhile: when the
window holding the stall shows long launch gaps on most of the same ranks, each at least half
the stall's excess (the device ran nothing:
:func:`analyzer.score.kernel_scores.launch_gaps`), the stall was the host's. The incident keeps
its class (its id and its record stay), and says so: evidence ``host_gap_ms``, a sentence in its
summary, and a host-side title and action (:mod:`rankscope.incident`).

Example::

    >>> import pandas as pd
    >>> from rankscope.incident import Incident, IncidentClass
    >>> inc = Incident(id="ts-40-r3", job="j", cls=IncidentClass.TRANSIENT_STALL, ranks=[3], nodes=[0],
    ...                onset_iteration=40, onset_ms=0, stage="attention", ratio=40.0, group_type="dp",
    ...                group_ranks=[0, 1, 2, 3])
    >>> gaps = pd.DataFrame({"rank": [3], "step": [41], "steps": [2], "w1_us": [2.5e6]})
    >>> [i.id for i in explain_stalls([inc], gaps)], inc.evidence["host_gap_ms"], inc.host_side
    (['ts-40-r3'], 2500.0, True)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rankscope.incident import Incident, IncidentClass
from rankscope.topology import format_ranks

#: A launch gap explains a stall when it is at least this share of the stall's excess (the
#: culprits' time over their group's) on at least this share of its ranks.
GAP_SHARE = 0.5
RANK_SHARE = 0.5


def explain_stalls(incidents: list[Incident], gaps: pd.DataFrame) -> list[Incident]:
    """Mark the transient stalls that launch gaps on their ranks explain; the incidents changed.

    ``gaps``: the ``launch_gap`` findings, with ``rank``, the window's last ``step`` (the
    analyzer's numbering, as the incidents': after a restart not the framework's iteration) and
    its ``steps``, and the gap in ``w1_us``. A stall is explained by the gaps of a window that
    holds its onset (its first, its last or its current episode's) on at least half its ranks,
    each at least half the stall's excess."""
    if not len(gaps):
        return []
    last = gaps["step"].to_numpy(np.int64)
    steps = pd.to_numeric(gaps["steps"], errors="coerce").fillna(1).to_numpy() if "steps" in gaps else 1
    first = last - np.maximum(np.asarray(steps, dtype=np.int64), 1) + 1
    gap_ms = gaps["w1_us"].to_numpy(float) / 1000.0
    rank = gaps["rank"].to_numpy(np.int64)
    changed = []
    for inc in incidents:
        if inc.cls != IncidentClass.TRANSIENT_STALL or "host_gap_ms" in inc.evidence:
            continue
        excess = float(inc.evidence.get("culprit_ms", np.nan)) - float(inc.evidence.get("group_median_ms", 0.0))
        near = np.zeros(len(gaps), dtype=bool)
        for onset in {inc.onset_iteration, inc.first_onset, inc.last_onset} - {-1}:
            near |= (first <= onset) & (onset <= last)
        near &= np.isin(rank, inc.ranks) & (gap_ms >= GAP_SHARE * excess if excess == excess else True)
        ranks = sorted(set(rank[near].tolist()))
        if len(ranks) < max(1, RANK_SHARE * len(inc.ranks)):
            continue
        gap = round(float(gap_ms[near].max()), 1)
        inc.evidence["host_gap_ms"] = gap
        inc.evidence["summary"] = (inc.evidence.get("summary", inc.title) + f" Its GPUs ran no kernel for "
                                   f"{gap:g} ms then (rank(s) {format_ranks(ranks)}, the kernel window of "
                                   f"steps {int(first[near].min())}-{int(last[near].max())}): the host did "
                                   f"not launch (a JIT compile, GC, a data loader), the GPUs did not slow.")
        changed.append(inc)
    return changed
