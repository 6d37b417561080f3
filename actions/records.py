"""The actor's record: one ``action`` point per step of an action, read back as the state.

An action is one incident, one node and one verb (``drain`` or ``resume``). Each step it takes
(``planned``, ``done``, ``refused``, ``failed``, ``skipped``) is a point stamped with the time it
was taken, so the store holds the whole history (the audit), and the latest point of an action
is its state: what a restarted actor, or a second replica, reads before it does anything. A
step is written only when the state or its reason changes, so a plan repeated every cycle is
one point. ``final`` marks the steps after which the actor never touches that node for that
incident again (an operator resumed it, or someone else had drained it).

Example::

    >>> r = ActionRecord("il-0477", "cs-30-r10352", "gpu-node-01294", "drain", "planned",
    ...                  "would drain", 1_000, host="gpu-node-01294")
    >>> r.to_json()["state"], ActionRecord.from_row(r.to_row()) == r
    ('planned', True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import pandas as pd

from rankscope import schema
from rankscope.store import Store

STATES = ("planned", "done", "refused", "failed", "skipped")
VERBS = ("drain", "resume")
#: The ``action`` point's tags; every other field of :class:`ActionRecord` is a field.
TAGS = ("job", "incident", "node", "action")


@dataclass(frozen=True)
class ActionRecord:
    """One step of one action (``at``: epoch ms when it was taken)."""

    job: str
    incident: str
    node: str
    action: str
    state: str
    reason: str
    at: int
    host: str = ""
    cls: str = ""
    scheduler: str = ""
    mode: str = "dry-run"
    attempt: int = 0
    retry_ms: int = -1
    final: bool = False
    actor: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.job, self.incident, self.node, self.action

    def same_step(self, other: ActionRecord | None) -> bool:
        """Whether ``other`` says the same (nothing to write again)."""
        return other is not None and (other.state, other.reason, other.final, other.mode) == (
            self.state, self.reason, self.final, self.mode)

    def but(self, **changes) -> ActionRecord:
        return replace(self, **changes)

    def to_json(self) -> dict:
        """The ``rankscope act --json`` shape."""
        return {"incident": self.incident, "job": self.job, "node": self.node, "action": self.action,
                "state": self.state, "reason": self.reason, "at": int(self.at)}

    @property
    def title(self) -> str:
        return f"rankscope {self.action} {self.state}: {self.node} ({self.incident})"

    def to_row(self) -> dict:
        """One ``action`` point (fields as :data:`rankscope.schema.MEASUREMENTS`)."""
        d = asdict(self)
        d["time"], d["class"] = int(d.pop("at")), d.pop("cls")
        return {**d, "final": int(self.final), "attempt": int(self.attempt), "retry_ms": int(self.retry_ms),
                "title": self.title, "text": f"{self.title}: {self.reason}",
                "tags": ",".join(["rankscope", "action", self.action, self.state, f"job:{self.job}",
                                  f"node:{self.node}"])}

    @classmethod
    def from_row(cls, row: dict) -> ActionRecord:
        def text(key: str) -> str:
            v = row.get(key)
            return "" if v is None or v != v else str(v)   # a node named "17" reads back as a number

        def num(key: str, default: int) -> int:
            v = row.get(key)
            return default if v is None or v != v else int(v)

        return cls(job=text("job"), incident=text("incident"), node=text("node"), action=text("action"),
                   state=text("state"), reason=text("reason"), at=int(row["time"]), host=text("host"),
                   cls=text("class"), scheduler=text("scheduler"), mode=text("mode") or "dry-run",
                   attempt=num("attempt", 0), retry_ms=num("retry_ms", -1), final=bool(num("final", 0)),
                   actor=text("actor"))


def read_records(store: Store, since_ms: int | None = None, job: str | None = None) -> list[ActionRecord]:
    """Every ``action`` point (of ``job``, since ``since_ms``), oldest first."""
    df = store.read(schema.ACTION, job, since_ms)
    if not len(df):
        return []
    return [ActionRecord.from_row(r) for r in df.sort_values("time", kind="stable").to_dict("records")]


def latest(records: list[ActionRecord]) -> dict[tuple[str, str, str, str], ActionRecord]:
    """The state of each action: its latest step."""
    out: dict[tuple[str, str, str, str], ActionRecord] = {}
    for r in sorted(records, key=lambda r: r.at):
        out[r.key] = r
    return out


def write_records(store: Store, records: list[ActionRecord]) -> None:
    if records:
        store.write_measurement(schema.ACTION, pd.DataFrame([r.to_row() for r in records]))
