"""A culprit host's record in earlier incidents, and the sentence a verdict says about it.

A host that was the culprit in one job and slows again in another, days later, is the first one
to drain. The record is made of ``incident_host`` points (one per incident and culprit host, at
the incident's onset: docs/schema.md), read once by :mod:`analyzer.read.host_history`; this
module is pure: rows in, :class:`HostRecord` and words out.

An incident is ``job`` + ``id`` (ids are stable inside a job only): its points count once,
whatever class or onset they were written with. Host names are compared as
:func:`rankscope.hostnames.same_host` compares them (case, a short name and its FQDN).

Example::

    >>> ms = lambda date: int(pd.Timestamp(date, tz="UTC").value // 1_000_000)
    >>> rows = pd.DataFrame({"time": [ms(d) for d in ("2026-11-28", "2026-12-01", "2026-12-04")],
    ...                      "job": ["a", "b", "b"], "id": ["cs-1", "cs-4", "cs-9"], "host": "node-17"})
    >>> records = culprit_records(rows, ["node-17", "node-18"], before_ms=ms("2026-12-05"))
    >>> record_sentence(records.values())
    'node-17 was the culprit 3 times before, in 2 jobs, on 2026-11-28, 2026-12-01 and 2026-12-04: drain it first.'
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

import pandas as pd

from rankscope.hostnames import matching_hosts

DAY_MS = 86_400_000
#: How far back a host's record goes by default.
LOOKBACK_MS = 30 * DAY_MS
#: Days listed by date; a longer record says how many days, from when to when.
MAX_DAYS_LISTED = 4
#: Hosts of one incident named in its sentence; the others are counted.
MAX_HOSTS_NAMED = 3
#: Columns of the rows :func:`culprit_records` reads (``incident_host``'s time and tags).
ROW_COLUMNS = ("time", "job", "id", "host")


@dataclass(frozen=True)
class HostRecord:
    """One host's earlier incidents: how many (distinct job + id), in how many jobs, the UTC
    dates of their onsets (oldest first) and the latest onset (epoch ms)."""

    host: str
    incidents: int
    jobs: int
    days: tuple[str, ...]
    last_ms: int

    @property
    def clause(self) -> str:
        """``node-17 was the culprit 3 times before, in 2 jobs, on 2026-11-28 and 2026-12-04``."""
        times = {1: "once", 2: "twice"}.get(self.incidents, f"{self.incidents} times")
        jobs = "1 job" if self.jobs == 1 else f"{self.jobs} jobs"
        return f"{self.host} was the culprit {times} before, in {jobs}, {_on_days(self.days)}"

    @property
    def sentence(self) -> str:
        """The clause as a verdict says it, for one host."""
        return f"{self.clause}: drain it first."


def _on_days(days: tuple[str, ...]) -> str:
    if len(days) > MAX_DAYS_LISTED:
        return f"on {len(days)} days from {days[0]} to {days[-1]}"
    return "on " + (days[0] if len(days) == 1 else f"{', '.join(days[:-1])} and {days[-1]}")


def culprit_records(rows: pd.DataFrame, hosts: Iterable[str], before_ms: int | None = None,
                    lookback_ms: int = LOOKBACK_MS,
                    exclude: Collection[tuple[str, str]] = ()) -> dict[str, HostRecord]:
    """The record of each of ``hosts`` that has one, from ``incident_host`` rows (columns
    :data:`ROW_COLUMNS`): incidents with their onset in the ``lookback_ms`` before ``before_ms``
    (exclusive; None: every row from the newest one's ``lookback_ms`` back), other than those of
    ``exclude`` (``(job, id)`` pairs: the incident being judged). Hosts without one are left out."""
    if not len(rows):
        return {}
    rows = rows.loc[:, list(ROW_COLUMNS)].dropna()
    end = int(rows["time"].max()) + 1 if before_ms is None else int(before_ms)
    times = rows["time"].to_numpy()
    rows = rows[(times < end) & (times >= end - lookback_ms)]
    if len(exclude):
        keys = pd.MultiIndex.from_frame(rows[["job", "id"]].astype(str))
        rows = rows[~keys.isin(list(exclude))]
    known = pd.unique(rows["host"].astype(str)).tolist()
    out: dict[str, HostRecord] = {}
    for host in dict.fromkeys(hosts):
        mine = rows[rows["host"].astype(str).isin(matching_hosts(host, known))]
        if len(mine):
            out[host] = _record(host, mine)
    return out


def _record(host: str, rows: pd.DataFrame) -> HostRecord:
    """One host's record from its rows (each incident once: its earliest point)."""
    first = rows.sort_values("time", kind="stable").drop_duplicates(["job", "id"])
    stamps = pd.to_datetime(first["time"].astype("int64"), unit="ms", utc=True)
    return HostRecord(host=host, incidents=len(first), jobs=int(first["job"].nunique()),
                      days=tuple(sorted(set(stamps.dt.strftime("%Y-%m-%d")))),
                      last_ms=int(first["time"].max()))


def record_sentence(records: Iterable[HostRecord]) -> str:
    """One sentence for an incident's culprit hosts: those with the longest record first, at
    most :data:`MAX_HOSTS_NAMED` named; ``""`` when none has a record."""
    ranked = sorted(records, key=lambda r: (-r.incidents, -r.last_ms, r.host))
    if not ranked:
        return ""
    if len(ranked) == 1:
        return ranked[0].sentence
    named = [r.clause for r in ranked[:MAX_HOSTS_NAMED]]
    more = len(ranked) - len(named)
    if more:
        named.append(f"{more} more of its hosts were culprits before too")
    return "; ".join(named) + ": drain them first."


__all__ = ["LOOKBACK_MS", "ROW_COLUMNS", "HostRecord", "culprit_records", "record_sentence"]
