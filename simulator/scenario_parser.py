"""Reading a scenario: the TOML-shaped dict validated into a scenario's fields. Errors
(:class:`ScenarioError`) name the key path and, for files, the line it is on."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from rankscope.schema import StageSet
from rankscope.topology import Topology, TopologyError, parse_ranks
from simulator.faults import FAULT_KINDS, TRANSIENT_DEFAULT_LENGTH, EventSpec, Fault
from simulator.gpu_telemetry import TELEMETRY, valid_telemetry
from simulator.kernel_windows import KernelFault
from simulator.model_params import ModelParams
from simulator.swaps import SPARE_PATTERN, NodeSwap

#: Host names of simulated nodes unless ``[topology] host_pattern`` says otherwise.
DEFAULT_HOST_PATTERN = "gpu-node-{node:05d}"

_TOP_KEYS = {"description", "topology", "run", "model", "fault", "event", "kernel_fault", "swap"}
_SWAP_KEYS = {"node", "at", "host"}
_RUN_KEYS = {"job", "iterations", "seed", "kernel_every"}
_KERNEL_FAULT_KEYS = {"ranks", "node", "pp", "stage", "factor", "start", "end"}
_FAULT_KEYS = {"kind", "ranks", "node", "pp", "stage", "factor", "start", "end", "every", "repeats", "host_side",
               "telemetry"}
_EVENT_KEYS = {"name", "at", "node", "rank", "severity", "source", "text"}


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; the message names the key (and line)."""


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ScenarioError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def nonnegative_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ScenarioError(f"{what} must be an integer >= 0, got {value!r}")
    return int(value)


def job_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or any(c in value for c in "\r\n"):
        raise ScenarioError(f"{what} must be a non-empty one-line string, got {value!r}")
    return value


