"""When rankscope acted on a job's incidents: the drains done, as the actor recorded them.

The actor (actions/) writes every step of every action as an ``action`` point; the analyzer
reads the done drains back, through the store, for each incident's timeline (``action``) and
its recovery (a restart after a drain is the drain's doing). One read per job and cycle, of the
points since its oldest held incident's onset.
"""

from __future__ import annotations

from rankscope import schema
from rankscope.store import Store


def drain_times(store: Store, job: str, since_ms: int) -> dict[str, int]:
    """Incident id -> the time (ms) of the first drain done on it."""
    df = store.read(schema.ACTION, job, since_ms)
    if not len(df) or not {"state", "action", "incident"} <= set(df.columns):
        return {}
    done = df[(df["state"] == "done") & (df["action"] == "drain")]
    return {str(k): int(v) for k, v in done.groupby("incident")["time"].min().items()}
