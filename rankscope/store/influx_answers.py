"""What an InfluxDB server answers, as frames and errors: ``/query``'s CSV and JSON, a
statement's error, the durations of ``SHOW RETENTION POLICIES``. Pure: no I/O."""

from __future__ import annotations

import io
import json
import re

import pandas as pd

from rankscope import schema
from rankscope.store.base import INT_TAGS, StoreError

_GO_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def go_duration_s(text: str) -> int:
    """``168h0m0s`` (InfluxDB's SHOW RETENTION POLICIES) in seconds; ``0s`` is INF."""
    m = _GO_DURATION.fullmatch(text.strip())
    if not m:
        return 0
    h, mi, se = (int(g) if g else 0 for g in m.groups())
    return h * 3600 + mi * 60 + se


def raise_statement_error(body: bytes) -> None:
    """Raise :class:`StoreError` when the JSON answer to a statement holds an error."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return
    for res in data.get("results", []):
        if "error" in res:
            raise StoreError(f"InfluxQL error: {res['error']}")
    if "error" in data:
        raise StoreError(f"InfluxQL error: {data['error']}")


def _string_columns() -> frozenset[str]:
    """Columns that stay strings when read back from CSV: string tags and string fields."""
    out = set()
    for m in schema.MEASUREMENTS.values():
        out.update(t for t in m.tags if t not in INT_TAGS)
        out.update(f for f, kind in m.fields.items() if kind == "str")
    return frozenset(out)


STRING_COLUMNS = _string_columns()


def parse_csv(body: bytes) -> pd.DataFrame:
    """InfluxDB's CSV answer as a frame; numbers where the text is numeric, except
    in the schema's string columns (a job named "7" stays "7")."""
    if not body.strip():
        return pd.DataFrame()
    if body.lstrip().startswith(b"{"):
        return parse_json(body)
    head = body[: body.find(b"\n")].decode(errors="replace").split(",")
    dtypes = {c: str for c in head if c in STRING_COLUMNS or c == "tags"}
    df = pd.read_csv(io.BytesIO(body), dtype=dtypes, keep_default_na=False, na_values=[""])
    if "error" in df.columns and len(df.columns) <= 2:
        raise StoreError(f"InfluxQL error: {df['error'].iloc[0]}")
    df = df.drop(columns=[c for c in ("name", "tags") if c in df.columns])
    for c in df.columns:
        if c in STRING_COLUMNS:
            df[c] = df[c].astype(object).where(df[c].notna() & (df[c] != ""), None)
    return df


def parse_json(body: bytes) -> pd.DataFrame:
    """InfluxDB's JSON answer as one frame (each series' tags as columns)."""
    data = json.loads(body or b"{}")
    if "error" in data:
        raise StoreError(f"InfluxQL error: {data['error']}")
    frames = []
    for res in data.get("results", []):
        if "error" in res:
            raise StoreError(f"InfluxQL error: {res['error']}")
        for s in res.get("series", []):
            f = pd.DataFrame(s.get("values", []), columns=s["columns"])
            for k, v in (s.get("tags") or {}).items():
                f[k] = v
            frames.append(f)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
