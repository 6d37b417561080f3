"""Embedded backend: a local SQLite file that serves the same reads as InfluxDB.

For newcomers and the demo: no server to run. Semantics follow InfluxDB's: a
point is keyed by (time, tag set); writing the same key again updates the
fields it carries and keeps the others. One table per measurement, columns
added as new tags and fields appear.

Retention: none. The embedded store keeps every point it is given (InfluxDB's ``raw`` and
``long`` policies, :class:`rankscope.config.Retention`, do not apply): it holds a demo or a
newcomer's few jobs, and a point written with a historical timestamp (a replayed scenario)
must read back. Delete the file to start over.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import numpy as np
import pandas as pd

from rankscope.store.base import INT_TAGS, Store, StoreError, check_tags, normalise_frame

_SERIES = "_series"


def _ident(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


class EmbeddedStore(Store):
    """A store in one SQLite file (``bucket`` names a namespace inside it)."""

    def __init__(self, path: str | Path = ".rankscope/store.db", bucket: str = "rankscope"):
        self.path = Path(path)
        self.bucket = bucket
        if str(path) != ":memory:":
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the folder of the embedded store {self.path}: {exc}") from exc
        try:
            # several processes (the ranks of one job) may open and write the same file:
            # wait for each other's locks instead of failing
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                       timeout=60)
            self._db.execute("PRAGMA busy_timeout=60000")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the embedded store {self.path}: {exc}") from exc
        self._lock = threading.Lock()
        self._columns: dict[str, dict[str, str]] = {}

    def __repr__(self) -> str:
        return f"EmbeddedStore(path={str(self.path)!r}, bucket={self.bucket!r})"

    def _table(self, measurement: str) -> str:
        return _ident(f"{self.bucket}/{measurement}")

    def _existing_columns(self, measurement: str) -> dict[str, str]:
        if measurement not in self._columns:
            rows = self._db.execute(f"PRAGMA table_info({self._table(measurement)})").fetchall()
            self._columns[measurement] = {r[1]: r[2] for r in rows}
        return self._columns[measurement]

    def _ensure_table(self, measurement: str, frame: pd.DataFrame, tags: list[str], fields: list[str]) -> None:
        cols = self._existing_columns(measurement)
        table = self._table(measurement)
        if not cols:
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (time INTEGER NOT NULL, {_SERIES} TEXT NOT NULL, "
                f"PRIMARY KEY (time, {_SERIES})) WITHOUT ROWID"
            )
            cols.update({"time": "INTEGER", _SERIES: "TEXT"})
        for c in [*tags, *fields]:
            if c in cols:
                continue
            kind = frame[c].to_numpy().dtype.kind
            sqltype = "TEXT" if c in tags else {"f": "REAL", "i": "INTEGER", "u": "INTEGER", "b": "INTEGER"}.get(kind, "TEXT")
            try:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {_ident(c)} {sqltype}")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):   # another process added it first
                    raise
            cols[c] = sqltype
            if c == "job":
                self._db.execute(f"CREATE INDEX IF NOT EXISTS {_ident(f'{self.bucket}/{measurement}/job_time')} "
                                 f"ON {table} (job, time)")

    def _write(self, measurement: str, frame: pd.DataFrame, tags: list[str], fields: list[str],
               nonnegative: list[str]) -> None:
        check_tags(frame, tags)  # the same names InfluxDB would refuse
        n = len(frame)
        tag_text = {t: frame[t].astype(str).to_numpy(dtype=object) for t in tags}
        series = np.full(n, "", dtype=object)
        for t in sorted(tags):
            series = series + ("," + t + "=") + tag_text[t]
        columns: list[str] = ["time", _SERIES, *tags, *fields]
        data: list[np.ndarray] = [frame["time"].to_numpy(dtype=np.int64).astype(object), series]
        data += [tag_text[t] for t in tags]
        for f in fields:
            col = frame[f]
            arr = col.to_numpy(dtype=object)
            mask = pd.isna(col).to_numpy()
            if mask.any():
                arr = arr.copy()
                arr[mask] = None
            kind = col.to_numpy().dtype.kind
            if kind == "b":
                arr = np.where(mask, None, col.to_numpy().astype(np.int64)).astype(object)
            data.append(arr)
        rows = list(zip(*[d.tolist() for d in data], strict=True))
        placeholders = ",".join("?" * len(columns))
        updates = ",".join(f"{_ident(c)}=COALESCE(excluded.{_ident(c)}, {_ident(c)})" for c in fields)
        sql = (f"INSERT INTO {self._table(measurement)} ({','.join(_ident(c) for c in columns)}) "
               f"VALUES ({placeholders}) ON CONFLICT(time, {_SERIES}) DO UPDATE SET {updates}")
        with self._lock:
            for attempt in (0, 1):
                try:
                    self._ensure_table(measurement, frame, tags, fields)
                    self._db.execute("BEGIN")
                    self._db.executemany(sql, rows)
                    self._db.execute("COMMIT")
                    break
                except sqlite3.Error as exc:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    # another process changed the table under us: re-read its columns once
                    self._columns.pop(measurement, None)
                    if attempt:
                        raise StoreError(f"embedded store {self.path}: write of {measurement} failed: {exc}") from exc

    def read(self, measurement, job=None, start_ms=None, end_ms=None, where=None) -> pd.DataFrame:
        with self._lock:
            cols = self._existing_columns(measurement)
            if not cols:
                self._columns.pop(measurement, None)
                return pd.DataFrame()
            conds, args = [], []
            filters = {**({"job": job} if job is not None else {}), **(where or {})}
            for k, v in filters.items():
                if v is None:   # the tag is absent
                    if k in cols:
                        conds.append(f"({_ident(k)} IS NULL OR {_ident(k)} = '')")
                    continue
                if k not in cols:
                    return pd.DataFrame()
                if isinstance(v, (list, tuple)):   # any of these values
                    if not v:
                        raise ValueError(f"where {k!r}: an empty list of values selects nothing")
                    conds.append(f"{_ident(k)} IN ({','.join('?' * len(v))})")
                    args += [str(x) for x in v]
                    continue
                conds.append(f"{_ident(k)} = ?")
                args.append(str(v))
            if start_ms is not None:
                conds.append("time >= ?")
                args.append(int(start_ms))
            if end_ms is not None:
                conds.append("time <= ?")
                args.append(int(end_ms))
            wanted = [c for c in cols if c != _SERIES]
            sql = f"SELECT {','.join(_ident(c) for c in wanted)} FROM {self._table(measurement)}"
            if conds:
                sql += " WHERE " + " AND ".join(conds)
            sql += " ORDER BY time"
            try:
                rows = self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"embedded store {self.path}: read of {measurement} failed: {exc}") from exc
        df = pd.DataFrame.from_records(rows, columns=wanted)
        for c, sqltype in cols.items():
            if c in df.columns and sqltype == "REAL":
                df[c] = df[c].astype(float)
        return normalise_frame(df)

    def _probe(self, measurement: str, job: str, before_ms: int | None = None) -> tuple[str, list]:
        """The extra condition that reads timestamps from one series, as the InfluxDB backend
        does: the rank of the job's latest point. Each rank stamps its own clock, so the
        distinct times of all ranks are thousands per iteration; one rank's are one each."""
        if "rank" not in self._existing_columns(measurement):
            return "", []
        row = self._db.execute(f"SELECT rank FROM {self._table(measurement)} WHERE job = ? AND time <= ? "
                               f"ORDER BY time DESC LIMIT 1", (job, 2**62 if before_ms is None else int(before_ms))).fetchone()
        return ("", []) if row is None else (" AND rank = ?", [row[0]])

    def latest_times(self, measurement: str, job: str, n: int, before_ms: int | None = None) -> list[int]:
        with self._lock:
            if "job" not in self._existing_columns(measurement):
                return []
            cond, args = self._probe(measurement, job, before_ms)
            rows = self._db.execute(
                f"SELECT DISTINCT time FROM {self._table(measurement)} WHERE job = ? AND time <= ?{cond} "
                f"ORDER BY time DESC LIMIT ?", (job, 2**62 if before_ms is None else int(before_ms), *args, int(n)),
            ).fetchall()
        return [int(r[0]) for r in rows]

    def next_times(self, measurement: str, job: str, after_ms: int | None, n: int) -> list[int]:
        with self._lock:
            if "job" not in self._existing_columns(measurement):
                return []
            cond, args = self._probe(measurement, job)
            rows = self._db.execute(
                f"SELECT DISTINCT time FROM {self._table(measurement)} WHERE job = ? AND time > ?{cond} "
                f"ORDER BY time LIMIT ?",
                (job, -(2**62) if after_ms is None else int(after_ms), *args, int(n)),
            ).fetchall()
        return [int(r[0]) for r in rows]

    def tag_values(self, measurement: str, key: str) -> list[str]:
        with self._lock:
            if key not in self._existing_columns(measurement):
                self._columns.pop(measurement, None)
                return []
            rows = self._db.execute(f"SELECT DISTINCT {_ident(key)} FROM {self._table(measurement)} "
                                    f"WHERE {_ident(key)} IS NOT NULL AND {_ident(key)} != ''").fetchall()
        return sorted(str(r[0]) for r in rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()


__all__ = ["EmbeddedStore", "INT_TAGS"]
