"""The retention layout of an InfluxDB database (docs/schema.md): which policies it has, which
one each measurement is written to and read from, and making them on 1.x.

Raw ``stage_latency`` lives in the database's default policy (``raw`` on databases the store
creates), everything else in the policy ``long``. On 1.x the store creates both with the
database and adds ``long`` to a database that lacks it; with a
:class:`~rankscope.config.Retention` it also sets their durations (and makes ``raw`` the
default), without one nothing expires. A database without ``long`` (made before it existed, or
a 2.x bucket nobody set up) is read and written as before, everything in its default policy.
"""

from __future__ import annotations

import logging
import re
import time

import pandas as pd

from rankscope import schema
from rankscope.config import LONG_POLICY, RAW_POLICY, Retention, policy_of
from rankscope.lineprotocol import quote_ident
from rankscope.store.base import StoreError
from rankscope.store.influx_answers import go_duration_s
from rankscope.store.influxql import named_policy

log = logging.getLogger("rankscope.store.influx")

#: How long "this database has no ``long`` policy" is believed before it is asked again.
LAYOUT_RECHECK_S = 60.0


class RetentionLayout:
    """The retention half of :class:`~rankscope.store.influx.InfluxStore` (a mixin): it uses
    the store's ``bucket``, ``api``, ``retention``, ``retention_policy``, ``query_raw`` and
    ``execute``."""

    bucket: str
    api: str
    retention: Retention | None
    retention_policy: str | None

    def _forget_layout(self, db_ready: bool = False) -> None:
        """Ask the database about its policies again at the next read or write."""
        self._db_ready = db_ready
        self._layout: frozenset[str] | None = None   # the database's retention policies
        self._layout_miss_at = -LAYOUT_RECHECK_S

    def _ensure_database(self) -> None:
        """1.x: the database with its policies ``raw`` (default) and ``long``; durations set
        when the store has a :class:`Retention`, INF for a database it creates without one."""
        if self._db_ready or self.api != "v1":
            return
        for attempt in (0, 1):
            try:
                self._ensure_policies()
                break
            except StoreError as exc:   # another writer created the same thing meanwhile
                if attempt or not any(w in str(exc) for w in ("already exists", "conflicts")):
                    raise
        self._forget_layout(db_ready=True)

    def retention_policies(self) -> dict[str, tuple[int, bool]] | None:
        """The database's retention policies: name -> (duration in seconds, 0 = INF; default?).
        None when the database does not exist."""
        try:
            df = self.query_raw(f"SHOW RETENTION POLICIES ON {quote_ident(self.bucket)}")
        except StoreError as exc:
            if "database not found" in str(exc):
                return None
            raise
        if not len(df) or "name" not in df.columns:
            return {}
        default = df["default"] if "default" in df.columns else pd.Series(False, index=df.index)
        duration = df["duration"] if "duration" in df.columns else pd.Series("0s", index=df.index)
        return {str(n): (go_duration_s(str(d)), bool(f)) for n, d, f in zip(df["name"], duration, default,
                                                                          strict=True)}

    def _ensure_policies(self) -> None:
        db = quote_ident(self.bucket)
        ret = self.retention
        literal = {RAW_POLICY: ret.duration(RAW_POLICY) if ret else "INF",
                   LONG_POLICY: ret.duration(LONG_POLICY) if ret else "INF"}
        have = self.retention_policies()
        created = have is None
        if created:
            self.execute(f"CREATE DATABASE {db} WITH DURATION {literal[RAW_POLICY]} REPLICATION 1 "
                         f"NAME {quote_ident(RAW_POLICY)}")
            have = {RAW_POLICY: (ret.seconds(RAW_POLICY) if ret else 0, True)}
        if LONG_POLICY not in have:
            if not created and ret is None:
                return   # a database made before the policies: read and written as before
            self.execute(f"CREATE RETENTION POLICY {quote_ident(LONG_POLICY)} ON {db} "
                         f"DURATION {literal[LONG_POLICY]} REPLICATION 1")
            have[LONG_POLICY] = (ret.seconds(LONG_POLICY) if ret else 0, False)
            if not created:
                self._move_history_to_long(have)
        if ret is None:
            return   # durations are the operator's (or INF on a database made here)
        if RAW_POLICY not in have:
            log.warning("database %s: raw points move from its default policy to the new policy %r "
                        "(%s); the points already in the old default stay there (docs/schema.md)",
                        self.bucket, RAW_POLICY, literal[RAW_POLICY])
            self.execute(f"CREATE RETENTION POLICY {quote_ident(RAW_POLICY)} ON {db} "
                         f"DURATION {literal[RAW_POLICY]} REPLICATION 1 DEFAULT")
            have[RAW_POLICY] = (ret.seconds(RAW_POLICY), True)
        for policy in (RAW_POLICY, LONG_POLICY):
            seconds, is_default = have[policy]
            changes = "" if seconds == ret.seconds(policy) else f" DURATION {literal[policy]}"
            if policy == RAW_POLICY and not is_default:
                changes += " DEFAULT"
            if changes:
                self.execute(f"ALTER RETENTION POLICY {quote_ident(policy)} ON {db}{changes}")

    def _move_history_to_long(self, have: dict[str, tuple[int, bool]]) -> None:
        """Copy what a database held before it had ``long`` (incidents, events, analyzer points)
        from its default policy into ``long``, which reads name from now on: the history stays
        visible. Raw points stay where they are (they expire there)."""
        default = next((n for n, (_, is_default) in have.items() if is_default), None)
        if default is None or default == LONG_POLICY:
            return
        names = [m for m in schema.MEASUREMENTS if policy_of(m) == LONG_POLICY]
        pattern = "|".join(re.escape(m) for m in names)
        log.warning("database %s: copying %s from policy %r into %r, where they are read from now on",
                    self.bucket, ", ".join(names), default, LONG_POLICY)
        try:
            self.execute(f"SELECT * INTO {quote_ident(self.bucket)}.{quote_ident(LONG_POLICY)}.:MEASUREMENT "
                         f"FROM {quote_ident(self.bucket)}.{quote_ident(default)}./^({pattern})$/ GROUP BY *")
        except StoreError as exc:
            if "beyond retention" not in str(exc):
                raise
            log.warning("database %s: points older than the long retention were not copied", self.bucket)

    def _policies(self) -> frozenset[str]:
        """Names of the database's retention policies (cached; a database without ``long`` is
        asked again after :data:`LAYOUT_RECHECK_S`)."""
        if self._layout is not None:
            return self._layout
        now = time.monotonic()
        if now - self._layout_miss_at < LAYOUT_RECHECK_S:
            return frozenset()
        try:
            have = self.retention_policies()
        except StoreError:
            if self.api == "v1":
                raise
            have = None   # a server that lists no policies (3.x): no layout
        names = frozenset(have or ())
        if LONG_POLICY in names:
            self._layout = names
        else:
            self._layout_miss_at = now
        return names

    def policy(self, measurement: str) -> str | None:
        """The retention policy ``measurement`` is written to and read from: the one
        :func:`~rankscope.store.influxql.named_policy` names, except ``long`` on a database
        without it; None: the database's default policy."""
        named = named_policy(measurement, self.retention_policy)
        if named != LONG_POLICY or self.retention_policy:
            return named
        if self.api == "v2" and self.retention is not None:
            return LONG_POLICY   # set up by the deployment (compose's influxdb-setup)
        return LONG_POLICY if LONG_POLICY in self._policies() else None
