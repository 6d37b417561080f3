"""One ``event`` point as the receiver and ``rankscope event add`` write it, and its frame.

Every source of events (Alertmanager, Grafana, rankscope's own JSON, the command line) ends
up as :class:`EventRow` values, so the checks and the frame layout live in one place. The
point's time is when the event STARTED (Alertmanager's ``startsAt``): a resolved notice of
the same alert has the same time and tags and so rewrites the firing point in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from rankscope.lineprotocol import LineProtocolError, check_key

FIRING = "firing"
RESOLVED = "resolved"
STATUSES = (FIRING, RESOLVED)
DEFAULT_SEVERITY = "warning"
DEFAULT_SOURCE = "rankscope"
#: ``ends_ms`` of an event that has not ended (or whose end is unknown).
NO_END = -1
#: Epoch milliseconds below this (1973-03-03) are taken for a mistake: seconds, not ms.
MIN_EPOCH_MS = 100_000_000_000
#: InfluxDB's latest representable time (2262-04-11), in ms.
MAX_EPOCH_MS = 9_223_372_036_854


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


def parse_time(value: object, what: str = "time") -> int:
    """Epoch milliseconds of an RFC 3339 / ISO 8601 time with a zone, or of epoch ms.

    A time without a zone is refused (whose clock would it be?), and so is an epoch
    number small enough to be seconds, or a time InfluxDB cannot store.
    """
    if isinstance(value, bool):
        raise EventError(f"{what} {value!r} is not a time")
    if isinstance(value, int):
        ms = value
        if 0 <= ms < MIN_EPOCH_MS:
            raise EventError(f"{what} {value!r} looks like epoch seconds; give epoch milliseconds")
    elif isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return parse_time(int(text), what)
        try:
            stamp = datetime.fromisoformat(text)
        except ValueError:
            raise EventError(f"{what} {value!r} is not an RFC 3339 time "
                             f"(e.g. 2026-07-08T09:30:00Z) nor epoch milliseconds") from None
        if stamp.tzinfo is None:
            raise EventError(f"{what} {value!r} has no time zone (add Z or +hh:mm)")
        ms = _epoch_ms(stamp)
    else:
        raise EventError(f"{what} {value!r} is not a time "
                         f"(an RFC 3339 string or epoch milliseconds)")
    if not 0 <= ms <= MAX_EPOCH_MS:
        raise EventError(f"{what} {value!r} is outside the range a store can hold (1970 to 2262)")
    return ms


def parse_end(value: object, what: str = "endsAt") -> int:
    """Like :func:`parse_time`, but a missing end or Go's zero time (``0001-01-01T00:00:00Z``,
    what Alertmanager and Grafana send for "not ended") is :data:`NO_END`."""
    if value is None or value == "":
        return NO_END
    if isinstance(value, str) and value.startswith("0001-01-01"):
        return NO_END
    return parse_time(value, what)


def format_time(ms: int) -> str:
    """``2026-07-08T09:30:00.123Z``: epoch ms as RFC 3339 in UTC."""
    stamp = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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


def _epoch_ms(stamp: datetime) -> int:
    """Exact integer ms (no float rounding of large epoch values)."""
    delta = stamp - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
