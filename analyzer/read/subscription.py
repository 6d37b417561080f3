"""The InfluxDB 1.x subscription that forwards a database's writes to the analyzer's stream.

:meth:`Subscription.ensure` (every cycle) makes it when it is missing (the first start, a server
whose meta data was lost, someone who dropped it) and then tells the feed that writes come from
now on (the gap before is read back); it reads the server's own subscriber counts (``SHOW STATS``)
and tells the feed when the server failed to forward writes. :meth:`Subscription.drop` on a clean
exit. InfluxDB 2.x and 3.x have no subscriptions: there the read path is the only one.

Example (what it asks the server)::

    >>> Subscription.statement("rankscope_a", "metrics", "autogen", "http://10.0.0.5:9097")
    'CREATE SUBSCRIPTION "rankscope_a" ON "metrics"."autogen" DESTINATIONS ALL \\'http://10.0.0.5:9097\\''
"""

from __future__ import annotations

import logging

import pandas as pd

from analyzer.read.stream_feed import StreamFeed
from rankscope.store import Store, StoreError

log = logging.getLogger(__name__)


def _ident(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Subscription:
    """One named subscription of ``store``'s database to ``destination`` (``http://host:port``,
    with ``user:password@`` where the endpoint asks basic auth: never logged)."""

    def __init__(self, store: Store, feed: StreamFeed, destination: str, name: str = "rankscope",
                 policy: str | None = None):
        self.store, self.feed, self.destination, self.name = store, feed, destination, name
        self._policy = policy
        self._failures: int | None = None

    @property
    def policy(self) -> str:
        """The retention policy ``stage_latency`` is written to (its writes are what is forwarded)."""
        if self._policy is None:
            from rankscope import schema

            named = self.store.policy(schema.STAGE_LATENCY)
            if named is None:
                rps = self.store.retention_policies() or {}
                named = next((n for n, (_, default) in rps.items() if default), "autogen")
            self._policy = named
        return self._policy

    @staticmethod
    def statement(name: str, database: str, policy: str, destination: str) -> str:
        return (f"CREATE SUBSCRIPTION {_ident(name)} ON {_ident(database)}.{_ident(policy)} "
                f"DESTINATIONS ALL {_literal(destination)}")

    def _listed(self) -> pd.DataFrame:
        subs = self.store.query_raw("SHOW SUBSCRIPTIONS")
        if not len(subs) or "name" not in subs.columns:
            return subs.iloc[:0]
        mine = subs[subs["name"] == self.name]
        if "retention_policy" in mine.columns:
            mine = mine[mine["retention_policy"] == self.policy]
        return mine

    def exists(self) -> bool:
        """Whether the server has it, to this destination."""
        mine = self._listed()
        return bool(len(mine)) and ("destinations" not in mine.columns
                                    or mine["destinations"].astype(str).str.contains(self.destination, regex=False).any())

    def ensure(self) -> bool:
        """Make the subscription where it is missing; whether it was made. A server that cannot
        be asked leaves the feed as it is (its readers read back next time it can)."""
        try:
            self.store._ensure_database()   # noqa: SLF001 - the database the subscription is on
            made = not self.exists()
            if made and len(self._listed()):   # ours, to another destination (an analyzer before)
                self.drop()
            if made:
                self.store.execute(self.statement(self.name, self.store.bucket, self.policy, self.destination))
                self.feed.started()
                log.info("stream: subscription %s on %s made: writes come to the analyzer", self.name,
                         self.store.bucket)
            self._check_forwarding()
            return made
        except StoreError as exc:
            self.feed.lost(f"the subscription could not be checked: {exc}")
            return False

    def drop(self) -> None:
        """Drop the subscription (a clean exit): the server stops forwarding."""
        try:
            self.store.execute(f"DROP SUBSCRIPTION {_ident(self.name)} ON {_ident(self.store.bucket)}."
                               f"{_ident(self.policy)}")
        except StoreError as exc:
            log.warning("stream: subscription %s not dropped: %s", self.name, exc)

    def _check_forwarding(self) -> None:
        """The server's count of writes it failed to forward: a rise is points lost."""
        failures = subscriber_failures(self.store)
        if failures is None:
            return
        if self._failures is not None and failures > self._failures:
            self.feed.lost(f"InfluxDB's subscriber failed {failures - self._failures} write(s) to us")
        self._failures = failures


def subscriber_failures(store: Store) -> int | None:
    """InfluxDB's ``SHOW STATS FOR 'subscriber'`` count of failed forwards (None: not told)."""
    try:
        stats = store.query_raw("SHOW STATS FOR 'subscriber'")
    except StoreError:
        return None
    if not len(stats):
        return None
    cols = [c for c in stats.columns if c.lower() in ("writefailures", "writefailed")]
    return int(pd.to_numeric(stats[cols[0]], errors="coerce").fillna(0).sum()) if cols else None
