"""The stream path's intake: the points InfluxDB forwards to a subscriber, held for the readers.

InfluxDB 1.x forwards every write of a database to its subscriptions' destinations
(``CREATE SUBSCRIPTION ... DESTINATIONS ALL 'http://...'``: :mod:`analyzer.read.subscription`):
an HTTP ``POST /write?db=...&rp=...`` of line protocol, as the collector sent it. The
:class:`StreamEndpoint` (the shared intake of :mod:`rankscope.http_intake`, its credentials from
``RANKSCOPE_STREAM_TOKEN`` or ``RANKSCOPE_STREAM_USER``/``RANKSCOPE_STREAM_PASSWORD``; a
subscription carries basic auth as ``http://user:password@host:port``) appends each body to the
:class:`StreamFeed`, bounded by ``max_bytes``: over it a post is answered 503 and dropped, and the
feed remembers that it lost points, so every reader reads back once (the read path) and the
stream serves them again after that. Each cycle :meth:`StreamFeed.drain` parses what came
(:mod:`analyzer.read.line_protocol`, vectorised) and splits it by job; a job's reader takes its
rows (:meth:`StreamFeed.take`) as if it had read them.

What the feed covers: every point written after :attr:`StreamFeed.since` (the subscription's
creation, moved on whenever it is found missing and made again) with nothing lost since
:attr:`StreamFeed.lost_at`. A reader whose last read began after both is whole from the stream.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus

import pandas as pd

from analyzer.read.line_protocol import LineProtocolError, parse_points
from rankscope import schema
from rankscope.http_credentials import Credentials
from rankscope.http_intake import Reply
from rankscope.store.base import stage_latency_rows

log = logging.getLogger(__name__)

#: Environment variables of the credentials InfluxDB's subscription must present.
STREAM_ENV = ("RANKSCOPE_STREAM_TOKEN", "RANKSCOPE_STREAM_USER", "RANKSCOPE_STREAM_PASSWORD")
#: Bytes of posted bodies held until a cycle takes them (then posts are refused with 503).
MAX_HELD_BYTES = 512 * 1024 * 1024


@dataclass
class StreamCounts:
    """What came: posts taken, their bytes and lines, points parsed; posts refused as over the bound (503),
    as not line protocol or of another database (400)."""

    posts: int = 0
    bytes: int = 0
    lines: int = 0
    points: int = 0
    refused: int = 0
    bad: int = 0


class StreamFeed:
    """Bodies posted by InfluxDB's subscription, bounded, parsed once per cycle, by job."""

    def __init__(self, database: str, max_bytes: int = MAX_HELD_BYTES, measurement: str = schema.STAGE_LATENCY):
        self.database, self.max_bytes, self.measurement = database, int(max_bytes), measurement
        self.counts = StreamCounts()
        self.since: float | None = None      # wall time (s) from which every write comes
        self.lost_at: float | None = None    # wall time (s) of the last point lost
        self._lock = threading.Lock()
        self._bodies: list[tuple[bytes, str]] = []
        self._held = 0
        self._jobs: dict[str, list[pd.DataFrame]] = {}

    def started(self, at: float | None = None) -> None:
        """The subscription was (re)made: writes from now on come (a gap before it is read back)."""
        self.since = time.time() if at is None else at
        self.lost_at = self.since

    def lost(self, why: str) -> None:
        """Points were lost (refused, or dropped by InfluxDB's subscriber): every reader reads back."""
        self.lost_at = time.time()
        log.warning("stream: points lost (%s): the readers read back from the database once", why)

    def covers(self, read_at: float | None) -> bool:
        """Whether a reader whose last read began at ``read_at`` is whole from the stream."""
        return (read_at is not None and self.since is not None and self.since <= read_at
                and (self.lost_at is None or self.lost_at <= read_at))

    def post(self, body: bytes, params: Mapping[str, str]) -> Reply:
        """One post of the subscription: held, or refused (503 over the bound, 400 elsewise)."""
        db = params.get("db", self.database)
        if db != self.database:
            self.counts.bad += 1
            return Reply(HTTPStatus.BAD_REQUEST, {"error": f"database {db[:100]!r}: this feed takes {self.database!r}"})
        precision = params.get("precision", "ns") or "ns"
        with self._lock:
            if self._held + len(body) > self.max_bytes:
                self.counts.refused += 1
                refused = True
            else:
                self._bodies.append((body, precision))
                self._held += len(body)
                self.counts.posts += 1
                self.counts.bytes += len(body)
                self.counts.lines += body.count(b"\n") + (not body.endswith(b"\n"))
                refused = False
        if refused:
            self.lost("the analyzer is behind: a post over the held bound was refused with 503")
            return Reply(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the analyzer is behind; posts resume"})
        return Reply(HTTPStatus.NO_CONTENT, {})

    def drain(self, jobs: Sequence[str] | None = None) -> int:
        """Parse what was posted into each job's rows (``jobs``: only those; None: every job);
        the number of points. A body that is not line protocol is counted and dropped."""
        with self._lock:
            bodies, self._bodies, self._held = self._bodies, [], 0
        frames = []
        for precision in sorted({p for _, p in bodies}):
            blob = b"\n".join(b.rstrip(b"\n") for b, p in bodies if p == precision)
            try:
                frames.append(parse_points(blob, self.measurement, precision))
            except LineProtocolError as exc:
                self.counts.bad += 1
                self.lost(f"a body that is not line protocol: {exc}")
        frame = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else None
        if frame is None or "job" not in frame.columns:
            return 0
        self.counts.points += len(frame)
        wanted = None if jobs is None else set(jobs)
        for job, rows in frame.groupby("job", sort=False):
            if wanted is None or job in wanted:
                self._jobs.setdefault(str(job), []).append(rows.reset_index(drop=True))
        return len(frame)

    def take(self, job: str) -> pd.DataFrame:
        """The job's rows drained since it last took them, as a read of ``stage_latency`` gives them."""
        parts = self._jobs.pop(job, [])
        if not parts:
            return pd.DataFrame()
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        return stage_latency_rows(df)

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)


class StreamEndpoint:
    """The HTTP backend (:func:`rankscope.http_intake.make_server`) of a :class:`StreamFeed`."""

    paths = ("/write",)
    media_types = None   # InfluxDB's subscriber sends line protocol under whatever type

    def __init__(self, feed: StreamFeed, credentials: Credentials | None = None, max_body_bytes: int = 256 << 20):
        self.feed = feed
        self.credentials = credentials or Credentials()
        self.max_body_bytes = max_body_bytes

    def handle(self, path: str, body: bytes, peer: str = "-", principal: str = "-", query: str = "") -> Reply:
        params = dict(urllib.parse.parse_qsl(query))
        return self.feed.post(body, params)
