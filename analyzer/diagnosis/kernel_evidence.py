"""The kernels behind an incident: L3's confirmed findings on its culprit ranks, in its evidence.

L2 names the stage (``mlp``: the culprits' time against their group); the kernel windows name
the kernels in it that are slow (``sm90_xmma_gemm_...`` 5.7x its group's, cause ``own``). An open
incident whose culprit ranks have confirmed kernel findings (own or link) carries them as
evidence ``kernels``: at most ``TOP`` kernels, the worst first, with their kind, cause, ratio and
ranks; its text and the incident report show them.

Example::

    >>> import pandas as pd
    >>> from rankscope.incident import Incident, IncidentClass
    >>> inc = Incident(id="cs-30-r5", job="j", cls=IncidentClass.COMPUTE_STRAGGLER, ranks=[5], nodes=[0],
    ...                onset_iteration=30, onset_ms=0, stage="mlp", ratio=3.0, group_type="dp",
    ...                group_ranks=list(range(8)))
    >>> found = pd.DataFrame({"rank": [5, 5], "name": ["gemm", "gelu"], "kind": ["compute"] * 2,
    ...                       "cause": ["own"] * 2, "ratio": [3.1, 2.0], "confirmed": [1, 1]})
    >>> [k["kernel"] for k in attach_kernels([inc], found)[0].evidence["kernels"]]
    ['gemm', 'gelu']
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rankscope.incident import Incident
from rankscope.topology import format_ranks

#: Kernels an incident's evidence names at most.
TOP = 5


def attach_kernels(incidents: list[Incident], findings: pd.DataFrame) -> list[Incident]:
    """Name the confirmed kernel findings of each open incident's culprit ranks in its evidence;
    the incidents whose evidence changed."""
    if not len(findings) or "confirmed" not in findings.columns:
        return []
    conf = findings[(findings["confirmed"] == 1) & findings["cause"].isin(("own", "link"))]
    changed = []
    for inc in incidents:
        if not inc.is_open:
            continue
        mine = conf[np.isin(conf["rank"].to_numpy(np.int64), inc.ranks)]
        if not len(mine):
            continue
        per = mine.groupby("name", sort=False).agg(kind=("kind", "first"), cause=("cause", "first"),
                                                    ratio=("ratio", "max"), ranks=("rank", lambda r: sorted(set(r))))
        per = per.sort_values("ratio", ascending=False).head(TOP)
        named = [{"kernel": str(n), "kind": str(r.kind), "cause": str(r.cause), "ratio": round(float(r.ratio), 2),
                  "ranks": format_ranks(r.ranks)} for n, r in per.iterrows()]
        if inc.evidence.get("kernels") != named:
            inc.evidence["kernels"] = named
            changed.append(inc)
    return changed
