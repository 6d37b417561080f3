"""The store interface and its two backends; :func:`open_store` picks one from settings."""

from __future__ import annotations

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
               settings: StoreSettings | None = None) -> Store:
    """An InfluxDB store for an http(s) URL, else an embedded store at that path."""
    s = settings or store_settings(store, bucket)
    if s.is_influx:
        return InfluxStore(s.location, s.bucket, token=s.token, org=s.org, username=s.username,
                           password=s.password, api=s.api)
    return EmbeddedStore(s.location, s.bucket)


__all__ = ["EmbeddedStore", "InfluxStore", "RejectedPointsError", "Rejection", "Store",
           "StoreError", "WriteReport", "open_store"]
