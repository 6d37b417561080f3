"""A job's out-of-band events in memory, bounded per host by relevance and time.

Keeping "the newest N events" let a monitor gone mad on machines outside the job push out the
one event that mattered (12,000 junk alerts evicted IL-0477's "server port down" line). Here:

- each host of the job (its topology's host names, matched as
  :func:`~rankscope.hostnames.same_host` does: case and domain folded) has its own shelf of
  at most :data:`EVENTS_PER_HOST` events, the newest by start time: only that host's own
  events can push one of them out;
- every other event (hosts outside the job, events naming only a node or rank, and all of
  them while the job's hosts are not known) shares :data:`OTHER_EVENTS` places, in fair
  shares per host: when they are full, the host holding the most loses its oldest, so one
  noisy machine cannot push out the others' events either.

Memory is bounded by ``hosts x EVENTS_PER_HOST + OTHER_EVENTS`` events; the book also drops
events older than any incident can use (:meth:`EventShelf.forget_before`).
"""

from __future__ import annotations

from collections.abc import Iterable

from analyzer.diagnosis.event_verdicts import OutOfBandEvent
from rankscope.hostnames import same_host

#: Most events kept per host of the job (its newest by start time).
EVENTS_PER_HOST = 256
#: Most events kept on all other hosts together (and on none), shared fairly per host.
OTHER_EVENTS = 10_000

Bucket = dict[tuple, OutOfBandEvent]


def _canonical(name: str) -> str:
    return name.strip().rstrip(".").lower()


class EventShelf:
    """Out-of-band events by host: the job's hosts apart, every other machine sharing the rest."""

    def __init__(self, hosts: Iterable[str] = (), per_host: int = EVENTS_PER_HOST,
                 others: int = OTHER_EVENTS):
        if per_host < 1 or others < 1:
            raise ValueError("the event bounds must be positive")
        self.per_host, self.others = per_host, others
        self._own: dict[str, Bucket] = {}     # a job host's canonical name -> its events by key
        self._other: dict[str, Bucket] = {}   # any other host (or node/rank) -> its events
        self._exact: set[str] = set()
        self._short: dict[str, list[str]] = {}
        self._sorted: list[OutOfBandEvent] | None = None
        self.set_hosts(hosts)

    # ------------------------------------------------------------------ hosts
    def set_hosts(self, hosts: Iterable[str]) -> None:
        """The job's host names; the events held are sorted onto the shelves again."""
        names = {_canonical(h) for h in hosts if isinstance(h, str) and h.strip()}
        self._exact = names
        self._short = {}
        for name in sorted(names):
            self._short.setdefault(name.split(".", 1)[0], []).append(name)
        held = self.events()
        self._own, self._other, self._sorted = {}, {}, None
        self.add(held)

    def job_host(self, host: str) -> str | None:
        """The job's host that ``host`` names (canonical), or None: another machine."""
        name = _canonical(host)
        if name in self._exact:
            return name
        for candidate in self._short.get(name.split(".", 1)[0], ()):
            if same_host(name, candidate):
                return candidate
        return None

    def _shelf_of(self, e: OutOfBandEvent) -> tuple[str | None, str]:
        """(the job host it is about or None, the key of its shelf)."""
        own = self.job_host(e.host) if e.host else None
        if own is not None:
            return own, own
        return None, _canonical(e.host) if e.host else f"node {e.node} rank {e.rank}"

    # ----------------------------------------------------------------- events
    def add(self, events: Iterable[OutOfBandEvent]) -> None:
        """New events; a newer read of a known event (same key) replaces it. Then each
        shelf is cut back to its bound."""
        own_touched: set[str] = set()
        changed = False
        for e in events:
            own, where = self._shelf_of(e)
            shelves = self._other if own is None else self._own
            shelves.setdefault(where, {})[e.key] = e
            if own is not None:
                own_touched.add(own)
            changed = True
        if not changed:
            return
        self._sorted = None
        for host in own_touched:
            _keep_newest(self._own[host], self.per_host)
        self._share_others()

    def _share_others(self) -> None:
        """Cut the other hosts' events to :attr:`others` in fair shares: a cap ``c`` per
        host such that the kept events fit, the places left over going to the hosts whose next
        event is the newest."""
        sizes = sorted(len(b) for b in self._other.values())
        if sum(sizes) <= self.others:
            return
        room, cap = self.others, 0
        for i, n in enumerate(sizes):
            left = len(sizes) - i
            if n * left > room:
                cap = room // left
                break
            room -= n
        extra = self.others - sum(min(n, cap) for n in sizes)
        over = [b for b in self._other.values() if len(b) > cap]
        next_in_line = sorted(over, key=lambda b: _newest(b, cap + 1), reverse=True)
        for k, bucket in enumerate(next_in_line):
            _keep_newest(bucket, cap + 1 if k < extra else cap)
        self._other = {h: b for h, b in self._other.items() if b}

    def forget_before(self, cutoff_ms: int) -> None:
        """Drop events that started before ``cutoff_ms``."""
        dropped = False
        for shelves in (self._own, self._other):
            for host in list(shelves):
                bucket = shelves[host]
                old = [k for k, e in bucket.items() if e.time_ms < cutoff_ms]
                for k in old:
                    del bucket[k]
                dropped = dropped or bool(old)
                if not bucket:
                    del shelves[host]
        if dropped:
            self._sorted = None

    def events(self) -> list[OutOfBandEvent]:
        """Every event held, oldest first (cached until the next change)."""
        if self._sorted is None:
            held = [e for shelves in (self._own, self._other) for b in shelves.values() for e in b.values()]
            self._sorted = sorted(held, key=_order)
        return list(self._sorted)

    def __len__(self) -> int:
        return sum(len(b) for shelves in (self._own, self._other) for b in shelves.values())

    def counts(self) -> tuple[int, int]:
        """(events on the job's hosts, events elsewhere)."""
        return (sum(len(b) for b in self._own.values()), sum(len(b) for b in self._other.values()))


def _order(e: OutOfBandEvent) -> tuple:
    return (e.time_ms, e.name, e.host, e.node, e.rank, e.source)


def _newest(bucket: Bucket, n: int) -> tuple:
    """The order key of the ``n``-th newest event of ``bucket``."""
    return sorted((_order(e) for e in bucket.values()), reverse=True)[n - 1]


def _keep_newest(bucket: Bucket, n: int) -> None:
    """Cut ``bucket`` to its ``n`` newest events (by start time), in place."""
    if len(bucket) <= n:
        return
    ordered = sorted(bucket.items(), key=lambda kv: _order(kv[1]), reverse=True)
    for key, _ in ordered[n:]:
        del bucket[key]