class ScenarioParser:
    """Validates a scenario dict; errors name the key path and, given the text, its line."""

    def __init__(self, stages: StageSet, source: str, text: str | None):
        self.stages = stages
        self.source = source
        self.lines = text.splitlines() if text is not None else None

    # error helpers
    def fail(self, path: tuple[Any, ...], message: str) -> ScenarioError:
        where = _format_path(path)
        line = self._line_of(path)
        at = f"line {line}: " if line else ""
        return ScenarioError(f"{self.source}: {at}{where}: {message}")

    def _line_of(self, path: tuple[Any, ...]) -> int | None:
        """Locate ``path`` (e.g. ("fault", 1, "ranks")) in the TOML text (1-based line)."""
        if not self.lines or not path:
            return None
        table, rest = str(path[0]), path[1:]
        if rest and isinstance(rest[0], int):
            header = re.compile(rf"^\s*\[\[\s*{re.escape(table)}\s*\]\]")
            starts = [i for i, ln in enumerate(self.lines) if header.match(ln)]
            if rest[0] >= len(starts):
                return None
            start, rest = starts[rest[0]], rest[1:]
        else:
            header = re.compile(rf"^\s*\[\s*{re.escape(table)}\s*\]")
            starts = [i for i, ln in enumerate(self.lines) if header.match(ln)]
            if not starts:  # a top-level key such as description = "..."
                key = re.compile(rf"^\s*{re.escape(table)}\s*=")
                return next((i + 1 for i, ln in enumerate(self.lines) if key.match(ln)), None)
            start = starts[0]
        if not rest:
            return start + 1
        key = re.compile(rf"^\s*{re.escape(str(rest[0]))}\s*=")
        for i in range(start + 1, len(self.lines)):
            if re.match(r"^\s*\[", self.lines[i]):
                break
            if key.match(self.lines[i]):
                return i + 1
        return start + 1

    def table(self, data: Any, path: tuple[Any, ...], allowed: set[str]) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(path, f"expected a table, got {type(data).__name__}")
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise self.fail((*path, unknown[0]),
                            f"unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
        return data

    def guard(self, path: tuple[Any, ...], fn, *args):
        try:
            return fn(*args)
        except (ScenarioError, TopologyError, ValueError, TypeError) as exc:
            raise self.fail(path, str(exc)) from None

    # the scenario
    def scenario(self, data: dict[str, Any], name: str) -> dict[str, Any]:
        """The fields of a :class:`~simulator.scenario.Scenario`, validated."""
        data = self.table(data, (), _TOP_KEYS) if data else {}
        if "topology" not in data:
            raise self.fail(("topology",), "missing: a scenario needs a [topology] table")
        topo_d = self.table(data["topology"], ("topology",), {f.name for f in dataclasses.fields(Topology)
                                                               if f.init})
        topology = self.guard(("topology",), Topology.from_dict,
                              {"host_pattern": DEFAULT_HOST_PATTERN, **topo_d})
        run = self.table(data.get("run", {}), ("run",), _RUN_KEYS)
        job = self.guard(("run", "job"), job_name, run.get("job", name or "sim"), "job")
        iterations = self.guard(("run", "iterations"), positive_int, run.get("iterations", 60), "iterations")
        seed = self.guard(("run", "seed"), nonnegative_int, run.get("seed", 0), "seed")
        kernel_every = self.guard(("run", "kernel_every"), nonnegative_int, run.get("kernel_every", 0),
                                  "kernel_every")
        description = data.get("description", "")
        if not isinstance(description, str):
            raise self.fail(("description",), "must be a string")
        model = self.table(data.get("model", {}), ("model",), ModelParams.keys())
        self.guard(("model",), ModelParams.from_dict, dict(model))
        faults = self.list_of(data.get("fault", []), "fault")
        events = self.list_of(data.get("event", []), "event")
        return dict(
            topology=topology, job=job, iterations=iterations, seed=seed,
            faults=[self.fault(f, i, topology) for i, f in enumerate(faults)],
            events=[self.event(e, i, topology) for i, e in enumerate(events)],
            name=name, description=description, model=dict(model), kernel_every=kernel_every,
            kernel_faults=[self.kernel_fault(f, i, topology)
                           for i, f in enumerate(self.list_of(data.get("kernel_fault", []), "kernel_fault"))],
            swaps=self.swaps(self.list_of(data.get("swap", []), "swap"), topology),
        )

    def swaps(self, items: list[Any], topo: Topology) -> list[NodeSwap]:
        """The ``[[swap]]`` tables: a node moved to another machine from iteration ``at`` on."""
        out: list[NodeSwap] = []
        for i, data in enumerate(items):
            p = ("swap", i)
            d = self.table(data, p, _SWAP_KEYS)
            node = d.get("node")
            if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < topo.nodes:
                raise self.fail((*p, "node"), f"must be a node id in 0..{topo.nodes - 1}, got {node!r}")
            at = self.guard((*p, "at"), positive_int, d.get("at"), "at")
            host = d.get("host", SPARE_PATTERN.format(node=node))
            if not isinstance(host, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", host) or (
                    topo.hosts is not None and host in topo.hosts) or host in {s.host for s in out}:
                raise self.fail((*p, "host"), f"must be a new host name (letters, digits, '.', '-', '_'), got {host!r}")
            if node in {s.node for s in out}:
                raise self.fail((*p, "node"), f"node {node} is swapped twice")
            out.append(NodeSwap(int(node), at, host))
        return out

    def kernel_fault(self, data: Any, i: int, topo: Topology) -> KernelFault:
        """One ``[[kernel_fault]]``: a device stage's kernel slowed, its stage time unchanged."""
        p = ("kernel_fault", i)
        d = self.table(data, p, _KERNEL_FAULT_KEYS)
        ranks = self.selector(d, p, topo, "kernel_fault")
        stage = d.get("stage")
        if not isinstance(stage, str) or stage not in self.stages or self.stages[stage].kind == "host":
            raise self.fail((*p, "stage"), f"must name a compute or comm stage, got {stage!r}")
        factor = d.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not np.isfinite(factor) or factor <= 0:
            raise self.fail((*p, "factor"), f"must be a positive number, got {factor!r}")
        start = self.guard((*p, "start"), nonnegative_int, d.get("start", 0), "start")
        end = None if d.get("end") is None else self.guard((*p, "end"), nonnegative_int, d["end"], "end")
        if end is not None and end <= start:
            raise self.fail((*p, "end"), f"end ({end}) must be after start ({start})")
        return KernelFault(ranks=ranks, stage=stage, factor=float(factor), start=start, end=end)

    def list_of(self, value: Any, key: str) -> list[Any]:
        if isinstance(value, dict):
            return [value]
        if not isinstance(value, list):
            raise self.fail((key,), f"expected [[{key}]] tables, got {type(value).__name__}")
        return value

    def fault(self, data: Any, i: int, topo: Topology) -> Fault:
        p = ("fault", i)
        d = self.table(data, p, _FAULT_KEYS)
        kind = d.get("kind")
        if kind not in FAULT_KINDS:
            raise self.fail((*p, "kind"), f"unknown fault kind {kind!r}; one of {', '.join(FAULT_KINDS)}")
        ranks = self.selector(d, p, topo, kind)
        stage = self.fault_stage(d, p, kind)
        if kind == "silent_rank":
            if "factor" in d:
                raise self.fail((*p, "factor"), "a silent_rank fault takes no factor (the ranks stop reporting)")
            factor = 1.0
        else:
            if "factor" not in d:
                raise self.fail((*p, "factor"), f"missing: a {kind} fault needs a factor (e.g. 5.7)")
            factor = d["factor"]
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not np.isfinite(factor) \
                    or factor <= 0:
                raise self.fail((*p, "factor"), f"must be a positive number, got {factor!r}")
        start = self.guard((*p, "start"), nonnegative_int, d.get("start", 0), "start")
        end = d.get("end")
        if end is None and kind == "transient_stall":
            end = start + TRANSIENT_DEFAULT_LENGTH
        if end is not None:
            end = self.guard((*p, "end"), nonnegative_int, end, "end")
            if end <= start:
                raise self.fail((*p, "end"), f"end ({end}) must be after start ({start})")
        every, repeats = d.get("every"), d.get("repeats", 1)
        if every is not None or "repeats" in d:
            if end is None:
                raise self.fail((*p, "every"), "a fault that repeats needs an end (the length of one episode)")
            every = self.guard((*p, "every"), positive_int, every, "every") if every is not None else None
            repeats = self.guard((*p, "repeats"), positive_int, repeats, "repeats")
            if every is None:
                raise self.fail((*p, "every"), "repeats needs every = N (iterations from one start to the next)")
            if every <= end - start:
                raise self.fail((*p, "every"), f"every ({every}) must exceed the episode length "
                                               f"({end - start}): the episodes would overlap")
        host_side = d.get("host_side", False)
        if not isinstance(host_side, bool) or (host_side and kind != "transient_stall"):
            raise self.fail((*p, "host_side"), "true or false, and true only for a transient_stall (the host "
                                               "stopped launching kernels: JIT, GC, a data loader)")
        telemetry = d.get("telemetry", "")
        if not isinstance(telemetry, str) or (telemetry and not valid_telemetry(telemetry)):
            raise self.fail((*p, "telemetry"), f"one of {', '.join(TELEMETRY)} or xid_<code> (e.g. xid_48): what "
                                               f"the faulty GPUs' own telemetry shows, got {telemetry!r}")
        return Fault(kind=kind, ranks=ranks, stage=stage, factor=float(factor), start=start, end=end,
                     every=every, repeats=int(repeats), host_side=host_side, telemetry=telemetry)

    def selector(self, d: dict[str, Any], p: tuple[Any, ...], topo: Topology, kind: str) -> np.ndarray:
        given = [k for k in ("ranks", "node", "pp") if k in d]
        if len(given) != 1:
            raise self.fail(p, f"a fault needs exactly one of ranks =, node = or pp = (got "
                               f"{', '.join(given) or 'none'})")
        key = given[0]
        if kind == "stage_imbalance" and key != "pp":
            raise self.fail((*p, key), "a stage_imbalance fault names its pipeline stage: pp = N")
        value = d[key]
        if isinstance(value, np.ndarray):  # programmatic scenarios may pass arrays
            value = value.tolist()
        if key == "ranks":
            ranks = self.guard((*p, key), parse_ranks, value)
            return self.guard((*p, key), topo.check_ranks, ranks)
        if key == "node":
            nodes = self.guard((*p, key), parse_ranks, value)
            return self.guard((*p, key), topo.node_ranks, nodes)
        stages = self.guard((*p, key), parse_ranks, value)
        bad = stages[(stages < 0) | (stages >= topo.pp)]
        if bad.size:
            raise self.fail((*p, key), f"pipeline stage {int(bad[0])} is outside 0..{topo.pp - 1}")
        return np.flatnonzero(np.isin(topo.pp_index, stages)).astype(np.int64)

    def fault_stage(self, d: dict[str, Any], p: tuple[Any, ...], kind: str) -> str | None:
        stage = d.get("stage")
        if stage is not None and not isinstance(stage, str):
            raise self.fail((*p, "stage"), f"must be a stage name, got {stage!r}")
        if kind in ("link_degradation", "silent_rank"):
            if stage is not None:
                raise self.fail((*p, "stage"), f"a {kind} fault takes no stage "
                                               f"({'it slows the transfers of the ranks' if kind == 'link_degradation' else 'the ranks stop reporting'})")
            return None
        want = "host" if kind == "host_stall" else "compute"
        if stage is None:
            return {"host_stall": "dataloader", "transient_stall": "attention"}.get(kind)
        if stage not in self.stages:
            raise self.fail((*p, "stage"), f"unknown stage {stage!r}; known: {', '.join(self.stages.names)}")
        if self.stages[stage].kind != want:
            choices = ", ".join(self.stages.of_kind(want))
            raise self.fail((*p, "stage"), f"a {kind} fault slows a {want} stage ({choices}); "
                                           f"{stage!r} is a {self.stages[stage].kind} stage")
        return stage

    def event(self, data: Any, i: int, topo: Topology) -> EventSpec:
        p = ("event", i)
        d = self.table(data, p, _EVENT_KEYS)
        name = self.guard((*p, "name"), job_name, d.get("name"), "name")
        if "at" not in d:
            raise self.fail((*p, "at"), "missing: the iteration the event happens at")
        at = self.guard((*p, "at"), nonnegative_int, d["at"], "at")
        node = d.get("node")
        rank = d.get("rank")
        if rank is not None:
            rank = int(self.guard((*p, "rank"), topo.check_ranks, [self.guard((*p, "rank"), nonnegative_int, rank, "rank")])[0])
        if node is not None:
            node = self.guard((*p, "node"), nonnegative_int, node, "node")
            if node >= topo.nodes:
                raise self.fail((*p, "node"), f"node {node} is outside 0..{topo.nodes - 1}")
            if rank is not None and int(topo.node_index[rank]) != node:
                raise self.fail((*p, "rank"), f"rank {rank} is on node {int(topo.node_index[rank])}, not {node}")
        elif rank is not None:
            node = int(topo.node_index[rank])
        kwargs = {}
        for key in ("severity", "source", "text"):
            if key in d:
                kwargs[key] = self.guard((*p, key), job_name if key != "text" else _text, d[key], key)
        return EventSpec(name=name, at=at, node=node, rank=rank, **kwargs)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ScenarioError(f"{what} must be a string, got {value!r}")
    return value


def _format_path(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "scenario"
