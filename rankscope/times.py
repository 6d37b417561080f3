"""Times as people and monitoring systems write them, as epoch milliseconds.

One parser for every edge that takes a time: Alertmanager's and Grafana's ``startsAt``
(RFC 3339), an event posted by a script (RFC 3339 or epoch ms), and a command line's
``--since 6h``. The edges differ in two choices only, which are arguments here: whether
a time without a zone is UTC (a person typing a command) or refused (a payload: whose
clock would it be?), and whether ``6h`` / ``7d`` (that long before ``now_ms``) is allowed.
Everything else is refused alike, with the value and the reason in the message: an
epoch number small enough to be seconds, text that is no time, a time InfluxDB cannot
store.

Example::

    >>> parse_time("2026-07-08T09:30:00Z")
    1783503000000
    >>> parse_time("2026-07-08 09:30", assume_utc=True), parse_time("6h", now_ms=21_600_000 + 10**12)
    (1783503000000, 1000000000000)
    >>> format_time(1783503000123)
    '2026-07-08T09:30:00.123Z'
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

#: Epoch milliseconds below this (1973-03-03) are taken for a mistake: seconds, not ms.
MIN_EPOCH_MS = 100_000_000_000
#: InfluxDB's latest representable time (2262-04-11), in ms.
MAX_EPOCH_MS = 9_223_372_036_854

_AGO = re.compile(r"(\d+)(s|m|h|d|w)")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TimeError(ValueError):
    """A value that is not a time rankscope can store; the message names it and why."""


def parse_time(value: object, what: str = "time", *, now_ms: int | None = None,
               assume_utc: bool = False) -> int:
    """Epoch milliseconds of ``value``: an RFC 3339 / ISO 8601 time, epoch ms (int or digits),
    or, when ``now_ms`` is given, ``<n>s|m|h|d|w`` meaning that long before ``now_ms``.

    A time without a zone is UTC with ``assume_utc``, refused without. ``what`` names the
    value in the error (``startsAt``, ``--since``).
    """
    if isinstance(value, bool):
        raise TimeError(f"{what} {value!r} is not a time")
    if isinstance(value, int):
        ms = value
        if 0 <= ms < MIN_EPOCH_MS:
            raise TimeError(f"{what} {value!r} looks like epoch seconds; give epoch milliseconds")
    elif isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit():      # not "²": str.isdigit takes it, int() does not
            return parse_time(int(text), what)
        ago = _AGO.fullmatch(text) if now_ms is not None else None
        if ago:
            ms = now_ms - int(ago.group(1)) * _UNIT_MS[ago.group(2)]
        else:
            ms = _parse_stamp(text, value, what, assume_utc, relative=now_ms is not None)
    else:
        raise TimeError(f"{what} {value!r} is not a time (an RFC 3339 string or epoch milliseconds)")
    if not 0 <= ms <= MAX_EPOCH_MS:
        raise TimeError(f"{what} {value!r} is outside the range a store can hold (1970 to 2262)")
    return ms


def _parse_stamp(text: str, value: str, what: str, assume_utc: bool, relative: bool) -> int:
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        forms = "6h, 7d, " if relative else ""
        raise TimeError(f"{what} {value!r} is not an RFC 3339 time nor epoch milliseconds "
                        f"(expected e.g. {forms}2026-07-08T09:30:00Z or 1783503000000)") from None
    if stamp.tzinfo is None:
        if not assume_utc:
            raise TimeError(f"{what} {value!r} has no time zone (add Z or +hh:mm)")
        stamp = stamp.replace(tzinfo=UTC)
    return epoch_ms(stamp)


def epoch_ms(stamp: datetime) -> int:
    """Exact integer ms of a zoned time (no float rounding of large epoch values)."""
    delta = stamp - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def format_time(ms: int) -> str:
    """``2026-07-08T09:30:00.123Z``: epoch ms as RFC 3339 in UTC."""
    stamp = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
