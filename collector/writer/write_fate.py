"""What a failed write means for the points of its batch.

The background writer must count every point once: written, rejected, dropped or
unconfirmed. A write that raised leaves its batch in one of four states:

- ``NOT_STORED``: the server surely did not store it: the request never reached it
  (connection refused, name not resolved) or it answered that it would not (401, 403,
  404: credentials or database, not the data). Retrying is safe.
- ``UNKNOWN``: the request may have reached the server (a timeout, a reset, a 5xx
  answer). InfluxDB may apply it later. Retrying is still safe: a point rewritten
  with the same measurement, tags and timestamp replaces itself, it is not added twice.
- ``REFUSED``: the data's fault, nothing of it stored (a tag value line protocol
  cannot carry, a 400, 413 or 422 answer). Retrying would fail the same way.
- ``PARTIAL``: the server stored some points and refused a known number (older than
  the retention policy, a field type conflict). Retrying would fail the same way.
"""

from __future__ import annotations

import enum
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from rankscope.store import StoreError

_ANSWERED = re.compile(r" answered (\d{3})")
_BEYOND_RETENTION = re.compile(r"dropped (\d+) point\(s\) older than the retention")
_PARTIAL = re.compile(r"partial write.*?dropped=(\d+)", re.DOTALL)
#: answers that blame the data: retrying would fail the same way
_DATA_STATUS = frozenset({400, 413, 422})


class Fate(enum.Enum):
    NOT_STORED = "not stored"
    UNKNOWN = "unknown"
    REFUSED = "refused"
    PARTIAL = "partial"


@dataclass(frozen=True)
class Outcome:
    """The fate of a batch after a failed write; ``refused`` points of it (PARTIAL, REFUSED)."""

    fate: Fate
    refused: int = 0

    @property
    def settled(self) -> bool:
        """True when retrying cannot change anything: the batch is done with."""
        return self.fate in (Fate.REFUSED, Fate.PARTIAL)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the ``reason`` a URLError wraps."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        for nxt in (e.__cause__, e.__context__, getattr(e, "reason", None)):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def _never_sent(exc: BaseException) -> bool:
    return any(isinstance(e, ConnectionRefusedError | socket.gaierror) for e in _causes(exc))


def classify(exc: BaseException, batch_size: int) -> Outcome:
    """The :class:`Outcome` of a write of ``batch_size`` points that raised ``exc``.

    A :class:`~rankscope.store.RejectedPointsError` carries its own report and is
    handled by the caller, before this."""
    if not isinstance(exc, StoreError):
        if isinstance(exc, ValueError | TypeError):
            return Outcome(Fate.REFUSED, batch_size)  # refused before anything was sent
        return Outcome(Fate.NOT_STORED if _never_sent(exc) else Fate.UNKNOWN)
    text = str(exc)
    for pattern in (_BEYOND_RETENTION, _PARTIAL):
        found = pattern.search(text)
        if found:
            return Outcome(Fate.PARTIAL, min(int(found.group(1)), batch_size))
    answered = _ANSWERED.search(text)
    status = int(answered.group(1)) if answered else 0
    if status in _DATA_STATUS:
        return Outcome(Fate.REFUSED, batch_size)
    if status in (401, 403, 404) or _never_sent(exc):
        return Outcome(Fate.NOT_STORED)
    return Outcome(Fate.UNKNOWN)
