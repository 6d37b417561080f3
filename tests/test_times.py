"""The one time parser (rankscope/times.py), as its two kinds of caller use it."""

from __future__ import annotations

import pytest

from rankscope.times import TimeError, format_time, parse_time


def test_times_on_the_command_line():
    now = 1_780_000_000_000
    cli = {"now_ms": now, "assume_utc": True}     # what rankscope rollup --since passes
    assert parse_time("6h", **cli) == now - 6 * 3_600_000
    assert parse_time("7d", **cli) == now - 7 * 86_400_000
    assert parse_time("2026-07-08T09:30:00Z", **cli) == 1_783_503_000_000
    assert parse_time("2026-07-08T11:30:00+02:00", **cli) == 1_783_503_000_000
    assert parse_time("2026-07-08T09:30:00", **cli) == 1_783_503_000_000      # no zone: UTC
    assert parse_time("1783503000000", **cli) == 1_783_503_000_000
    with pytest.raises(ValueError, match="seconds"):
        parse_time("1783503000", **cli)
    with pytest.raises(ValueError, match="--since 'yesterday'.*expected e.g. 6h"):
        parse_time("yesterday", "--since", **cli)


def test_times_in_payloads():
    """A payload's time: no relative form, no zone refused rather than guessed, and anything
    that is no time refused with a TimeError naming it (never another exception)."""
    assert parse_time("2026-07-08T09:30:00.123Z", "startsAt") == 1_783_503_000_123
    assert parse_time(1_783_503_000_000) == 1_783_503_000_000
    assert parse_time(format_time(1_783_503_000_123)) == 1_783_503_000_123
    with pytest.raises(TimeError, match="startsAt '2026-07-08T09:30:00' has no time zone"):
        parse_time("2026-07-08T09:30:00", "startsAt")
    with pytest.raises(TimeError, match="not an RFC 3339 time"):
        parse_time("6h", "startsAt")
    for bad, why in (("\u00b2", "not an RFC 3339 time"), ("", "not an RFC 3339 time"), (True, "not a time"),
                     (1.5e12, "not a time"), (1_783_503_000, "looks like epoch seconds"),
                     ("1960-01-01T00:00:00Z", "outside the range"), (10**16, "outside the range")):
        with pytest.raises(TimeError, match=why):
            parse_time(bad)
