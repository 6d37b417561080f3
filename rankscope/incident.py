"""The incident model: what the diagnosis found, as operators, reports and Grafana see it.

One :class:`Incident` per fault until it resolves. It is written to the
``incident`` measurement as one point keyed by its onset time (tags job, id,
class) and rewritten in place as it evolves, so re-running a cycle or
restarting the analyzer never duplicates it. The analyzer creates incidents,
the report and the dashboards read them back with :func:`load_incidents` /
:func:`load_incident`: one record, one parser, one list of classes
(:class:`IncidentClass`).

Example::

    >>> inc = Incident(id="cs-30-r10352", job="il-0477", cls=IncidentClass.COMPUTE_STRAGGLER,
    ...                ranks=list(range(10352, 10360)), nodes=[1294], stage="mlp", ratio=5.7,
    ...                group_type="ep", group_ranks=list(range(10336, 10368)),
    ...                onset_iteration=30, onset_ms=1_000, hosts=["gpu-node-01294"])
    >>> inc.title
    'compute straggler: ranks 10352-10359 on gpu-node-01294 in mlp (5.7x)'
    >>> Incident.from_row(inc.to_row()) == inc
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.event_verdict import EventVerdict
from rankscope.incident_cost import NO_WHAT_IF, Impact, gpu_hours_text, seconds_text
from rankscope.incident_vocabulary import ACTIONS, IncidentClass, Status, Verdict
from rankscope.topology import format_ranks, parse_ranks, rank_phrase

#: The one "not known" of the incident's durations (one object: a record read back equals itself).
NAN = float("nan")

if TYPE_CHECKING:  # the store's interface, for the loaders' signatures
    from rankscope.store.base import Store


@dataclass
class Incident:
    """One diagnosed fault.

    ``ranks`` are the culprits, ``nodes`` the node numbers and ``hosts`` the host
    names they ran on (what an operator drains), ``stage`` the stage that names
    them, ``ratio`` how much slower they are than their peers, ``group_*`` the
    group that localised them; ``evidence`` holds the numbers behind the verdict;
    ``impact`` what it costs. A fault that comes and goes is one incident reopened:
    ``episodes`` counts its episodes, ``first_onset``/``last_onset`` their onsets.
    ``host_record``: the culprit hosts' earlier incidents, in words ("": none; None: not looked up,
    as an empty one reads back).
    """

    id: str
    job: str
    cls: IncidentClass
    ranks: list[int]
    nodes: list[int]
    stage: str | None
    ratio: float
    group_type: str | None
    group_ranks: list[int]
    onset_iteration: int
    onset_ms: int
    status: str = Status.OPEN
    resolved_iteration: int = -1
    events: list[EventVerdict] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)
    updated_ms: int = 0
    hosts: list[str] = field(default_factory=list)
    impact: Impact = field(default_factory=Impact)
    episodes: int = 1
    first_onset: int = -1
    last_onset: int = -1
    host_record: str | None = None
    #: The culprit GPUs, ``{"rank", "host", "gpu", "uuid"}`` each where known (from the ranks' tags).
    gpus: list[dict] = field(default_factory=list)
    #: The culprit GPUs' own telemetry against their past and the job's other GPUs, and its
    #: conclusion (``verdict``, ``source``, per GPU its signals, ``summary``); empty: not checked.
    hardware: dict = field(default_factory=dict)
    #: ``onset``, ``detected``, ``confirmed``, ``action``, ``recovered``: epoch ms, None where none.
    timeline: dict = field(default_factory=dict)
    #: Onset to the iteration the incident was first opened; onset to the first iteration back
    #: within 10% of the what-if (NaN: not yet).
    time_to_detect_s: float = NAN
    time_to_recover_s: float = NAN
    #: Since rankscope's drain, while the job has not recovered (wall clock); -1: no drain waiting
    #: (stored as -1, never left out: a rewrite of the point must replace it).
    awaiting_recovery_s: float = -1.0
    #: How the job recovered: ``{"how", "iteration_s_after", "within_what_if"}``; empty: not yet.
    recovery: dict = field(default_factory=dict)

    #: The records above, stored as JSON text fields of the ``incident`` point.
    RECORDS = ("gpus", "hardware", "timeline", "recovery")
    #: ... and as float fields.
    DURATIONS = ("time_to_detect_s", "time_to_recover_s")

    def __post_init__(self) -> None:
        self.cls = IncidentClass(self.cls)
        self.status = Status(self.status)
        if self.first_onset < 0:
            self.first_onset = self.onset_iteration
        if self.last_onset < 0:
            self.last_onset = self.onset_iteration

    @property
    def intermittent(self) -> bool:
        """A fault that came back after it had resolved (more than one episode)."""
        return self.episodes > 1

    @property
    def is_open(self) -> bool:
        return self.status == Status.OPEN

    def resolve(self, iteration: int) -> None:
        self.status = Status.RESOLVED
        self.resolved_iteration = int(iteration)

    # ------------------------------------------------------------- wording
    @property
    def where(self) -> str:
        """The machines: host names when known, else node numbers."""
        if self.hosts:
            return ", ".join(self.hosts) if len(self.hosts) <= 4 else f"{len(self.hosts)} hosts"
        if self.nodes:
            return f"node {format_ranks(self.nodes)}" if len(self.nodes) <= 4 else f"{len(self.nodes)} nodes"
        return "?"

    @property
    def hardware_verdict(self) -> str:
        """The GPU telemetry's verdict in a table cell: ``hardware_fault: GPU thermal throttling``."""
        hw = self.hardware
        return f"{hw['verdict']}: {hw['phrase']}" if hw.get("phrase") else str(hw.get("verdict", ""))

    @property
    def title(self) -> str:
        stage = f" in {self.stage}" if self.stage else ""
        ratio = f" ({self.ratio:.1f}x)" if self.ratio and self.cls != IncidentClass.SILENT_RANK else ""
        if self.cls == IncidentClass.ARRIVAL_STRAGGLER and "lead_ms" in self.evidence:
            stretch = f"; its group's collectives {self.ratio:.1f}x" if self.ratio > 1 else ""
            ratio = f" (last by {self.evidence['lead_ms']:.1f} ms{stretch})"
        again = f"intermittent ({self.episodes} episodes) " if self.intermittent else ""
        host = "host-side " if self.host_side else ""
        gpu = f"{self.hardware['phrase']}, " if self.hardware.get("verdict") == "hardware_fault" \
            and self.hardware.get("phrase") else ""
        return f"{again}{host}{self.cls.label}: {gpu}{rank_phrase(self.ranks)} on {self.where}{stage}{ratio}"

    @property
    def waiting_ranks(self) -> list[int]:
        """Ranks of the culprits' inner groups that only waited for them (a descent into a TP
        group: analyzer/diagnosis/inner_groups.py): held by the incident, not its culprits."""
        inner = self.evidence.get("inner")
        text = inner.get("waited") if isinstance(inner, dict) else None
        try:
            return parse_ranks(text).tolist() if isinstance(text, str) and text.strip() else []
        except ValueError:
            return []

    @property
    def host_side(self) -> bool:
        """A stall the kernel windows show as the host's (the GPUs idle, no kernel launched)."""
        return "host_gap_ms" in self.evidence

    @property
    def action(self) -> str:
        """What to do, in one sentence."""
        text = ACTIONS[self.cls].format(where=self.where, ranks=format_ranks(self.ranks), stage=self.stage,
                                        Ranks=rank_phrase(self.ranks, capital=True))
        if self.evidence.get("ambiguous"):
            text += " No timing separates these machines: check each."
        if self.host_side:
            text = (f"Do not drain the GPUs: the host of {self.where} stopped launching kernels for "
                    f"{self.evidence['host_gap_ms']:g} ms (a JIT compile, GC, a data loader); look at its "
                    f"processes if it repeats.")
        return text

    def briefing(self) -> list[str]:
        """The lines an operator reads first: title, cost, action, the verdict on each event."""
        lines = [f"[{self.status.value}] {self.id} {self.title}"]
        if self.cost:
            lines.append(f"  {self.cost}")
        lines.append(f"  Action: {self.action}")
        lines += [f"  Record: {self.host_record}"] if self.host_record else []
        lines += [f"  Hardware ({self.hardware['verdict']}): {self.hardware.get('summary', '')}"] \
            if self.hardware.get("verdict") else []
        lines += [f"  {e.sentence}" for e in self.events]
        return lines

    @property
    def cost(self) -> str:
        """The impact in words ("" while unknown)."""
        imp = self.impact
        if not imp.iteration_s_before == imp.iteration_s_before:   # NaN: no level before the onset
            return ""
        text = (f"Cost: {gpu_hours_text(imp.gpu_hours_lost)} GPU-hours lost{' so far' if self.is_open else ''} "
                f"(iteration {seconds_text(imp.iteration_s_before)} s -> {seconds_text(imp.iteration_s_now)} s, "
                f"x{imp.slowdown:.2f})")
        if imp.iteration_s_if_restored == imp.iteration_s_if_restored:
            text += f"; about {seconds_text(imp.iteration_s_if_restored)} s per iteration with the culprits restored"
        elif self.cls in NO_WHAT_IF:
            text += f"; {NO_WHAT_IF[self.cls]}"
        return text + "."

    @property
    def text(self) -> str:
        parts = [self.evidence.get("summary", self.title)]
        if self.evidence.get("kernels"):
            parts.append("Kernels (L3): " + "; ".join(f"{k['kernel'][:80]} {k['ratio']:g}x its group's ({k['cause']}, "
                                                      f"rank(s) {k['ranks']})" for k in self.evidence["kernels"]) + ".")
        if self.cost:
            parts.append(self.cost)
        if self.host_record:
            parts.append(self.host_record)
        if self.hardware.get("summary"):
            parts.append(f"Hardware ({self.hardware.get('verdict')}): {self.hardware['summary']}")
        for e in self.events:
            parts.append(f"Event '{e.name}' on {e.where}: {e.verdict} ({e.reason}).")
        if self.status == Status.RESOLVED:
            parts.append(f"Resolved at iteration {self.resolved_iteration}.")
        return " ".join(parts)

    @property
    def tags(self) -> str:
        return ",".join(["rankscope", self.cls.value, f"job:{self.job}", self.status.value]
                        + [f"host:{h}" for h in self.hosts[:8]] + [f"node:{n}" for n in self.nodes[:8]])

    # ---------------------------------------------------------- conversions
    def to_json(self) -> dict:
        """The ``analyze --once --json`` shape."""
        return {
            "id": self.id, "job": self.job, "class": self.cls.value, "status": self.status.value,
            "ranks": [int(r) for r in self.ranks], "nodes": [int(n) for n in self.nodes],
            "hosts": list(self.hosts), "stage": self.stage, "ratio": round(float(self.ratio), 3),
            "group": {"type": self.group_type, "ranks": [int(r) for r in self.group_ranks]},
            "onset_iteration": int(self.onset_iteration), "onset_ms": int(self.onset_ms),
            "resolved_iteration": int(self.resolved_iteration),
            "events": [e.to_json() for e in self.events],
            "title": self.title, "evidence": _plain(self.evidence), "impact": self.impact.to_json(),
            "episodes": int(self.episodes), "first_onset": int(self.first_onset),
            "last_onset": int(self.last_onset), "host_record": self.host_record,
            **{k: _plain(getattr(self, k)) for k in self.RECORDS},
            **{k: _finite_or_none(getattr(self, k)) for k in self.DURATIONS},
            "awaiting_recovery_s": _finite_or_none(self.awaiting_recovery_s) if self.awaiting_recovery_s >= 0 else None,
        }

    def to_row(self) -> dict:
        """One ``incident`` point (fields as :data:`rankscope.schema.MEASUREMENTS`)."""
        return {
            "time": int(self.onset_ms), "job": self.job, "id": self.id, "class": self.cls.value,
            "title": self.title, "text": self.text, "tags": self.tags, "status": self.status.value,
            "ranks": format_ranks(self.ranks), "nodes": format_ranks(self.nodes),
            "hosts": ",".join(self.hosts),
            "stage": self.stage or "", "ratio": float(self.ratio),
            "group_type": self.group_type or "", "group_ranks": format_ranks(self.group_ranks),
            "onset_iteration": int(self.onset_iteration), "resolved_iteration": int(self.resolved_iteration),
            "events": json.dumps([e.to_json() for e in self.events]),
            "evidence": json.dumps(_plain(self.evidence)), "updated_ms": int(self.updated_ms),
            "episodes": int(self.episodes), "first_onset": int(self.first_onset),
            "last_onset": int(self.last_onset), "host_record": self.host_record or "",
            "hardware_verdict": self.hardware_verdict,
            **{k: float(getattr(self.impact, k)) for k in Impact.FIELDS},
            **{k: json.dumps(_plain(getattr(self, k))) for k in self.RECORDS},
            **{k: float(getattr(self, k)) for k in self.DURATIONS},
            "awaiting_recovery_s": float(self.awaiting_recovery_s if self.awaiting_recovery_s >= 0 else -1.0),
        }

    @classmethod
    def from_row(cls, row: dict) -> Incident:
        """An incident read back from an ``incident`` point (tolerant of missing fields)."""
        def ints(text: object) -> list[int]:
            return parse_ranks(text).tolist() if isinstance(text, str) and text.strip() else []

        def loads(text: object, empty: Any) -> Any:
            try:
                return json.loads(text) if isinstance(text, str) and text else empty
            except ValueError:
                return empty

        def num(key: str, default: float) -> float:
            value = row.get(key)
            return default if value is None or value != value else value  # None or NaN

        hosts = row.get("hosts")
        return cls(
            id=str(row["id"]), job=str(row["job"]), cls=IncidentClass(str(row["class"])),
            ranks=ints(row.get("ranks")), nodes=ints(row.get("nodes")),
            stage=row.get("stage") or None, ratio=float(num("ratio", 0.0)),
            group_type=row.get("group_type") or None, group_ranks=ints(row.get("group_ranks")),
            onset_iteration=int(num("onset_iteration", -1)), onset_ms=int(row["time"]),
            status=Status(str(row.get("status") or "open")),
            resolved_iteration=int(num("resolved_iteration", -1)),
            events=[EventVerdict.from_json(e) for e in loads(row.get("events"), [])],
            evidence=loads(row.get("evidence"), {}), updated_ms=int(num("updated_ms", 0)),
            hosts=[h for h in hosts.split(",") if h] if isinstance(hosts, str) else [],
            impact=Impact.from_values({k: row.get(k) for k in Impact.FIELDS}),
            episodes=int(num("episodes", 1)), first_onset=int(num("first_onset", -1)),
            last_onset=int(num("last_onset", -1)),
            host_record=row["host_record"] if isinstance(row.get("host_record"), str) and row["host_record"] else None,
            gpus=_records(loads(row.get("gpus"), []), list), hardware=_records(loads(row.get("hardware"), {}), dict),
            timeline=_records(loads(row.get("timeline"), {}), dict),
            recovery=_records(loads(row.get("recovery"), {}), dict),
            **{k: float(num(k, NAN)) for k in cls.DURATIONS},
            awaiting_recovery_s=float(num("awaiting_recovery_s", -1.0)),
        )


