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

Retention (see :class:`Retention`; docs/schema.md): raw ``stage_latency`` is kept in the
policy ``raw``, everything else (rollups, analyzer outputs, events) in ``long``.
``RANKSCOPE_RETENTION=on`` has the store set their durations: ``RANKSCOPE_RAW_RETENTION``
(default ``7d``) and ``RANKSCOPE_LONG_RETENTION`` (default ``400d``); giving one of the two
durations turns it on too, ``RANKSCOPE_RETENTION=off`` keeps it off. Off (the default outside
the compose stack), the policies exist but nothing expires, so scenarios replayed with
historical timestamps are kept.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from rankscope import schema

DEFAULT_STORE = ".rankscope/store.db"
DEFAULT_BUCKET = "rankscope"

#: The retention policy of raw points (InfluxDB 1.x: the database's default policy; 2.x/3.x:
#: the bucket/database ``<bucket>`` itself).
RAW_POLICY = "raw"
#: The retention policy of rollups, analyzer outputs and events (1.x: policy ``long``; 2.x/3.x:
#: the bucket/database ``<bucket>/long``, which InfluxQL reads as database ``<bucket>``,
#: retention policy ``long``).
LONG_POLICY = "long"
#: Measurements kept only for the raw retention; every other one is kept long.
RAW_MEASUREMENTS = frozenset({schema.STAGE_LATENCY, schema.KERNEL_STATS, schema.GPU_HEALTH})
DEFAULT_RAW_RETENTION = "7d"
DEFAULT_LONG_RETENTION = "400d"
#: Shortest retention InfluxDB 1.x accepts.
MIN_RETENTION_S = 3600
_DURATION = re.compile(r"(\d+)(m|h|d|w)")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 604800}


def policy_of(measurement: str) -> str:
    """The retention policy ``measurement`` is written to and read from."""
    return RAW_POLICY if measurement in RAW_MEASUREMENTS else LONG_POLICY


def duration_s(text: str) -> int:
    """An InfluxQL duration (``7d``, ``168h``, ``2w``, ``INF``) in seconds; 0 is INF."""
    t = text.strip()
    if t.upper() == "INF":
        return 0
    m = _DURATION.fullmatch(t)
    if not m:
        raise ValueError(f"retention {text!r}: expected a duration such as 7d, 168h, 2w or INF")
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds < MIN_RETENTION_S:
        raise ValueError(f"retention {text!r}: InfluxDB keeps points at least 1h (or INF)")
    return seconds


@dataclass(frozen=True)
class Retention:
    """How long the store keeps raw points and everything else (durations as InfluxQL writes
    them: ``7d``, ``400d``, ``INF``)."""

    raw: str = DEFAULT_RAW_RETENTION
    long: str = DEFAULT_LONG_RETENTION

    def __post_init__(self) -> None:
        raw, long = duration_s(self.raw), duration_s(self.long)
        if long and (not raw or long < raw):   # INF raw needs INF long
            raise ValueError(f"the long retention ({self.long}) is shorter than the raw one ({self.raw})")

    def seconds(self, policy: str) -> int:
        """The duration of ``policy`` in seconds (0: INF)."""
        return duration_s(self.raw if policy == RAW_POLICY else self.long)

    def duration(self, policy: str) -> str:
        """The InfluxQL duration literal of ``policy``."""
        text = (self.raw if policy == RAW_POLICY else self.long).strip()
        return "INF" if text.upper() == "INF" else text


def retention_settings(env: Mapping[str, str]) -> Retention | None:
    """The retention the store sets, from ``RANKSCOPE_RETENTION``, ``RANKSCOPE_RAW_RETENTION`` and
    ``RANKSCOPE_LONG_RETENTION``; None: the store sets no duration (nothing expires)."""
    mode = (env.get("RANKSCOPE_RETENTION") or "").strip().lower()
    raw, long = env.get("RANKSCOPE_RAW_RETENTION") or None, env.get("RANKSCOPE_LONG_RETENTION") or None
    if mode not in ("", "on", "off"):
        raise ValueError(f"RANKSCOPE_RETENTION must be on or off, got {mode!r}")
    if mode == "off" or (mode == "" and raw is None and long is None):
        return None
    return Retention(raw or DEFAULT_RAW_RETENTION, long or DEFAULT_LONG_RETENTION)


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
    retention: Retention | None = field(default=None)

    @property
    def is_influx(self) -> bool:
        return self.location.startswith(("http://", "https://"))

    def __repr__(self) -> str:
        return (f"StoreSettings(location={self.location!r}, bucket={self.bucket!r}, api={self.api!r}, "
                f"org={self.org!r}, username={self.username!r}, token={'***' if self.token else None}, "
                f"password={'***' if self.password else None}, retention={self.retention!r})")


def store_settings(store: str | None = None, bucket: str | None = None,
                   env: Mapping[str, str] | None = None) -> StoreSettings:
    """Options win over the environment, the environment over the defaults."""
    env = os.environ if env is None else env
    api = env.get("RANKSCOPE_INFLUX_API", "auto")
    if api not in ("auto", "v1", "v2"):
        raise ValueError(f"RANKSCOPE_INFLUX_API must be auto, v1 or v2, got {api!r}")
    location = store or env.get("RANKSCOPE_STORE") or DEFAULT_STORE
    if "://" in location and not location.startswith(("http://", "https://")):
        raise ValueError(f"store {location!r} looks like a URL but is not http:// or https:// "
                         f"(an InfluxDB URL), nor the path of an embedded store")
    return StoreSettings(
        location=location,
        bucket=bucket or env.get("RANKSCOPE_BUCKET") or DEFAULT_BUCKET,
        api=api,
        org=env.get("INFLUXDB_V2_ORG") or None,
        token=env.get("INFLUXDB_V2_TOKEN") or None,
        username=env.get("INFLUXDB_V1_USERNAME") or None,
        password=env.get("INFLUXDB_V1_PASSWORD") or None,
        retention=retention_settings(env),
    )
