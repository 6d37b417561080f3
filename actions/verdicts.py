"""The verdicts the actor reads: every job's incidents as the analyzer last wrote them.

One read of the ``incident`` measurement over every job (onsets within ``lookback_s``), the
latest version of each (job, id), through the core's incident model: the actor never imports
the analyzer, it reads what the analyzer wrote.
"""

from __future__ import annotations

from rankscope import schema
from rankscope.incident import Incident
from rankscope.store import Store


def read_incidents(store: Store, since_ms: int | None, jobs: list[str] | None = None) -> list[Incident]:
    """The incidents with an onset since ``since_ms`` (of ``jobs``: all when None), the latest
    version of each, oldest onset first."""
    df = store.read(schema.INCIDENT, None, since_ms)
    if not len(df):
        return []
    if jobs:
        df = df[df["job"].astype(str).isin(jobs)]
    sort = ["time", "updated_ms"] if "updated_ms" in df.columns else ["time"]
    df = df.sort_values(sort, kind="stable").drop_duplicates(["job", "id"], keep="last")
    out = []
    for row in df.to_dict("records"):
        try:
            out.append(Incident.from_row(row))
        except (KeyError, ValueError, TypeError):   # a point the model cannot read: not acted on
            continue
    return out
