"""What a scenario injects into a run: faults (resolved to ranks) and out-of-band events."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankscope.topology import Topology

FAULT_KINDS = ("compute_slowdown", "link_degradation", "stage_imbalance",
               "transient_stall", "host_stall", "silent_rank")
#: Iterations a transient stall lasts when the scenario gives no ``end``.
TRANSIENT_DEFAULT_LENGTH = 3


@dataclass(frozen=True, eq=False)
class Fault:
    """One injected fault, resolved against the topology.

    ``ranks`` are the culprit ranks (sorted); ``stage`` the stage the fault slows
    (compute and host kinds; ``None`` for link_degradation and silent_rank, and for
    compute_slowdown / stage_imbalance meaning "all compute stages of a layer");
    ``factor`` multiplies the stage's duration (or, for link_degradation, the
    transfer time of every collective the ranks take part in); active for
    iterations ``start <= i < end`` (``end`` None: to the end of the run) and, for a
    fault that comes and goes, again ``every`` iterations later, ``repeats`` times in all.
    """

    kind: str
    ranks: np.ndarray
    stage: str | None = None
    factor: float = 1.0
    start: int = 0
    end: int | None = None
    every: int | None = None
    repeats: int = 1
    host_side: bool = False   # transient_stall only: the host stopped launching (JIT, GC); kernels normal
    telemetry: str = ""       # what its GPUs' own telemetry shows (simulator/gpu_telemetry.py); "": none written

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Fault):
            return NotImplemented
        return (self.kind, self.stage, self.factor, self.start, self.end, self.every, self.repeats,
                self.host_side, self.telemetry) == \
            (other.kind, other.stage, other.factor, other.start, other.end, other.every, other.repeats,
             other.host_side, other.telemetry) \
            and np.array_equal(self.ranks, other.ranks)

    __hash__ = None  # type: ignore[assignment]

    def active(self, iteration: int) -> bool:
        if self.every is None or self.end is None:
            return iteration >= self.start and (self.end is None or iteration < self.end)
        k, phase = divmod(iteration - self.start, self.every)
        return iteration >= self.start and k < self.repeats and phase < self.end - self.start

    @property
    def episodes(self) -> list[tuple[int, int | None]]:
        """``(start, end)`` of each time the fault is active."""
        if self.every is None or self.end is None:
            return [(self.start, self.end)]
        return [(self.start + k * self.every, self.end + k * self.every) for k in range(self.repeats)]

    def to_dict(self, topology: Topology) -> dict[str, Any]:
        return {"kind": self.kind, "ranks": [int(r) for r in self.ranks],
                "nodes": [int(n) for n in topology.nodes_of(self.ranks)],
                "stage": self.stage, "factor": float(self.factor),
                "start": int(self.start), "end": None if self.end is None else int(self.end),
                "every": self.every, "repeats": int(self.repeats),
                "episodes": [[int(a), None if b is None else int(b)] for a, b in self.episodes],
                **({"host_side": True} if self.host_side else {}),
                **({"telemetry": self.telemetry} if self.telemetry else {})}


@dataclass(frozen=True)
class EventSpec:
    """An out-of-band event (e.g. a NOC monitor's "server port down") at iteration ``at``."""

    name: str
    at: int
    node: int | None = None
    rank: int | None = None
    severity: str = "warning"
    source: str = "out-of-band-monitor"
    text: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
