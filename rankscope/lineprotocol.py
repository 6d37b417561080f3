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
- string field values: ``"`` and ``\\`` escaped, inside double quotes; a newline
  (or carriage return) written as ``\\n`` (``\\r``): line protocol has no way to
  carry one, and a raw one would end the point.

Backslashes in names and tag values are written as they are, because the
server does not unescape ``\\\\`` there. Two things line protocol cannot carry
in a name or tag value are refused with :class:`LineProtocolError` before
anything is encoded: a newline (or carriage return), and a backslash that
ends the value or stands before ``,``, ``=`` or a space (the server would read
it as an escape). An empty tag value is dropped, as InfluxDB does.

Floats are written so the value read back is bit-identical: values on the
0.001 grid (stage durations in ms at 1 us resolution) by a vectorised
fixed-point formatter, anything else with Python's shortest round-trip repr;
ints get the ``i`` suffix.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

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

    Integer columns are written as decimals; other values are stringified and
    escaped. Empty values are left out, as InfluxDB does.
    """
    n = len(tags)
    pieces: list[np.ndarray | str] = [escape_measurement(measurement)]
    sparse: list[tuple[str, np.ndarray]] = []
    for key in sorted(tags.columns):
        ekey = escape_key(str(key))
        col = tags[key].to_numpy()
        if col.dtype.kind in "iu":
            vals = _int_text(col)
        else:
            vals = _escape_tag_values(col.astype(object), str(key))
            if np.any(vals == ""):
                sparse.append((ekey, vals))
                continue
        pieces += ["," + ekey + "=", vals]
    if n == 0:
        return np.empty(0, dtype=object)
    prefix = _join_rows(pieces, n)
    if sparse:  # rare: a string tag that some rows lack is left out of those rows
        prefix = np.full(n, escape_measurement(measurement), dtype=object)
        for key in sorted(tags.columns):
            ekey = escape_key(str(key))
            col = tags[key].to_numpy()
            vals = _int_text(col) if col.dtype.kind in "iu" else _escape_tag_values(col.astype(object), str(key))
            prefix = prefix + np.where(vals == "", "", ("," + ekey + "=") + vals)
    return prefix


def _join_body(pieces: list[np.ndarray | str], n: int) -> str:
    """Concatenate per-row pieces (arrays of n strings, or constants) into n newline-separated
    lines, with one C-level join over all pieces (neighbouring constants folded first)."""
    merged: list[np.ndarray | str] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    matrix = np.empty((n, len(merged) + 1), dtype=object)
    for j, piece in enumerate(merged):
        matrix[:, j] = piece
    matrix[:, -1] = "\n"
    matrix[-1, -1] = ""
    return "".join(matrix.ravel().tolist())


def _join_rows(pieces: list[np.ndarray | str], n: int) -> np.ndarray:
    """:func:`_join_body` as an array of the n strings."""
    return np.array(_join_body(pieces, n).split("\n"), dtype=object)


#: Decimal places of the fixed-point fast path: durations in ms at 1 us resolution.
FIXED_DECIMALS = 3
_SCALE = 10**FIXED_DECIMALS
_FRAC = np.array([f".{i:0{FIXED_DECIMALS}d}" for i in range(_SCALE)], dtype=object)
_INT_TABLE_SIZE = 100_000
_INT_TABLE: np.ndarray | None = None


def _int_text(values: np.ndarray) -> np.ndarray:
    """Decimal text of non-negative or negative int64s (object array), vectorised.

    Small values come from a lookup table; repeated values (an iteration number,
    a timestamp shared by a whole batch) are formatted once.
    """
    global _INT_TABLE
    if _INT_TABLE is None:
        _INT_TABLE = np.array(list(map(str, range(_INT_TABLE_SIZE))), dtype=object)
    values = np.asarray(values, dtype=np.int64)
    if values.size and values.min() >= 0 and values.max() < _INT_TABLE_SIZE:
        return _INT_TABLE[values]
    uniq, inverse = np.unique(values, return_inverse=True)
    if len(uniq) * 4 < len(values):
        return np.array(list(map(str, uniq.tolist())), dtype=object)[inverse.reshape(-1)]
    return np.array(list(map(str, values.tolist())), dtype=object)


def _float_pieces(values: np.ndarray) -> list[np.ndarray]:
    """Text pieces of finite floats that read back bit-identical.

    Values on the 0.001 grid (durations in ms at 1 us resolution, as collectors
    write them) take a vectorised fixed-point path (integer part and fraction
    from lookup tables); anything else gets Python's shortest round-trip ``repr``.
    """
    finite = np.isfinite(values)
    values = np.where(finite, values, 0.0)  # missing values are masked out by the caller
    scaled = np.rint(values * _SCALE)
    if np.all(np.abs(scaled) < 2**53) and np.array_equal(scaled / _SCALE, values):
        q = scaled.astype(np.int64)
        a = np.abs(q)
        whole = _int_text(a // _SCALE)
        neg = q < 0
        if neg.any():
            whole = np.where(neg, "-" + whole, whole)
        return [whole, _FRAC[a % _SCALE]]
    return [np.array(list(map(repr, values.tolist())), dtype=object)]


def _value_pieces(values: np.ndarray) -> list[np.ndarray | str]:
    """Field values of one column as line protocol text pieces (to be concatenated).

    Float columns must be finite where they are written (the caller masks the rest out).
    """
    if values.dtype.kind == "f":
        return list(_float_pieces(values.astype(np.float64, copy=False)))
    if values.dtype.kind in "iu":
        return [_int_text(values), "i"]
    if values.dtype.kind == "b":
        return [np.where(values, "true", "false").astype(object)]
    strs = pd.Series(values, dtype=object)
    strs = strs.where(strs.notna(), "").astype(str)   # a missing value is formatted, then left out
    return [('"' + strs.str.replace("\\", "\\\\", regex=False)
             .str.replace('"', '\\"', regex=False)
             .str.replace("\n", "\\n", regex=False)
             .str.replace("\r", "\\r", regex=False) + '"').to_numpy(dtype=object)]


def _format_column(values: np.ndarray, key: str) -> np.ndarray:
    """``key=value`` text of one column (object array)."""
    text: np.ndarray | str = escape_key(key, "field key") + "="
    for piece in _value_pieces(values):
        text = text + piece
    return np.asarray(text, dtype=object)


def encode_lines(
    prefixes: np.ndarray,
    fields: Mapping[str, np.ndarray] | pd.DataFrame,
    times: np.ndarray | int,
    present: Mapping[str, np.ndarray] | None = None,
    nonnegative: Collection[str] = (),
) -> list[str]:
    """Join prefixes, fields and integer timestamps into lines, one per point.

    ``fields`` maps field key -> column (float, int, bool or str). ``present``
    optionally maps a field key to a boolean mask of rows that carry it (a
    missing value is left out of that line rather than written as NaN).
    Timestamps are integers in the precision the write will declare.

    Whatever the mask, a float that is written must be finite and a field named
    in ``nonnegative`` (durations) must not be negative: :class:`LineProtocolError`
    names the field and the first bad row, and nothing is encoded.
    """
    return encode_body(prefixes, fields, times, present, nonnegative).split("\n")


def encode_body(
    prefixes: np.ndarray,
    fields: Mapping[str, np.ndarray] | pd.DataFrame,
    times: np.ndarray | int,
    present: Mapping[str, np.ndarray] | None = None,
    nonnegative: Collection[str] = (),
) -> str:
    """Like :func:`encode_lines`, as one newline-separated string (what a write sends).

    Each line is a row of a piece matrix (prefix, separators, keys, values,
    timestamp) joined once, so the cost is one C-level join over all pieces.
    """
    n = len(prefixes)
    if n == 0:
        return ""
    cols = list(fields.items()) if isinstance(fields, Mapping) else [(c, fields[c].to_numpy()) for c in fields.columns]
    if not cols:
        raise ValueError("a point needs at least one field")
    present = {k: m for k, m in (present or {}).items() if m is not None and not np.all(m)}
    for key, col in cols:
        if len(col) != n:
            raise ValueError(f"field {key!r} has {len(col)} values for {n} points")
        _check_values(str(key), np.asarray(col), present.get(key), key in nonnegative)
    t = np.broadcast_to(np.asarray(times, dtype=np.int64), (n,))
    ts = _int_text(t)
    if present:
        body = np.full(n, "", dtype=object)
        for key, col in cols:
            text = _format_column(np.asarray(col), str(key))
            mask = present.get(key)
            part = text if mask is None else np.where(mask, text, "")
            body = np.where(body == "", part, np.where(part == "", body, body + ("," + part)))
        if np.any(body == ""):
            raise LineProtocolError(f"{int((body == '').sum())} point(s) have no field left to write")
        pieces: list[np.ndarray | str] = [prefixes, " ", body, " ", ts]
    else:
        pieces = [prefixes]
        for i, (key, col) in enumerate(cols):
            pieces.append((" " if i == 0 else ",") + escape_key(str(key), "field key") + "=")
            pieces.extend(_value_pieces(np.asarray(col)))
        pieces += [" ", ts]
    return _join_body(pieces, n)


def _check_values(key: str, col: np.ndarray, mask: np.ndarray | None, nonnegative: bool) -> None:
    """Refuse values line protocol must not carry: non-finite floats, negative durations."""
    if col.dtype.kind not in "fiu":
        return
    bad = ~np.isfinite(col) if col.dtype.kind == "f" else np.zeros(len(col), dtype=bool)
    if nonnegative:
        with np.errstate(invalid="ignore"):
            bad |= col < 0
    if mask is not None:
        bad &= mask
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        what = "negative duration" if nonnegative and np.isfinite(col[row]) else "non-finite value"
        raise LineProtocolError(f"field {key!r}: {int(bad.sum())} {what}(s), first {col[row].item()!r} at row {row}")


def encode_frame(
    measurement: str,
    frame: pd.DataFrame,
    tags: Sequence[str],
    fields: Sequence[str],
    time_col: str = "time",
    prefixes: np.ndarray | None = None,
    nonnegative: Collection[str] = (),
) -> list[str]:
    """Encode a frame; NaN float fields are left out of their line.

    ``prefixes``: the rows' encoded tag prefixes when the caller has them cached.
    """
    if prefixes is None:
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
    return encode_lines(prefixes, cols, frame[time_col].to_numpy(dtype=np.int64), present or None,
                        nonnegative)


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
