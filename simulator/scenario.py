"""Simulation scenarios: a topology, a run length and seed, faults and out-of-band events.

A scenario is a TOML file (the built-ins ship in ``simulator/scenarios/``)::

    description = "what this scenario shows"   # optional
    [topology]            # as rankscope.topology.Topology: tp, pp, dp, ep, gpus_per_node, order,
                          # host_pattern (default "gpu-node-{node:05d}")
    [run]                 # job, iterations, seed, kernel_every (0: no kernel windows)
    [model]               # optional: ModelParams overrides (microbatches, mlp_ms, ...)
    [[fault]]             # kind, ranks | node | pp, stage, factor, start, end, every, repeats
    [[event]]             # name, at, node | rank, severity, source, text
    [[kernel_fault]]      # ranks | node | pp, stage, factor, start, end: one kernel slow, its
                          # stage time unchanged (simulator/kernel_windows.py)
    [[swap]]              # node, at, host: the node's ranks on another machine from ``at``, their
                          # faults ended (simulator/swaps.py)

Everything is validated when the scenario is built: unknown keys, bad rank
ranges, ranks or nodes outside the topology, unknown or unfitting stages are
refused with a :class:`ScenarioError` naming the key path and, for files, the
line it is on.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.schema import DEFAULT_STAGES, StageSet
from rankscope.topology import Topology
from simulator.faults import FAULT_KINDS, TRANSIENT_DEFAULT_LENGTH, EventSpec, Fault
from simulator.kernel_windows import KernelFault
from simulator.scenario_parser import (
    DEFAULT_HOST_PATTERN,
    ScenarioError,
    ScenarioParser,
    job_name,
    nonnegative_int,
    positive_int,
)
from simulator.swaps import NodeSwap

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

__all__ = ["DEFAULT_HOST_PATTERN", "FAULT_KINDS", "SCENARIO_DIR", "TRANSIENT_DEFAULT_LENGTH", "EventSpec",
           "Fault", "Scenario", "ScenarioError", "builtin_scenarios", "load_scenario"]


@dataclass(frozen=True)
class Scenario:
    """What to simulate. Build with :func:`load_scenario` or :meth:`from_dict`."""

    topology: Topology
    job: str
    iterations: int
    seed: int
    faults: list[Fault] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)
    name: str = ""
    description: str = ""
    model: dict[str, Any] = field(default_factory=dict)
    kernel_every: int = 0   # > 0: a kernel_stats window every this many iterations (kernel_windows.py)
    kernel_faults: list[KernelFault] = field(default_factory=list)
    swaps: list[NodeSwap] = field(default_factory=list)   # nodes moved to other machines (simulator/swaps.py)

    def with_overrides(self, iterations: int | None = None, seed: int | None = None,
                       job: str | None = None, kernel_every: int | None = None) -> Scenario:
        """A copy with another run length, seed, job name or kernel window period (faults and
        events unchanged)."""
        changes: dict[str, Any] = {}
        if kernel_every is not None:
            changes["kernel_every"] = nonnegative_int(kernel_every, "kernel_every")
        if iterations is not None:
            changes["iterations"] = positive_int(iterations, "iterations")
        if seed is not None:
            changes["seed"] = nonnegative_int(seed, "seed")
        if job is not None:
            changes["job"] = job_name(job, "job")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any], name: str = "", stages: StageSet = DEFAULT_STAGES,
                  source: str | None = None, text: str | None = None) -> Scenario:
        """Build and validate from the TOML-shaped dict (``topology``, ``run``, ``fault``, ``event``).

        ``source`` and ``text`` (a file's name and content) let errors cite the line.
        """
        return cls(**ScenarioParser(stages, source or (name or "scenario"), text).scenario(data, name))


def builtin_scenarios() -> dict[str, Path]:
    """Built-in scenario names -> their TOML files."""
    return {p.stem: p for p in sorted(SCENARIO_DIR.glob("*.toml"))}


def load_scenario(name_or_path: str | Path, stages: StageSet = DEFAULT_STAGES) -> Scenario:
    """A built-in scenario by name, or a scenario TOML file by path."""
    builtins = builtin_scenarios()
    key = str(name_or_path)
    path = Path(key)
    if key in builtins and not path.exists():
        path = builtins[key]
    elif not path.exists():
        raise ScenarioError(f"no scenario {key!r}: not a file and not a built-in "
                            f"(built-ins: {', '.join(builtins) or 'none'})")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: invalid TOML: {exc}") from None
    return Scenario.from_dict(data, name=path.stem, stages=stages, source=str(path), text=text)
