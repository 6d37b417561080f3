"""The InfluxQL FROM of a measurement: the one place that decides which retention policy a read
names, used by the store (:class:`~rankscope.store.influx.InfluxStore`) and by the dashboards.

Retention (docs/schema.md): raw ``stage_latency`` lives in the database's default policy, so
its FROM names none (``"stage_latency"``); everything else lives in ``long``, which InfluxDB 1.x
reads only when a query names it (``"long"."incident"``; 2.x and 3.x map ``<db>.long`` to the
bucket ``<bucket>/long``). A store set to one retention policy for everything names that one.

Pure: no I/O. Whether a database has ``long`` at all is the store's business; it passes the
policy it found to :func:`from_clause`.
"""

from __future__ import annotations

from rankscope.config import LONG_POLICY, policy_of
from rankscope.lineprotocol import quote_ident, quote_string


def named_policy(measurement: str, retention_policy: str | None = None) -> str | None:
    """The retention policy the FROM of ``measurement`` names: ``retention_policy`` when one is
    set for every measurement, else ``long`` for what is kept long and None (the database's
    default policy) for raw points."""
    if retention_policy:
        return retention_policy
    return LONG_POLICY if policy_of(measurement) == LONG_POLICY else None


def from_clause(measurement: str, policy: str | None) -> str:
    """``"<policy>"."<measurement>"``, or ``"<measurement>"`` when ``policy`` is None."""
    name = quote_ident(measurement)
    return f"{quote_ident(policy)}.{name}" if policy else name


def source(measurement: str, retention_policy: str | None = None) -> str:
    """The FROM of ``measurement`` on a database laid out as docs/schema.md says (``long``
    exists): ``"long"."incident"``, ``"stage_latency"``; with ``retention_policy`` set,
    ``"<retention_policy>"."<measurement>"`` for every measurement."""
    return from_clause(measurement, named_policy(measurement, retention_policy))


def where_clause(job: str | None, start_ms: int | None, end_ms: int | None,
                 where: dict[str, str | int] | None) -> str:
    """`` WHERE "job" = '...' AND "<tag>" = '...' AND time >= ...ms AND time <= ...ms`` (only the
    conditions given; ``""`` when none is); a list of values is any of them (``("host" = 'a' OR
    "host" = 'b')``)."""
    conds = []
    if job is not None:
        conds.append(f"{quote_ident('job')} = {quote_string(job)}")
    for k, v in (where or {}).items():
        if isinstance(v, (list, tuple)):   # any of these values
            if not v:
                raise ValueError(f"where {k!r}: an empty list of values selects nothing")
            conds.append("(" + " OR ".join(f"{quote_ident(k)} = {quote_string(str(x))}" for x in v) + ")")
            continue
        conds.append(f"{quote_ident(k)} = {quote_string('' if v is None else str(v))}")
    if start_ms is not None:
        conds.append(f"time >= {int(start_ms)}ms")
    if end_ms is not None:
        conds.append(f"time <= {int(end_ms)}ms")
    return (" WHERE " + " AND ".join(conds)) if conds else ""
