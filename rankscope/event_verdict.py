"""One out-of-band event judged against one incident: what the verdict, the briefing and the
report say of it (part of :class:`rankscope.incident.Incident`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class EventVerdict:
    """One out-of-band event judged against one incident."""

    name: str
    node: int
    verdict: str
    reason: str
    time_ms: int = 0
    host: str = ""
    rank: int = -1
    status: str = "firing"
    #: Who reported the event (``alertmanager/<receiver>``, ``grafana/<receiver>``,
    #: ``events/<sender>``, ``cli/<sender>``; empty: not recorded), so a forged one can be traced.
    source: str = ""

    @property
    def where(self) -> str:
        return self.host or (f"node {self.node}" if self.node >= 0 else "the job")

    @property
    def sentence(self) -> str:
        """The verdict as an operator reads it: event, machine, verdict, why, who reported it."""
        by = f" Reported by {self.source}." if self.source else ""
        return f"Event '{self.name}' on {self.where}: {self.verdict.upper()} - {self.reason}.{by}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "node": int(self.node), "rank": int(self.rank),
                "status": self.status, "verdict": self.verdict, "reason": self.reason,
                "time_ms": int(self.time_ms), "source": self.source}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EventVerdict:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
