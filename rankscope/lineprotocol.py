"""Vectorised InfluxDB line protocol encoder.

Encodes a whole frame at once with numpy string operations instead of one
Python call per point. The tag part of a point (``measurement,tag=v,...``)
depends only on who sends it, so callers that write the same ranks every
iteration build it once (:func:`encode_prefixes`) and reuse it
(:func:`encode_lines`).

Escaping follows the line protocol reference and what InfluxDB 1.x and 2.x
parse back identically:

- measurement: ``,`` and space escaped;
- tag keys, tag values, field keys: ``,``, ``=`` and space escaped;
- string field values: ``"`` and ``\\`` escaped, inside double quotes.

Backslashes in names and tag values are written as they are, because the
server does not unescape ``\\\\`` there. Two things line protocol cannot carry
in a name or tag value are refused with :class:`LineProtocolError` before
anything is encoded: a newline (or carriage return), and a backslash that
ends the value or stands before ``,``, ``=`` or a space (the server would read
it as an escape). An empty tag value is dropped, as InfluxDB does.

Floats are written with Python's shortest round-trip repr, so the value read
back is bit-identical; ints get the ``i`` suffix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd


class LineProtocolError(ValueError):
    """A name or value that line protocol cannot carry."""


_UNCARRIABLE = re.compile(r"[\r\n]|\\(?=[,= ]|$)")


def check_key(text: str, what: str) -> str:
    """Refuse a name or tag value line protocol cannot carry; return it unchanged."""
    if not isinstance(text, str):
        text = str(text)
    m = _UNCARRIABLE.search(text)
    if m:
        why = "a newline" if m.group(0) in "\r\n" else "a backslash before ',', '=', ' ' or at the end"
        raise LineProtocolError(f"{what} {text!r} contains {why}, which line protocol cannot carry")
    return text


def escape_measurement(name: str) -> str:
    check_key(name, "measurement name")
    if not name:
        raise LineProtocolError("measurement name is empty")
    return name.replace(",", r"\,").replace(" ", r"\ ")


def escape_key(text: str, what: str = "tag key") -> str:
    check_key(text, what)
    if not text:
        raise LineProtocolError(f"{what} is empty")
    return text.replace(",", r"\,").replace("=", r"\=").replace(" ", r"\ ")


def _escape_tag_values(values: np.ndarray, key: str) -> np.ndarray:
    """Escape a column of tag values (object array of str); checks every value."""
    uniq, inverse = np.unique(values.astype(str), return_inverse=True)
    escaped = np.array([escape_key(v, f"tag {key!r} value") if v else "" for v in uniq], dtype=object)
    return escaped[inverse.reshape(-1)]


def encode_prefixes(measurement: str, tags: pd.DataFrame) -> np.ndarray:
    """``measurement,k1=v1,k2=v2`` for every row of ``tags`` (keys sorted, as InfluxDB prefers).

    Values are stringified (ints as decimal). Empty values are left out.
    """
    prefix = np.full(len(tags), escape_measurement(measurement), dtype=object)
    for key in sorted(tags.columns):
        ekey = escape_key(str(key))
        vals = _escape_tag_values(tags[key].to_numpy(dtype=object), str(key))
        part = np.where(vals == "", "", ("," + ekey + "=") + vals)
        prefix = prefix + part
    return prefix


def _format_column(values: np.ndarray, key: str) -> np.ndarray:
    """Field values of one column as line protocol text (object array)."""
    ekey = escape_key(key, "field key") + "="
    if values.dtype.kind == "f":
        text = np.array(list(map(repr, values.tolist())), dtype=object)
    elif values.dtype.kind in "iu":
        text = np.array(list(map(str, values.tolist())), dtype=object) + "i"
    elif values.dtype.kind == "b":
        text = np.where(values, "true", "false").astype(object)
    else:
        strs = pd.Series(values, dtype=object).astype(str)
        text = ('"' + strs.str.replace("\\", "\\\\", regex=False)
                .str.replace('"', '\\"', regex=False) + '"').to_numpy(dtype=object)
    return ekey + text


def encode_lines(
    prefixes: np.ndarray,
    fields: Mapping[str, np.ndarray] | pd.DataFrame,
    times: np.ndarray | int,
    present: Mapping[str, np.ndarray] | None = None,
) -> list[str]:
    """Join prefixes, fields and integer timestamps into lines.

    ``fields`` maps field key -> column (float, int, bool or str). ``present``
    optionally maps a field key to a boolean mask of rows that carry it (a
    missing value is left out of that line rather than written as NaN).
    Timestamps are integers in the precision the write will declare.
    """
    n = len(prefixes)
    cols = fields.items() if isinstance(fields, Mapping) else ((c, fields[c].to_numpy()) for c in fields.columns)
    body: np.ndarray | None = None
    sparse = False
    for key, col in cols:
        col = np.asarray(col)
        if len(col) != n:
            raise ValueError(f"field {key!r} has {len(col)} values for {n} points")
        part = _format_column(col, str(key))
        mask = None if present is None else present.get(key)
        if mask is not None:
            part = np.where(mask, part, "")
        if body is None:
            body = part
        elif mask is None and not sparse:
            body = body + ("," + part)
        else:
            joined = np.where(part == "", body, body + ("," + part))
            body = np.where(body == "", part, joined)
        sparse = sparse or mask is not None
    if body is None:
        raise ValueError("a point needs at least one field")
    empty = body == ""
    if np.any(empty):
        raise LineProtocolError(f"{int(empty.sum())} point(s) have no field left to write")
    t = np.broadcast_to(np.asarray(times, dtype=np.int64), (n,))
    ts = np.array(list(map(str, t.tolist())), dtype=object)
    return (prefixes + " " + body + " " + ts).tolist()


def encode_frame(
    measurement: str,
    frame: pd.DataFrame,
    tags: Sequence[str],
    fields: Sequence[str],
    time_col: str = "time",
) -> list[str]:
    """Encode a frame; NaN float fields are left out of their line."""
    prefixes = encode_prefixes(measurement, frame[list(tags)])
    cols: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray] = {}
    for f in fields:
        col = frame[f].to_numpy()
        if col.dtype.kind == "f":
            mask = ~np.isnan(col)
            if not mask.all():
                present[f] = mask
        elif col.dtype == object:
            mask = pd.notna(frame[f]).to_numpy()
            if not mask.all():
                present[f] = mask
        cols[f] = col
    return encode_lines(prefixes, cols, frame[time_col].to_numpy(dtype=np.int64), present or None)


def quote_string(value: str) -> str:
    """An InfluxQL string literal: ``'...'`` with ``\\`` and ``'`` escaped."""
    value = str(value)
    if "\n" in value or "\r" in value:
        raise LineProtocolError(f"value {value!r} contains a newline")
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote_ident(name: str) -> str:
    """An InfluxQL identifier: ``"..."`` with ``\\`` and ``"`` escaped."""
    name = str(name)
    if "\n" in name or "\r" in name:
        raise LineProtocolError(f"identifier {name!r} contains a newline")
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
