"""Host-side stalls: a transient stall whose window of kernels shows the device idle, not slow.

The stage timer measures a stage on the host, so a stall of the host (a JIT compile for a new
shape, a garbage collection, a data loader) looks like a slow stage on those ranks, and a
transient stall blames their GPUs. The kernel channel sees what the GPU did meanwhile: when the
window around the stall holds a long launch gap on the same ranks (the device ran nothing:
:func:`analyzer.score.kernel_scores.launch_gaps`), the stall was the host's. The incident keeps
its class (its id and its record stay), and says so: evidence ``host_gap_ms``, a sentence in its
summary, and a host-side title and action (:mod:`rankscope.incident`).

Example::

    >>> import pandas as pd
    >>> from rankscope.incident import Incident, IncidentClass
    >>> inc = Incident(id="ts-40-r3", job="j", cls=IncidentClass.TRANSIENT_STALL, ranks=[3], nodes=[0],
    ...                onset_iteration=40, onset_ms=0, stage="attention", ratio=40.0, group_type="dp",
    ...                group_ranks=[0, 1, 2, 3])
    >>> gaps = pd.DataFrame({"rank": [3], "iteration": [41], "steps": [2], "w1_us": [2.5e6]})
    >>> [i.id for i in explain_stalls([inc], gaps)], inc.evidence["host_gap_ms"], inc.host_side
    (['ts-40-r3'], 2500.0, True)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rankscope.incident import Incident, IncidentClass
from rankscope.topology import format_ranks


def explain_stalls(incidents: list[Incident], gaps: pd.DataFrame) -> list[Incident]:
    """Mark the transient stalls that a launch gap on their ranks explains (``gaps``: the
    ``launch_gap`` findings with ``rank``, ``iteration`` and ``steps`` of their window and the
    gap in ``w1_us``); the incidents changed."""
    if not len(gaps):
        return []
    last = gaps["iteration"].to_numpy(np.int64)
    first = last - np.maximum(pd.to_numeric(gaps.get("steps", 1), errors="coerce").fillna(1).to_numpy(np.int64), 1) + 1
    changed = []
    for inc in incidents:
        if inc.cls != IncidentClass.TRANSIENT_STALL or "host_gap_ms" in inc.evidence:
            continue
        onsets = {inc.onset_iteration, inc.first_onset, inc.last_onset} - {-1}   # any of its episodes
        near = np.zeros(len(gaps), dtype=bool)
        for onset in onsets:
            near |= (first <= onset + 1) & (onset <= last + 1)
        near &= np.isin(gaps["rank"].to_numpy(np.int64), inc.ranks)
        if not near.any():
            continue
        gap_ms = round(float(gaps["w1_us"].to_numpy(float)[near].max()) / 1000.0, 1)
        ranks = sorted(set(gaps["rank"].to_numpy(np.int64)[near].tolist()))
        inc.evidence["host_gap_ms"] = gap_ms
        inc.evidence["summary"] = (inc.evidence.get("summary", inc.title) + f" Its GPUs ran no kernel for "
                                   f"{gap_ms:g} ms then (rank(s) {format_ranks(ranks)}, the kernel window of "
                                   f"iterations {int(first[near].min())}-{int(last[near].max())}): the host "
                                   f"did not launch (a JIT compile, GC, a data loader), the GPUs did not slow.")
        changed.append(inc)
    return changed
