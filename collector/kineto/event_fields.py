"""The fields of a trace event, checked: the right type, finite, in range.

A trace is data from the cluster: every field an event contributes is checked here before
it is used. An event that fails a check raises :class:`BadField` (the field, its value, the
rule), and the parser refuses that event and keeps the others (it counts them and shows the
first, naming the file, the event and the field).

- ``ts`` (and a flow's ``ts``): microseconds, finite, ``|ts|`` at most :data:`MAX_TS_US`
  (the latest time a store holds: Kineto writes epoch or base-relative microseconds);
- ``dur``: microseconds, finite, 0 to :data:`MAX_DUR_US` (11.6 days);
- ``name``, ``cat``, ``args["Collective name"]``: text;
- ``pid``, ``tid``, a flow's ``id``, ``args["correlation"]``: an integer or text;
- ``args``: an object; ``args["device"]``: a device index, 0 to 65535;
- the ``N`` of ``ProfilerStep#N``: 0 to 2^31 - 1;
- the trace's rank (``distributedInfo``, or the file name) and world size: below 2^20;
  ``baseTimeNanoseconds``: 0 to the latest time a store holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rankscope.times import MAX_EPOCH_MS

#: The largest ``|ts|`` of an event (us): the latest time a store holds.
MAX_TS_US = MAX_EPOCH_MS * 1000.0
#: The longest event (us): 11.6 days.
MAX_DUR_US = 1e12
#: The largest iteration number of ``ProfilerStep#N``.
MAX_STEP = (1 << 31) - 1
#: The largest device index.
MAX_DEVICE = (1 << 16) - 1
#: The most ranks a trace may name (a rank is below it).
MAX_RANKS = 1 << 20


class BadField(ValueError):
    """One field of an event that fails its check: its name, value and rule."""

    def __init__(self, key: str, value: Any, rule: str):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        super().__init__(f"field {key!r}: {shown} {rule}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def event(e: Any) -> Mapping[str, Any]:
    """The event itself, when it is an object."""
    if not isinstance(e, Mapping):
        raise BadField("event", e, "is not an object")
    return e


def text(e: Mapping[str, Any], key: str) -> str:
    """A text field (``""`` when missing or null)."""
    value = e.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadField(key, value, "is not text")
    return value


def timestamp(e: Mapping[str, Any], key: str = "ts", default: float | None = None) -> float:
    """A time in microseconds (``default`` when missing and one is given)."""
    value = e.get(key, default)
    if not _number(value):
        raise BadField(key, value, "is not a number" if value is not None else "is missing")
    if not (isinstance(value, int) or math.isfinite(value)) or abs(value) > MAX_TS_US:
        raise BadField(key, value, f"is not a finite time within +-{MAX_TS_US:g} us")
    return float(value)


def duration(e: Mapping[str, Any]) -> float:
    """``dur`` in microseconds (0 when missing)."""
    value = e.get("dur", 0.0)
    if not _number(value):
        raise BadField("dur", value, "is not a number")
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= MAX_DUR_US:
        raise BadField("dur", value, f"is not a finite duration in 0..{MAX_DUR_US:g} us")
    return float(value)


def key_value(e: Mapping[str, Any], key: str) -> int | str | None:
    """An identifier (``pid``, ``tid``, ``id``, ``correlation``): an integer, text or missing."""
    value = e.get(key)
    if value is None or (isinstance(value, int | str) and not isinstance(value, bool)):
        return value
    raise BadField(key, value, "is not an integer or text")


def arguments(e: Mapping[str, Any]) -> Mapping[str, Any]:
    """``args`` (empty when missing), its ``device`` and ``Collective name`` checked."""
    args = e.get("args")
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise BadField("args", args, "is not an object")
    device = args.get("device")
    if device is not None and (not isinstance(device, int) or isinstance(device, bool)
                               or not 0 <= device <= MAX_DEVICE):
        raise BadField("args.device", device, f"is not a device index in 0..{MAX_DEVICE}")
    coll = args.get("Collective name")
    if coll is not None and not isinstance(coll, str):
        raise BadField("args.Collective name", coll, "is not text")
    key_value(args, "correlation")
    return args


def step_number(digits: str) -> int:
    """The ``N`` of ``ProfilerStep#N``."""
    if len(digits) > 10 or int(digits) > MAX_STEP:
        raise BadField("name", f"ProfilerStep#{digits}", f"has an iteration number above {MAX_STEP}")
    return int(digits)


def rank_number(value: Any, key: str, most: int, missing_ok: bool = False) -> int | None:
    """A rank or world size, 0 to ``most`` (None when missing and ``missing_ok``)."""
    if value is None and missing_ok:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
        raise BadField(key, value, f"is not an integer in 0..{most}")
    return value


def base_time_us(data: Mapping[str, Any]) -> float:
    """The trace's ``baseTimeNanoseconds`` in microseconds (0 when missing)."""
    value = data.get("baseTimeNanoseconds", 0)
    if not _number(value) or not (isinstance(value, int) or math.isfinite(value)) \
            or not 0 <= value <= MAX_TS_US * 1000:
        raise BadField("baseTimeNanoseconds", value, "is not a time in epoch ns up to 2262")
    return float(value) / 1000.0
