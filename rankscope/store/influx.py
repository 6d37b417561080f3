"""InfluxDB backend: line protocol out, InfluxQL in.

Writes go through influxdb-client's WriteApi (``/api/v2/write``: token, org,
bucket, retries) on servers with the v2 API (InfluxDB 2.x, 3.x), and through
``/write`` (database, retention policy, basic auth) on 1.x. Which one is
picked from the ``X-Influxdb-Version`` header of ``/ping``; ``api="v1"`` or
``"v2"`` overrides it. Reads are InfluxQL over ``/query`` on every version
(2.x maps the bucket through a (virtual) DBRP mapping, 3.x serves it natively).

Credentials come from the environment (see :func:`rankscope.config.influx_settings`);
they are never logged and never part of ``repr``.

Retention (docs/schema.md): raw ``stage_latency`` lives in the database's default policy,
everything else in the policy ``long``; :mod:`rankscope.store.influx_retention` makes and finds
them. Writes name the policy (``/write?rp=``; on 2.x/3.x the bucket ``<bucket>/long``), reads
name it in FROM (``"long"."incident"``, built by :mod:`rankscope.store.influxql`).
"""

from __future__ import annotations

import base64
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

import pandas as pd

from rankscope import schema
from rankscope.config import Retention
from rankscope.lineprotocol import encode_frame, quote_ident
from rankscope.store.base import Store, StoreError, normalise_frame
from rankscope.store.influx_answers import parse_csv, parse_json, raise_statement_error
from rankscope.store.influx_retention import RetentionLayout
from rankscope.store.influxql import from_clause, where_clause
from rankscope.store.prefix_cache import PrefixCache

log = logging.getLogger(__name__)

#: Points per HTTP write request.
WRITE_BATCH = 10_000
_BEYOND_RETENTION = re.compile(r"points beyond retention policy dropped=(\d+)")


