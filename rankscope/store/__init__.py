"""The store interface and its two backends; :func:`open_store` picks one from settings."""

from __future__ import annotations

from pathlib import Path

from rankscope.config import StoreSettings, store_settings
from rankscope.store.base import (
    RejectedPointsError,
    Rejection,
    Store,
    StoreError,
    WriteReport,
)
from rankscope.store.embedded import EmbeddedStore
from rankscope.store.influx import InfluxStore


def open_store(store: str | None = None, bucket: str | None = None,
               settings: StoreSettings | None = None, *, timeout_s: float = 30.0,
               retries: int = 3, create: bool = True) -> Store:
    """An InfluxDB store for an http(s) URL, else an embedded store at that path.

    ``timeout_s`` and ``retries`` apply to InfluxDB requests (a writer with its own
    backoff passes ``retries=0``). ``create=False`` (commands that only read, or only
    write back results): a missing embedded store file is an error ("no store at ..."),
    not a new empty store, so a mistyped path does not look like a job without data.
    """
    s = settings or store_settings(store, bucket)
    if s.is_influx:
        return InfluxStore(s.location, s.bucket, token=s.token, org=s.org, username=s.username,
                           password=s.password, api=s.api, timeout_s=timeout_s, retries=retries,
                           retention=s.retention)
    if not create and s.location != ":memory:" and not Path(s.location).is_file():
        where = Path(s.location)
        others = sorted(where.parent.glob("*.db")) if where.parent.is_dir() else []
        hint = (f" (and no folder {where.parent})" if not where.parent.is_dir() else
                f" (stores there: {', '.join(str(o) for o in others[:5])})" if others else "")
        raise StoreError(f"no store at {s.location}{hint}: give --store (or RANKSCOPE_STORE) the path "
                         f"of an existing embedded store or an http(s):// InfluxDB URL")
    return EmbeddedStore(s.location, s.bucket)


__all__ = ["EmbeddedStore", "InfluxStore", "RejectedPointsError", "Rejection", "Store",
           "StoreError", "WriteReport", "open_store"]
