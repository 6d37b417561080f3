"""One ``event`` point as the receiver and ``rankscope event add`` write it, and its frame.

Every source of events (Alertmanager, Grafana, rankscope's own JSON, the command line) ends
up as :class:`EventRow` values, so the checks and the frame layout live in one place. The
point's time is when the event STARTED (Alertmanager's ``startsAt``): a resolved notice of
the same alert has the same time and tags and so rewrites the firing point in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope.lineprotocol import LineProtocolError, check_key
from rankscope.times import parse_time

FIRING = "firing"
RESOLVED = "resolved"
STATUSES = (FIRING, RESOLVED)
DEFAULT_SEVERITY = "warning"
DEFAULT_SOURCE = "rankscope"
#: Where an event came in, the first part of its ``source`` (``alertmanager/<receiver>``, ...):
#: the receiver's route it was posted to, or the command that wrote it. A sender names
#: itself only after it, so what one route posts never reads as another's.
ORIGINS = ("alertmanager", "grafana", "events", "cli")
#: ``ends_ms`` of an event that has not ended (or whose end is unknown).
NO_END = -1


class EventError(ValueError):
    """A value an event cannot be made of; the message names the value and why."""


@dataclass(frozen=True)
class EventRow:
    """One out-of-band event: who (``name``), where (``host``), when it started, and its state.

    ``status`` is ``firing`` or ``resolved``; ``ends_ms`` is when a resolved event ended
    (``-1`` while firing: the end a monitor predicts for a firing alert is not an end).
    """

    time_ms: int
    name: str
    host: str
    severity: str = DEFAULT_SEVERITY
    source: str = DEFAULT_SOURCE
    text: str = ""
    status: str = FIRING
    ends_ms: int = NO_END

    def __post_init__(self) -> None:
        for what in ("name", "host", "severity", "source"):
            value = getattr(self, what)
            if not isinstance(value, str) or not value.strip():
                raise EventError(f"{what} is empty")
            try:
                check_key(value, what)
            except LineProtocolError as exc:
                raise EventError(str(exc)) from None
        if self.status not in STATUSES:
            raise EventError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")
        if self.status == FIRING and self.ends_ms != NO_END:
            raise EventError("a firing event has no end")


def sourced(origin: str, sender: object = None) -> str:
    """An event's ``source``: ``origin`` (one of :data:`ORIGINS`), then ``/`` and the name the
    sender gives itself (Alertmanager's receiver, a script's ``source``), if it gives one."""
    if origin not in ORIGINS:
        raise ValueError(f"origin {origin!r} is not one of {', '.join(ORIGINS)}")
    name = sender.strip() if isinstance(sender, str) else ""
    return f"{origin}/{name}" if name else origin


def parse_end(value: object, what: str = "endsAt") -> int:
    """Like :func:`rankscope.times.parse_time`, but a missing end or Go's zero time
    (``0001-01-01T00:00:00Z``, what Alertmanager and Grafana send for "not ended") is
    :data:`NO_END`."""
    if value is None or value == "":
        return NO_END
    if isinstance(value, str) and value.startswith("0001-01-01"):
        return NO_END
    return parse_time(value, what)


def events_frame(rows: Sequence[EventRow], job: str | None = None) -> pd.DataFrame:
    """The ``event`` points of ``rows``: tags job (left out when None: cluster events,
    matched to jobs by host), name, host, severity, source; fields rank (-1: no rank named),
    text, value, status, ends_ms."""
    frame = pd.DataFrame({
        "time": np.array([r.time_ms for r in rows], dtype=np.int64),
        "name": [r.name for r in rows],
        "host": [r.host for r in rows],
        "severity": [r.severity for r in rows],
        "source": [r.source for r in rows],
        "rank": np.full(len(rows), -1, dtype=np.int64),
        "text": [r.text or r.name for r in rows],
        "value": np.ones(len(rows), dtype=np.int64),
        "status": [r.status for r in rows],
        "ends_ms": np.array([r.ends_ms for r in rows], dtype=np.int64),
    })
    if job is not None:
        frame.insert(1, "job", job)
    return frame