class InfluxStore(RetentionLayout, Store):
    """A store on an InfluxDB server.

    Parameters
    ----------
    url: base URL, e.g. ``http://127.0.0.1:8086``.
    bucket: bucket on 2.x/3.x, database on 1.x (created on 1.x when missing).
    token, org: v2 credentials (``INFLUXDB_V2_TOKEN``, ``INFLUXDB_V2_ORG``).
    username, password: v1 credentials (``INFLUXDB_V1_USERNAME``, ``INFLUXDB_V1_PASSWORD``).
    api: ``"auto"`` (from ``/ping``), ``"v1"`` or ``"v2"``.
    retention_policy: one v1 retention policy for every write and read (default: each
        measurement's own, see the module docstring).
    retention: the durations the store sets (1.x) or relies on (2.x/3.x); None: none set.
    timeout_s: per request.
    retries: attempts for a failed write (with backoff) before giving up.
    """

    def __init__(
        self,
        url: str,
        bucket: str = "rankscope",
        token: str | None = None,
        org: str | None = None,
        username: str | None = None,
        password: str | None = None,
        api: str = "auto",
        retention_policy: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        retention: Retention | None = None,
    ):
        if api not in ("auto", "v1", "v2"):
            raise ValueError(f"api must be auto, v1 or v2, got {api!r}")
        self.url = url.rstrip("/")
        self.bucket = bucket
        self.org = org
        self.retention_policy = retention_policy
        self.retention = retention
        self.timeout_s = timeout_s
        # (measurement, job) -> the probe series' tags: finding it looks at every series'
        # newest point (6-7 s at 100,000 ranks on 1.6.7), so reads of a backlog reuse it
        self._probes: dict[tuple[str, str], dict[str, str]] = {}
        self.retries = retries
        self._token = token
        self._username = username
        self._password = password
        self._api = api
        self._forget_layout()
        self._client = None
        self._write_api = None
        self._prefixes = PrefixCache()

    def __repr__(self) -> str:
        return f"InfluxStore(url={self.url!r}, bucket={self.bucket!r}, api={self._api!r})"

    # ------------------------------------------------------------- plumbing
    @property
    def api(self) -> str:
        if self._api == "auto":
            self._api = self._detect_api()
        return self._api

    def ping(self) -> str:
        """The server's version string (raises StoreError when it does not answer)."""
        try:
            with urllib.request.urlopen(self.url + "/ping", timeout=self.timeout_s) as resp:
                return resp.headers.get("X-Influxdb-Version", "") or ""
        except (urllib.error.URLError, OSError) as exc:
            raise StoreError(f"InfluxDB at {self.url} does not answer /ping: {exc}") from exc

    def _detect_api(self) -> str:
        version = self.ping().lstrip("v")
        major = version.split(".", 1)[0]
        api = "v1" if major in ("0", "1") else "v2"
        log.info("InfluxDB %s at %s: using the %s write API", version or "?", self.url, api)
        return api

    def _headers(self) -> dict[str, str]:
        h: dict[str, str] = {}
        if self.api == "v2" and self._token:
            h["Authorization"] = f"Token {self._token}"
        elif self._username is not None:
            raw = f"{self._username}:{self._password or ''}".encode()
            h["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        return h

    def _request(self, path: str, params: dict[str, str], body: bytes | None = None,
                 headers: dict[str, str] | None = None, method: str = "POST") -> tuple[int, bytes, str]:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        req = urllib.request.Request(url, data=body, method=method, headers={**self._headers(), **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise StoreError(f"InfluxDB {path} answered {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise StoreError(f"InfluxDB at {self.url} unreachable ({path}): {exc}") from exc

    def query_raw(self, q: str, accept_csv: bool = False) -> pd.DataFrame:
        """Run one InfluxQL statement; the result of its first series set as a frame.

        Times are epoch ms. Asks for CSV (fast to parse) and falls back to JSON
        when the server answers JSON.
        """
        params = {"db": self.bucket, "q": q, "epoch": "ms"}
        if self.retention_policy:
            params["rp"] = self.retention_policy
        headers = {"Accept": "application/csv"} if accept_csv else {}
        _, body, ctype = self._request("/query", params, headers=headers)
        if "csv" in ctype:
            return parse_csv(body)
        return parse_json(body)

    def execute(self, q: str) -> None:
        """Run a statement that returns no rows (CREATE DATABASE, DROP ...)."""
        _, body, _ = self._request("/query", {"q": q, "db": self.bucket})
        raise_statement_error(body)

    # --------------------------------------------------------------- writes
    def source(self, measurement: str) -> str:
        """``"long"."incident"`` or ``"stage_latency"``: the InfluxQL FROM of ``measurement``."""
        return from_clause(measurement, self.policy(measurement))

    def write_lines(self, lines: Sequence[str], policy: str | None = None) -> None:
        """Send encoded line protocol (ms precision) in batches of ``WRITE_BATCH``, into
        ``policy`` (None: the store's ``retention_policy``, else the database's default).

        Points older than the policy's duration are dropped by InfluxDB; the rest of the
        batch is written and a :class:`StoreError` says how many were dropped."""
        if not lines:
            return
        self._ensure_database()
        policy = policy or self.retention_policy
        dropped = 0
        for i in range(0, len(lines), WRITE_BATCH):
            chunk = lines[i:i + WRITE_BATCH]
            if self.api == "v2":   # (retention_policy is a 1.x setting: the bucket stays)
                routed = policy and not self.retention_policy
                self._write_v2(chunk, f"{self.bucket}/{policy}" if routed else self.bucket)
            else:
                dropped += self._write_v1("\n".join(chunk).encode(), policy)
        if dropped:
            where = f"policy {policy!r}" if policy else "the default policy"
            raise StoreError(f"InfluxDB dropped {dropped} point(s) older than the retention of {where} of "
                             f"database {self.bucket!r} (the others were written)")

    def _write_v1(self, body: bytes, policy: str | None = None) -> int:
        """Write one batch; the number of points InfluxDB dropped as older than the policy."""
        params = {"db": self.bucket, "precision": "ms"}
        if policy:
            params["rp"] = policy
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                self._request("/write", params, body, {"Content-Type": "text/plain; charset=utf-8"})
                return 0
            except StoreError as exc:
                beyond = _BEYOND_RETENTION.search(str(exc))
                if beyond:
                    return int(beyond.group(1))
                # 4xx is the data's fault (no use retrying); anything else may pass.
                if " answered 4" in str(exc) or attempt == self.retries:
                    raise
                log.warning("write failed (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay *= 2
        return 0

    def _write_v2(self, lines: Sequence[str], bucket: str) -> None:
        from influxdb_client import InfluxDBClient, WritePrecision
        from influxdb_client.client.write_api import SYNCHRONOUS
        from urllib3 import Retry

        if self._write_api is None:
            self._client = InfluxDBClient(
                url=self.url, token=self._token or "", org=self.org or "-",
                timeout=int(self.timeout_s * 1000),
                retries=Retry(total=self.retries, backoff_factor=0.5,
                              status_forcelist=(429, 500, 502, 503, 504), allowed_methods=None),
            )
            self._write_api = self._client.write_api(write_options=SYNCHRONOUS)
        try:
            self._write_api.write(bucket=bucket, org=self.org or "-", record=list(lines),
                                  write_precision=WritePrecision.MS)
        except Exception as exc:  # the client raises ApiException, urllib3 errors, ...
            status = getattr(exc, "status", None)
            reason = getattr(exc, "body", None) or getattr(exc, "reason", None) or exc
            raise StoreError(f"InfluxDB /api/v2/write failed ({status}): {reason}") from None

    def _write(self, measurement: str, frame: pd.DataFrame, tags: list[str], fields: list[str],
               nonnegative: list[str]) -> None:
        # tag prefixes from the cache (a rank's tags rarely change); every tag value is
        # checked when first encoded, so nothing is sent when one cannot be carried
        prefixes = self._prefixes.prefixes(measurement, frame[tags])
        lines = encode_frame(measurement, frame, tags, fields, prefixes=prefixes, nonnegative=nonnegative)
        self._ensure_database()
        self.write_lines(lines, self.policy(measurement))

    # ---------------------------------------------------------------- reads
    def read(self, measurement, job=None, start_ms=None, end_ms=None, where=None) -> pd.DataFrame:
        q = f"SELECT * FROM {self.source(measurement)}{where_clause(job, start_ms, end_ms, where)}"
        try:
            # CSV parses several times faster; its header names columns ``name`` and
            # ``tags``, so it is used only where no tag or field is called that.
            df = self.query_raw(q, accept_csv=measurement == schema.STAGE_LATENCY)
        except StoreError as exc:
            if "database not found" in str(exc):
                return pd.DataFrame()
            raise
        return normalise_frame(df)

    def read_sampled(self, measurement, job, start_ms, end_ms, every_ms, where=None) -> pd.DataFrame:
        q = (f"SELECT last(*) FROM {self.source(measurement)}{where_clause(job, start_ms, end_ms, where)} "
             f"GROUP BY time({max(1, int(every_ms))}ms), * fill(none)")
        try:
            df = self.query_raw(q)
        except StoreError as exc:
            if "database not found" in str(exc):
                return pd.DataFrame()
            raise
        df = df.rename(columns={c: c[len("last_"):] for c in df.columns if c.startswith("last_")})
        return normalise_frame(df)

    def _probe(self, measurement: str, job: str, before_ms: int | None = None) -> dict[str, str] | None:
        """The tag filter of one series to read timestamps from: the rank of the job's latest
        point (at or before ``before_ms``: a rank that joined later has none of the times asked
        for), so a timestamp query touches one series, not 12,960.
        None when the job (or the database) has no point; ``{}`` when points carry no rank.

        It looks at the newest point of every series of the job: for ``stage_latency`` one
        field of each (``iteration``) and the rank, not all of them (InfluxDB's cost grows with
        series times fields: 0.9 s, not 6 s, at 100,000 ranks)."""
        what = f"{quote_ident(schema.ITERATION_FIELD)}, {quote_ident('rank')}" \
            if measurement == schema.STAGE_LATENCY else "*"
        try:
            last = self.query_raw(f"SELECT {what} FROM {self.source(measurement)}"
                                  f"{where_clause(job, None, before_ms, None)} ORDER BY time DESC LIMIT 1")
        except StoreError as exc:
            if "database not found" in str(exc):
                return None
            raise
        if not len(last):
            return None
        if "rank" not in last.columns or pd.isna(last["rank"].iloc[0]) or last["rank"].iloc[0] == "":
            return {}
        return {"rank": str(last["rank"].iloc[0])}

    def latest_times(self, measurement: str, job: str, n: int, before_ms: int | None = None) -> list[int]:
        probe = self._probe(measurement, job, before_ms)   # a rank with points by then
        if probe is None:
            return []
        df = self.query_raw(f"SELECT * FROM {self.source(measurement)}{where_clause(job, None, before_ms, probe)} "
                            f"ORDER BY time DESC LIMIT {int(n)}")
        return sorted({int(t) for t in df["time"]}, reverse=True) if len(df) else []

    def next_times(self, measurement: str, job: str, after_ms: int | None, n: int) -> list[int]:
        """Distinct timestamps after ``after_ms``, oldest first, read from the probe series.

        The probe found last time is tried first; when it gives fewer than ``n`` times (the
        tail, or its rank stopped reporting) the probe is looked for again."""
        start = None if after_ms is None else int(after_ms) + 1
        cached = self._probes.get((measurement, job))
        if cached is not None:
            times = self._times(measurement, job, start, cached, n)
            if len(times) >= n:
                return times
        probe = self._probe(measurement, job)
        if probe is None:
            self._probes.pop((measurement, job), None)
            return []
        self._probes[(measurement, job)] = probe
        return self._times(measurement, job, start, probe, n)

    def _times(self, measurement: str, job: str, start: int | None, probe: dict[str, str], n: int) -> list[int]:
        try:
            df = self.query_raw(f"SELECT * FROM {self.source(measurement)}{where_clause(job, start, None, probe)} "
                                f"ORDER BY time ASC LIMIT {int(n)}")
        except StoreError as exc:
            if "database not found" in str(exc):
                return []
            raise
        return sorted({int(t) for t in df["time"]}) if len(df) else []

    def tag_values(self, measurement: str, key: str) -> list[str]:
        try:
            # through the measurement's policy: on 2.x/3.x a policy is a bucket of its own
            df = self.query_raw(f"SHOW TAG VALUES FROM {self.source(measurement)} WITH KEY = {quote_ident(key)}")
        except StoreError as exc:
            if "database not found" in str(exc):
                return []
            raise
        return sorted(df["value"].astype(str).tolist()) if len(df) else []

    def drop_database(self) -> None:
        """Drop the 1.x database (tests)."""
        self.execute(f"DROP DATABASE {quote_ident(self.bucket)}")
        self._forget_layout()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
            self._write_api = None

