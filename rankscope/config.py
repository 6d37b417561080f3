"""Where the store is and who we are to it, from command-line options and the environment.

Every command takes ``--store`` (env ``RANKSCOPE_STORE``): an ``http://`` or
``https://`` URL selects InfluxDB, anything else is the path of an embedded
store (default ``.rankscope/store.db``); and ``--bucket`` (env
``RANKSCOPE_BUCKET``, default ``rankscope``): the bucket on InfluxDB 2.x/3.x,
the database on 1.x.

Credentials are read from the environment only, never from the command line
(where ``ps`` and shell history would show them):

- InfluxDB 2.x / 3.x: ``INFLUXDB_V2_TOKEN``, ``INFLUXDB_V2_ORG`` (influxdb-client's names);
- InfluxDB 1.x: ``INFLUXDB_V1_USERNAME``, ``INFLUXDB_V1_PASSWORD``;
- ``RANKSCOPE_INFLUX_API`` = ``auto`` (default, from ``/ping``), ``v1`` or ``v2``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_STORE = ".rankscope/store.db"
DEFAULT_BUCKET = "rankscope"


@dataclass(frozen=True)
class StoreSettings:
    """Resolved store location. ``token`` and ``password`` are kept out of ``repr``."""

    location: str
    bucket: str
    api: str = "auto"
    org: str | None = None
    username: str | None = None
    token: str | None = None
    password: str | None = None

    @property
    def is_influx(self) -> bool:
        return self.location.startswith(("http://", "https://"))

    def __repr__(self) -> str:
        return (f"StoreSettings(location={self.location!r}, bucket={self.bucket!r}, api={self.api!r}, "
                f"org={self.org!r}, username={self.username!r}, token={'***' if self.token else None}, "
                f"password={'***' if self.password else None})")


def store_settings(store: str | None = None, bucket: str | None = None,
                   env: Mapping[str, str] | None = None) -> StoreSettings:
    """Options win over the environment, the environment over the defaults."""
    env = os.environ if env is None else env
    api = env.get("RANKSCOPE_INFLUX_API", "auto")
    if api not in ("auto", "v1", "v2"):
        raise ValueError(f"RANKSCOPE_INFLUX_API must be auto, v1 or v2, got {api!r}")
    return StoreSettings(
        location=store or env.get("RANKSCOPE_STORE") or DEFAULT_STORE,
        bucket=bucket or env.get("RANKSCOPE_BUCKET") or DEFAULT_BUCKET,
        api=api,
        org=env.get("INFLUXDB_V2_ORG") or None,
        token=env.get("INFLUXDB_V2_TOKEN") or None,
        username=env.get("INFLUXDB_V1_USERNAME") or None,
        password=env.get("INFLUXDB_V1_PASSWORD") or None,
    )
