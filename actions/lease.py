"""One actor at a time, whatever runs: a lease held through the store.

Every analyzer replica of every shard runs the actor after its cycle (and a person may run
``rankscope act --enforce`` meanwhile); only the holder of the lease acts, on every job's
incidents, so the hourly budget and "one action per incident and node" hold cluster-wide.

A claim is an ``action_lease`` point: tag ``holder``, time = when its claim began, ``until_ms``
rewritten (the same point) each time it renews. The holder is the claimant whose claim began
earliest among those not expired; a claimant that lost never renews, so its claim lapses. A new
claim is written, then read back after ``settle_s`` (longer than the replicas' clock skew and a
write's way to the store), so two that claim at once agree on who won. A holder that misses its
renewal starts a new claim rather than reviving an expired one.

Example::

    >>> holder_of([Claim("a", 1_000, 5_000), Claim("b", 900, 1_500)], now_ms=2_000)
    'a'
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from rankscope import schema
from rankscope.store import Store

LEASE = "actions"


@dataclass(frozen=True)
class Claim:
    holder: str
    since_ms: int
    until_ms: int


def holder_of(claims: list[Claim], now_ms: int) -> str | None:
    """Who holds the lease at ``now_ms``: the earliest claim not expired (ties: by name)."""
    alive = [c for c in claims if c.until_ms > now_ms]
    return min(alive, key=lambda c: (c.since_ms, c.holder)).holder if alive else None


class StoreLease:
    """The lease of ``holder`` (a replica's name) for ``lease_s`` seconds at a time.

    Claims are read from the last :data:`WINDOW_MS`; a holder whose claim grows older than half
    of it starts a second one and renews both for two leases (every claim another made while it
    held has lapsed by then), then lets the old one go."""

    WINDOW_MS = 86_400_000

    def __init__(self, store: Store, holder: str, lease_s: float, settle_s: float = 1.0,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        self.store, self.holder, self.lease_s, self.settle_s = store, holder, lease_s, settle_s
        self.clock, self.sleep = clock, sleep
        self._chains: list[int] = []   # when our claims began (renewed while we hold)
        self._until = 0

    def claims(self, now_ms: int) -> list[Claim]:
        df = self.store.read(schema.ACTION_LEASE, None, now_ms - self.WINDOW_MS, None, where={"lease": LEASE})
        if not len(df) or "until_ms" not in df.columns:
            return []
        df = df.sort_values("time", kind="stable").drop_duplicates(["holder", "time"], keep="last")
        return [Claim(str(r["holder"]), int(r["time"]), int(r["until_ms"])) for r in df.to_dict("records")
                if r["until_ms"] == r["until_ms"]]

    def _write(self, since: list[int], until_ms: int) -> None:
        self.store.write_measurement(schema.ACTION_LEASE, pd.DataFrame(
            [{"time": s, "lease": LEASE, "holder": self.holder, "until_ms": int(until_ms)} for s in since]))

    def acquire(self) -> tuple[bool, str]:
        """Hold (or renew) the lease; ``(held, who holds it)``."""
        now = int(self.clock() * 1000)
        until = now + int(self.lease_s * 1000)
        who = holder_of(self.claims(now), now)
        if who == self.holder and self._chains and self._until > now:
            self._renew(now, until)
            return True, self.holder
        if who is not None and who != self.holder:
            self._chains = []
            return False, who
        self._chains, self._until = [now], until
        self._write([now], until)
        self.sleep(self.settle_s)
        now = int(self.clock() * 1000)
        who = holder_of(self.claims(now), now)
        if who != self.holder:
            self._chains = []
        return who == self.holder, who or "nobody"

    def _renew(self, now: int, until: int) -> None:
        if now - self._chains[0] > self.WINDOW_MS // 2 and len(self._chains) == 1:
            self._chains.append(now)                       # a fresh claim inside the window
        elif len(self._chains) > 1 and now - self._chains[-1] > 2 * self.lease_s * 1000:
            self._write(self._chains[:-1], now - 1)         # the old claim goes
            self._chains = self._chains[-1:]
        self._write(self._chains, until)
        self._until = until

    def release(self) -> None:
        """Give the lease up now (a clean stop), so that another replica need not wait for it."""
        if self._chains:
            self._write(self._chains, int(self.clock() * 1000) - 1)
            self._chains, self._until = [], 0