def incidents_frame(incidents: list[Incident]) -> pd.DataFrame:
    """``incident`` points for :meth:`Store.write_measurement`."""
    return pd.DataFrame([i.to_row() for i in incidents])


def incident_id(cls: IncidentClass, onset_iteration: int, ranks) -> str:
    """Stable and readable: the same fault found again gets the same id."""
    return f"{IncidentClass(cls).short}-{int(onset_iteration)}-r{int(np.min(ranks))}"


def _latest_rows(store: Store, job: str) -> pd.DataFrame:
    df = store.read(schema.INCIDENT, job)
    if not len(df):
        return df
    sort = ["time", "updated_ms"] if "updated_ms" in df.columns else ["time"]
    return df.sort_values(sort, kind="stable").drop_duplicates("id", keep="last")


def load_incidents(store: Store, job: str) -> list[Incident]:
    """Every incident of a job as stored (the latest version of each id), oldest onset first."""
    return [Incident.from_row(r) for r in _latest_rows(store, job).to_dict("records")]


def load_incident(store: Store, job: str, incident_id: str | None = None) -> Incident:
    """The incident ``incident_id`` of ``job``, or its most recent one (latest onset)."""
    df = _latest_rows(store, job)
    if not len(df):
        raise ValueError(f"job {job!r} has no incidents in {store!r} (has the analyzer run?)")
    if incident_id is not None:
        hit = df[df["id"].astype(str) == incident_id]
        if not len(hit):
            known = ", ".join(df["id"].astype(str).tolist()[-10:])
            raise ValueError(f"job {job!r} has no incident {incident_id!r}; known: {known}")
        return Incident.from_row(hit.iloc[-1].to_dict())
    return Incident.from_row(df.iloc[-1].to_dict())


def _records(value: Any, kind: type) -> Any:
    """A stored record of the expected JSON type, else an empty one."""
    return value if isinstance(value, kind) else kind()


def _finite_or_none(x: float) -> float | None:
    return round(float(x), 3) if x == x and abs(x) != float("inf") else None


def _plain(o: Any) -> Any:
    """``o`` with numpy scalars and arrays turned into JSON's types (NaN kept as NaN)."""
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if isinstance(o, np.ndarray):
        return _plain(o.tolist())
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, StrEnum):
        return o.value
    return o


__all__ = ["NO_WHAT_IF", "EventVerdict", "Impact", "Incident", "IncidentClass", "Status", "Verdict",
           "incident_id", "incidents_frame", "load_incident", "load_incidents"]
