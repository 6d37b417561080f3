"""The records of a cluster day (:mod:`simulator.fleet`): layouts, attempts, jobs, fault plans."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankscope.topology import Topology

#: What real collectors write (per-rank and per-host clocks, dropped points, sporadic stalls,
#: expert load imbalance, GPU speed bias): the simulator's ``[model]`` keys, as the accuracy
#: suite's collector shapes.
SHAPES = {"rank_clock_ms": 50.0, "host_clock_ms": 1000.0, "drop_rate": 0.01, "stall_rate": 0.002,
          "expert_load_sigma": 0.05, "gpu_speed_sigma": 0.03}
#: A segment begins with a start, a restart, a shrink or a node swap.
CAUSES = ("start", "restart", "shrink", "swap")
#: Where a fault is placed: anywhere in a segment, right after a restart's warm-up, or inside
#: a re-run window (it begins and ends before the old high-water iteration).
PLACEMENTS = ("normal", "after_restart", "rerun_window")


@dataclass(frozen=True)
class Layout:
    """A job's parallel layout (its first attempt's; a shrink lowers ``dp``)."""

    tp: int
    pp: int
    dp: int
    ep: int
    gpus_per_node: int = 8

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def topology(self, dp: int | None = None, hosts: tuple[str, ...] | None = None) -> Topology:
        return Topology(tp=self.tp, pp=self.pp, dp=dp or self.dp, ep=self.ep, gpus_per_node=self.gpus_per_node,
                        hosts=hosts)

    def shrunk(self, dp: int) -> int | None:
        """The next smaller ``dp`` (whole EP groups, whole nodes), or None when none is left."""
        for smaller in range(dp - self.ep, self.ep - 1, -self.ep):
            if (self.tp * self.pp * smaller) % self.gpus_per_node == 0:
                return smaller
        return None


@dataclass(frozen=True)
class Segment:
    """One attempt of a job: it runs global iterations ``first_iteration`` onwards, ``iterations``
    of them, on ``dp`` replicas and ``hosts`` (one per node), after ``downtime_s`` stopped;
    ``high_water`` is the iteration the previous attempt had reached (its re-run window ends
    there); the first ``warmup`` iterations are slower by up to ``warmup_factor``."""

    attempt: int
    cause: str
    first_iteration: int
    iterations: int
    dp: int
    hosts: tuple[str, ...]
    downtime_s: float = 0.0
    high_water: int = 0
    warmup: int = 3
    warmup_factor: float = 2.0

    @property
    def rerun(self) -> int:
        """Iterations run again after the restart (0: no rewind)."""
        return max(0, self.high_water - self.first_iteration)

    @property
    def end_iteration(self) -> int:
        return self.first_iteration + self.iterations


@dataclass
class FleetJob:
    """One job of the fleet (``instance`` 1: a later job using an ended job's name)."""

    index: int
    name: str
    instance: int
    layout: Layout
    seed: int
    microbatches: int
    layers: int
    iteration_s: float
    start_s: float
    end_s: float
    checkpoint_every: int
    attempt_field: bool
    segments: list[Segment] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.layout.world

    @property
    def ends(self) -> bool:
        """Whether it stops writing before the day ends (planned)."""
        return self.end_s < float("inf")

    @property
    def model(self) -> dict[str, float | int]:
        return {"microbatches": self.microbatches, "layers_per_stage": self.layers, **SHAPES}

    @property
    def points(self) -> int:
        return sum(s.iterations * self.layout.tp * self.layout.pp * s.dp for s in self.segments)


@dataclass
class FaultPlan:
    """A fault in segment ``segment`` of job ``job`` (an index of :attr:`Fleet.jobs`), over the
    segment's iterations ``start <= i < end``; ``placement`` is ``normal``, ``after_restart``
    (right after the warm-up of a restarted job) or ``rerun_window`` (begins and ends before
    the old high-water iteration)."""

    job: int
    segment: int
    kind: str
    stage: str | None
    factor: float
    ranks: tuple[int, ...]
    start: int
    end: int
    placement: str
