"""Line protocol to frames, vectorised: the points InfluxDB forwards to a subscriber, as a read of
them would return them (:func:`parse_points`).

A body of N lines costs a handful of whole-buffer operations, no Python loop per point: the
separators (space, comma, equals sign) become commas (``bytes.replace``), pandas' C reader splits
the lot into tokens, and each row's tokens are ``measurement, key, value, key, value, ...,
timestamp``; a line's token count comes from counting its commas with numpy. Per token column
a key is a tag when the schema says so, else a field. Lines a fast path cannot split (an escape,
a quoted string) go through a per-line parser; points carry none of them
as the collectors write them, so that path is for what others send.
"""

from __future__ import annotations

import io
import re

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.store.base import INT_TAGS, normalise_frame

#: Timestamp units of the ``precision`` parameter of a write, in nanoseconds.
PRECISION_NS = {"n": 1, "ns": 1, "u": 1_000, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


class LineProtocolError(ValueError):
    """A body that is not line protocol of the expected measurement."""


def parse_points(body: bytes, measurement: str, precision: str = "ns") -> pd.DataFrame:
    """The points of ``measurement`` in ``body`` (other measurements' lines are skipped): a
    ``time`` column (epoch ms), the tags as strings (integer tags as ints) and the fields as
    numbers or strings, sorted by time, as :meth:`rankscope.store.Store.read` returns them."""
    if precision not in PRECISION_NS:
        raise LineProtocolError(f"precision {precision!r}: expected one of {', '.join(PRECISION_NS)}")
    fast, slow = _split_lines(body, measurement.encode() + b",")
    frames = [f for f in (_fast(fast, measurement), _slow(slow, measurement)) if len(f)]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    df["time"] = df["time"].to_numpy(np.int64) * PRECISION_NS[precision] // 1_000_000
    tags = schema.MEASUREMENTS[measurement].tags if measurement in schema.MEASUREMENTS else ()
    for c in (c for c in tags if c in df.columns):
        df[c] = df[c].astype(object)   # as a read gives them (and integer tags as ints, next)
    df = df[["time", *sorted(c for c in df.columns if c != "time")]]   # a read's order
    return normalise_frame(df)


def _split_lines(body: bytes, head: bytes) -> tuple[bytes, list[bytes]]:
    """The lines of ``body`` that start with ``head``: those the fast path takes, joined, and
    those with an escape or a separator inside a string (a few, one by one). Whole-buffer numpy
    (a pass per byte value looked for), no loop per line."""
    data = body if body.endswith(b"\n") else body + b"\n"
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    starts = np.concatenate([[0], ends[:-1] + 1])
    ok = (ends - starts) > len(head)
    for k, byte in enumerate(head):   # the measurement's name, a few bytes
        ok &= raw[np.minimum(starts + k, len(raw) - 1)] == byte
    if not ok.any():
        return b"", []
    odd = np.zeros(len(ends), dtype=bool)
    if b"\\" in data:                                             # an escape
        odd[np.searchsorted(ends, np.flatnonzero(raw == ord("\\")))] = True
    if b'"' in data:                                              # a separator inside a string
        q = np.flatnonzero(raw == ord('"'))
        per_line = np.bincount(np.searchsorted(ends, q), minlength=len(ends))
        odd |= (per_line % 2) == 1
        if not odd.any() and len(q) >= 2:
            sep = (raw == ord(" ")) | (raw == ord(",")) | (raw == ord("="))
            inside = np.add.reduceat(sep, q)[0::2]                # [open, close) of each string
            odd[np.searchsorted(ends, q[0::2][inside])] = True
    hard = ok & odd
    if ok.all() and not hard.any():
        return data.rstrip(b"\n"), []
    keep = np.repeat(ok & ~hard, ends - starts + 1)
    slow = [data[s:e] for s, e in zip(starts[hard].tolist(), ends[hard].tolist(), strict=True)]
    return raw[keep].tobytes().rstrip(b"\n"), slow


def _fast(lines: bytes, measurement: str) -> pd.DataFrame:
    """Lines without escapes or separators in strings (joined by newlines), by the whole-buffer path."""
    if not lines:
        return pd.DataFrame()
    blob = lines.replace(b" ", b",").replace(b"=", b",")
    raw = np.frombuffer(blob, dtype=np.uint8)
    starts = np.concatenate([[0], np.flatnonzero(raw == ord("\n")) + 1])
    where = np.flatnonzero(raw == ord(","))
    commas = np.diff(np.append(np.searchsorted(where, starts), len(where)))   # each line's commas
    width = int(commas.max()) + 1
    tokens = pd.read_csv(io.BytesIO(blob), header=None, names=range(width), keep_default_na=False,
                         na_values=[""], engine="c", quoting=3)
    if len(tokens) != len(starts) or not (commas % 2).all():
        raise LineProtocolError(f"{measurement}: {len(starts)} line(s) that are not key=value line protocol")
    texts = _text_columns(tokens, measurement)
    if texts:   # string tags that read as numbers (a job named "7"): again, as text
        again = pd.read_csv(io.BytesIO(blob), header=None, names=range(width), usecols=texts, dtype=str,
                            keep_default_na=False, na_values=[""], engine="c", quoting=3)
        for c in texts:
            tokens[c] = again[c]
    return _columns(tokens, commas, measurement)


def _text_columns(tokens: pd.DataFrame, measurement: str) -> list[int]:
    """Value columns of tags kept as text (all but the integer tags) the reader typed as numbers."""
    tags = set(schema.MEASUREMENTS[measurement].tags) - INT_TAGS if measurement in schema.MEASUREMENTS else set()
    out = []
    for j in range(1, tokens.shape[1] - 1, 2):
        if tokens[j + 1].dtype.kind in "fiu" and set(tokens[j].dropna().unique().tolist()) & tags:
            out.append(j + 1)
    return out


def _columns(tokens: pd.DataFrame, commas: np.ndarray, measurement: str) -> pd.DataFrame:
    """Rows of ``measurement, k, v, ..., ts`` tokens (``commas + 1`` each) as columns. Where every
    row has the same keys in the same places (the collectors' points) a column is taken whole,
    typed as the C reader typed it; else row by row of each key."""
    n, tags = len(tokens), set(schema.MEASUREMENTS[measurement].tags) if measurement in schema.MEASUREMENTS else set()
    uniform = bool((commas == commas[0]).all())
    cols = [tokens[c] for c in tokens.columns]
    ts = cols[int(commas[0])] if uniform else pd.Series(tokens.to_numpy(dtype=object)[np.arange(n), commas])
    out: dict[str, object] = {"time": pd.to_numeric(ts).to_numpy(np.int64)}
    for j in range(1, len(cols) - 1, 2):
        inside = commas > j            # a key here (not the row's timestamp)
        if not inside.any():
            break
        keys = cols[j].to_numpy(dtype=object)
        if uniform and (keys == keys[0]).all():
            out[str(keys[0])] = cols[j + 1].to_numpy()
            continue
        values = cols[j + 1].to_numpy(dtype=object)
        for key in pd.unique(keys[inside]):
            m = inside & (keys == key)
            col = out.setdefault(str(key), np.full(n, None, dtype=object))
            col[m] = values[m]
    return pd.DataFrame({k: (v if k == "time" or k in tags else _field(v)) for k, v in out.items()})


def _field(values: np.ndarray) -> np.ndarray | pd.Series:
    """A field column's text as values: ``1.5``, ``3i`` (integer), ``"text"``, ``t``/``f``."""
    if values.dtype.kind in "fiu":   # the C reader read numbers already
        return values.astype(float)
    s = pd.Series(values, dtype=object)
    text = s.dropna().astype(str)
    if text.str.startswith('"').all() and len(text):
        return s.where(s.isna(), s.str.slice(1, -1))
    num = text.str.removesuffix("i").str.removesuffix("u")
    if text.isin(["t", "f", "true", "false", "T", "F", "True", "False", "TRUE", "FALSE"]).all() and len(text):
        return s.map(lambda v: None if v is None else v.lower().startswith("t"))
    out = pd.Series(np.nan, index=s.index)
    out[text.index] = pd.to_numeric(num, errors="coerce")
    return out.to_numpy()


def _slow(lines: list[bytes], measurement: str) -> pd.DataFrame:
    """Lines with escapes or quoted separators, one by one."""
    rows = [_one(ln.decode("utf-8", errors="replace"), measurement) for ln in lines]
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    tags = set(schema.MEASUREMENTS[measurement].tags) if measurement in schema.MEASUREMENTS else set()
    for c in df.columns:
        if c != "time" and c not in tags:
            df[c] = _field(df[c].to_numpy(dtype=object))
    return df


def _one(line: str, measurement: str) -> dict[str, object]:
    parts = _split_unescaped(line, " ")
    if len(parts) != 3:
        raise LineProtocolError(f"{measurement}: a line without key, fields and timestamp: {line[:120]!r}")
    key, fields, ts = parts
    row: dict[str, object] = {"time": int(ts)}
    for kv in _split_unescaped(key, ",")[1:] + _split_unescaped(fields, ","):
        k, _, v = kv.partition("=")
        row[_unescape(k)] = _unescape(v) if not v.startswith('"') else '"' + v[1:-1].replace('\\"', '"') + '"'
    return row


def _split_unescaped(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside quotes and escapes."""
    out, cur, quoted, i = [], [], False, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i:i + 2])
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        if ch == sep and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    out.append("".join(cur))
    return out


def _unescape(text: str) -> str:
    return re.sub(r"\\([ ,=\\])", r"\1", text)
