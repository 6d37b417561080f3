"""Culprit hosts' records across jobs, read back from the ``incident_host`` points.

The service keeps each culprit host's record in the database already: every incident writes
one ``incident_host`` point per culprit host at its onset (tags job, id, class, host; kept 400
days in ``long``: docs/schema.md). :func:`read_host_history` reads the points of a time range
in one query, whatever the number of hosts, and :mod:`analyzer.read.host_record` makes each
host's record and the verdict's sentence from them.

:func:`annotate_repeat_offenders` is what the cycle calls with the incidents it is about to
write: it looks the record up only for incidents that have none yet (new ones: an incident
keeps its sentence, in memory and in its ``incident`` point, for its life), all of them in one
read, so a cycle costs one query at most, and none when nothing opened.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable

import pandas as pd

from analyzer.read.host_record import (
    LOOKBACK_MS,
    ROW_COLUMNS,
    HostRecord,
    culprit_records,
    record_sentence,
)
from rankscope import schema
from rankscope.incident import Incident, IncidentClass
from rankscope.store import Store, StoreError

log = logging.getLogger(__name__)


def read_culprit_rows(store: Store, start_ms: int, end_ms: int) -> pd.DataFrame:
    """The ``incident_host`` points with their onset in ``[start_ms, end_ms]``, every job and
    host: columns :data:`~analyzer.read.host_record.ROW_COLUMNS`. One query (the measurement
    holds a point per incident and culprit host, so a month of a cluster's is small)."""
    df = store.read(schema.INCIDENT_HOST, start_ms=int(start_ms), end_ms=int(end_ms))
    if not len(df) or not set(ROW_COLUMNS) <= set(df.columns):
        return pd.DataFrame(columns=list(ROW_COLUMNS))
    return df.loc[:, list(ROW_COLUMNS)]


def read_host_history(store: Store, hosts: Iterable[str], before_ms: int | None = None,
                      lookback_ms: int = LOOKBACK_MS,
                      exclude: Collection[tuple[str, str]] = ()) -> dict[str, HostRecord]:
    """Each of ``hosts``' record as a culprit: the incidents (each ``job`` + ``id`` once) whose
    onset lies in the ``lookback_ms`` before ``before_ms`` (None: now), other than ``exclude``
    (``(job, id)`` pairs: the incident being judged). Hosts without one are left out. One query."""
    end = int(time.time() * 1000) + 1 if before_ms is None else int(before_ms)
    rows = read_culprit_rows(store, end - lookback_ms, end - 1)
    return culprit_records(rows, hosts, end, lookback_ms, exclude)


def machines(inc: Incident) -> list[str]:
    """The host names of ``inc`` a record is kept for: its hosts, when the data names them (node
    numbers are a job's own, not machines), and none for a pipeline imbalance (a whole stage)."""
    return [] if inc.cls == IncidentClass.PIPELINE_IMBALANCE else list(inc.hosts)


def _batch_rows(incidents: Iterable[Incident]) -> pd.DataFrame:
    """The rows ``incident_host`` gets from ``incidents``: those written in the same cycle count
    for each other (one that opened just before another on the same host is its record)."""
    rows = [(int(i.onset_ms), i.job, i.id, h) for i in incidents for h in machines(i)]
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


def annotate_repeat_offenders(store: Store, incidents: Iterable[Incident],
                              lookback_ms: int = LOOKBACK_MS) -> list[Incident]:
    """Set ``host_record`` on each of ``incidents`` that has none yet (None): the sentence on its
    culprit hosts' incidents in the ``lookback_ms`` before its onset, other jobs' and its own
    job's earlier ones, ``""`` when they have none. In place (the diagnosis holds these objects,
    so an incident is looked up once in its life) and returned. One read for all of them; none
    when every incident has its record. A failed read is logged and leaves the record to the
    incident's next write: the record must not hold the incident back."""
    incidents = list(incidents)
    todo = [i for i in incidents if i.host_record is None]
    if not any(machines(i) for i in todo):
        for inc in todo:
            inc.host_record = ""
        return incidents
    onsets = [int(i.onset_ms) for i in todo if machines(i)]
    try:
        stored = read_culprit_rows(store, min(onsets) - lookback_ms, max(onsets) - 1)
    except StoreError as exc:
        log.warning("the culprit hosts' records could not be read (%s); looked up again at the next write", exc)
        return incidents
    rows = pd.concat([f for f in (stored, _batch_rows(incidents)) if len(f)] or [stored], ignore_index=True)
    for inc in todo:
        hosts = machines(inc)
        records = culprit_records(rows, hosts, inc.onset_ms, lookback_ms, {(inc.job, inc.id)}) if hosts else {}
        inc.host_record = record_sentence(records.values())
    return incidents


__all__ = ["annotate_repeat_offenders", "machines", "read_culprit_rows", "read_host_history"]
