"""Incident records: what the diagnosis found, as operators and Grafana see it.

One :class:`Incident` per culprit set until it resolves. It is written to the
``incident`` measurement as one point keyed by its onset time (tags job, id,
class), rewritten in place as it evolves, so re-running a cycle or restarting
the analyzer never duplicates it; the text fields are what Grafana
annotations show (title, text, tags).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.topology import format_ranks, parse_ranks

CLASSES = ("compute_straggler", "link_degradation", "pipeline_imbalance", "transient_stall",
           "host_stall", "silent_rank")


@dataclass
class EventVerdict:
    name: str
    node: int
    verdict: str  # supported | contradicted | unrelated
    reason: str
    time_ms: int = 0


@dataclass
class Incident:
    """One diagnosed fault."""

    id: str
    job: str
    cls: str
    ranks: list[int]
    nodes: list[int]
    stage: str | None
    ratio: float
    group_type: str | None
    group_ranks: list[int]
    onset_iteration: int
    onset_ms: int
    status: str = "open"
    resolved_iteration: int = -1
    events: list[EventVerdict] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)
    updated_ms: int = 0

    # ------------------------------------------------------------- wording
    @property
    def title(self) -> str:
        where = f"node {format_ranks(self.nodes)}" if len(self.nodes) <= 4 else f"{len(self.nodes)} nodes"
        what = self.cls.replace("_", " ")
        stage = f" in {self.stage}" if self.stage else ""
        ratio = f" ({self.ratio:.1f}x)" if self.ratio and self.cls not in ("silent_rank",) else ""
        return f"{what}: ranks {format_ranks(self.ranks)} on {where}{stage}{ratio}"

    @property
    def text(self) -> str:
        parts = [self.evidence.get("summary", self.title)]
        for e in self.events:
            parts.append(f"Event '{e.name}' on node {e.node}: {e.verdict} ({e.reason}).")
        if self.status == "resolved":
            parts.append(f"Resolved at iteration {self.resolved_iteration}.")
        return " ".join(parts)

    @property
    def tags(self) -> str:
        return ",".join(["rankscope", self.cls, f"job:{self.job}", self.status]
                        + [f"node:{n}" for n in self.nodes[:8]])

    # ---------------------------------------------------------- conversions
    def to_json(self) -> dict:
        """The ``analyze --once --json`` shape."""
        return {
            "id": self.id, "job": self.job, "class": self.cls, "status": self.status,
            "ranks": [int(r) for r in self.ranks], "nodes": [int(n) for n in self.nodes],
            "stage": self.stage, "ratio": round(float(self.ratio), 3),
            "group": {"type": self.group_type, "ranks": [int(r) for r in self.group_ranks]},
            "onset_iteration": int(self.onset_iteration), "onset_ms": int(self.onset_ms),
            "resolved_iteration": int(self.resolved_iteration),
            "events": [{"name": e.name, "node": int(e.node), "verdict": e.verdict, "reason": e.reason}
                       for e in self.events],
            "title": self.title, "evidence": self.evidence,
        }

    def to_row(self) -> dict:
        """One ``incident`` point (fields as :data:`rankscope.schema.MEASUREMENTS`)."""
        return {
            "time": int(self.onset_ms), "job": self.job, "id": self.id, "class": self.cls,
            "title": self.title, "text": self.text, "tags": self.tags, "status": self.status,
            "ranks": format_ranks(self.ranks), "nodes": format_ranks(self.nodes),
            "stage": self.stage or "", "ratio": float(self.ratio),
            "group_type": self.group_type or "", "group_ranks": format_ranks(self.group_ranks),
            "onset_iteration": int(self.onset_iteration), "resolved_iteration": int(self.resolved_iteration),
            "events": json.dumps([asdict(e) for e in self.events]),
            "evidence": json.dumps(self.evidence, default=_jsonable), "updated_ms": int(self.updated_ms),
        }

    @classmethod
    def from_row(cls, row: dict) -> Incident:
        def ints(text) -> list[int]:
            return parse_ranks(text).tolist() if isinstance(text, str) and text else []

        events = [EventVerdict(**e) for e in json.loads(row.get("events") or "[]")]
        return cls(
            id=str(row["id"]), job=str(row["job"]), cls=str(row["class"]), ranks=ints(row.get("ranks")),
            nodes=ints(row.get("nodes")), stage=row.get("stage") or None, ratio=float(row.get("ratio") or 0),
            group_type=row.get("group_type") or None, group_ranks=ints(row.get("group_ranks")),
            onset_iteration=int(row.get("onset_iteration", -1)), onset_ms=int(row["time"]),
            status=str(row.get("status") or "open"), resolved_iteration=int(row.get("resolved_iteration", -1)),
            events=events, evidence=json.loads(row.get("evidence") or "{}"),
            updated_ms=int(row.get("updated_ms") or 0),
        )


def incidents_frame(incidents: list[Incident]) -> pd.DataFrame:
    return pd.DataFrame([i.to_row() for i in incidents])


def load_incidents(store, job: str) -> list[Incident]:
    """Every incident of a job as stored (the latest version of each id)."""
    df = store.read(schema.INCIDENT, job)
    if not len(df):
        return []
    df = df.sort_values(["time", "updated_ms"]).drop_duplicates("id", keep="last")
    return [Incident.from_row(r) for r in df.to_dict("records")]


def incident_id(cls: str, onset_iteration: int, ranks) -> str:
    """Stable and readable: the same fault found again gets the same id."""
    short = {"compute_straggler": "cs", "link_degradation": "ld", "pipeline_imbalance": "pi",
             "transient_stall": "ts", "host_stall": "hs", "silent_rank": "sr"}[cls]
    return f"{short}-{int(onset_iteration)}-r{int(np.min(ranks))}"


def _jsonable(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON: {type(o)}")
