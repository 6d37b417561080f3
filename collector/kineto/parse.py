"""Read a Kineto trace: the JSON file, the rank and host it records, and its events by kind.

:func:`parse_events` sorts a trace's complete (``ph == "X"``) events into iterations
(``ProfilerStep#N``), host spans, device events and CUDA launches, and keeps the
forward/backward flows; nothing is named or timed here. Every event's fields are checked
(:mod:`~collector.kineto.event_fields`): an event that fails is refused and counted
(``ParsedTrace.refused``), the others kept. :func:`load_trace` reads a file within a
:class:`~collector.untrusted.bounded_read.FileLimit`, gunzipping it as a stream.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import collector.kineto.event_fields as ef
from collector.untrusted.bounded_read import (
    DEFAULT_LIMIT,
    MB,
    FileLimit,
    open_bounded,
    read_bounded,
)
from rankscope.topology import parse_ranks

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
MEMORY_CATS = frozenset({"gpu_memcpy", "gpu_memset"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime"})
#: Copies of host annotations drawn on the GPU timeline: not host work, not iterations.
GPU_ANNOTATION_CAT = "gpu_user_annotation"
#: Trace-level keys that may carry the host name: what the user added with
#: ``prof.add_metadata("hostname", ...)`` first, Kineto's own ``host_name`` last (in a
#: container that is the container's name, not the machine's).
HOST_KEYS = ("hostname", "host", "host_name")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
#: ``tensorboard_trace_handler``'s default file name: ``<host>_<pid>.<time>.pt.trace.json[.gz]``.
_HANDLER_NAME = re.compile(r"^(?P<worker>(?P<host>.+)_\d+)\.\d+\.pt\.trace\.json(?:\.gz)?$")


class TraceError(ValueError):
    """A trace file that cannot be read or mapped to iterations and ranks."""


@dataclass
class ParsedTrace:
    """A trace's events by kind (times in the trace's microseconds)."""

    #: ``(ts, end, N)`` of every ``ProfilerStep#N``, sorted.
    steps: list[tuple[float, float, int]] = field(default_factory=list)
    #: ``(name, pid, tid, ts, end, cat)`` of every host event.
    spans: list[tuple[str, Any, Any, float, float, str]] = field(default_factory=list)
    #: Forward/backward flow starts by id: ``(pid, tid, ts)``.
    flows_s: dict[Any, tuple[Any, Any, float]] = field(default_factory=dict)
    #: Forward/backward flow ends: ``(id, pid, tid, ts)``.
    flows_f: list[tuple[Any, Any, Any, float]] = field(default_factory=list)
    #: CUDA/HIP launches by correlation id: ``(pid, tid, ts)``.
    launches: dict[Any, tuple[Any, Any, float]] = field(default_factory=dict)
    #: ``(name, cat, correlation, ts, end, device, collective)`` of every device event.
    device_events: list[tuple[str, str, Any, float, float, Any, str | None]] = field(default_factory=list)
    #: Events refused for a field that failed its check, and the first of them (file, event, field).
    refused: int = 0
    first_refused: str = ""


def parse_events(data: Mapping[str, Any], path: str | Path = "<trace>") -> ParsedTrace:
    """The events of a loaded trace by kind; raises when it has no ``ProfilerStep#N``. An event
    whose fields fail their checks is refused (counted in ``refused``), the others kept."""
    out = ParsedTrace()
    for i, e in enumerate(data["traceEvents"]):
        try:
            _add_event(out, ef.event(e))
        except ef.BadField as bad:
            out.refused += 1
            out.first_refused = out.first_refused or f"{path} event {i}, {bad}"
    if not out.steps:
        raise TraceError(f"{path}: no ProfilerStep#N events; record the trace with a torch.profiler "
                         f"schedule and call prof.step() once per iteration")
    out.steps.sort()
    return out


def _add_event(out: ParsedTrace, e: Mapping[str, Any]) -> None:
    """File one event: a complete event, or a forward/backward flow's start or end."""
    ph = e.get("ph")
    if ph == "X":
        _add_complete(out, e)
    elif ph in ("s", "f") and e.get("cat") == "fwdbwd":
        key, pid, tid = ef.key_value(e, "id"), ef.key_value(e, "pid"), ef.key_value(e, "tid")
        if ph == "s":
            out.flows_s[key] = (pid, tid, ef.timestamp(e))
        else:
            out.flows_f.append((key, pid, tid, ef.timestamp(e)))


def _add_complete(out: ParsedTrace, e: Mapping[str, Any]) -> None:
    """File one complete event: an iteration, a device event or a host span (and launch)."""
    cat = ef.text(e, "cat")
    if cat == GPU_ANNOTATION_CAT:
        return
    name = ef.text(e, "name")
    ts = ef.timestamp(e, default=0.0)
    end = ts + ef.duration(e)
    m = _STEP.match(name)
    if m:
        out.steps.append((ts, end, ef.step_number(m.group(1))))
        return
    args = ef.arguments(e)
    if cat in DEVICE_CATS:
        out.device_events.append((name, cat, args.get("correlation"), ts, end, args.get("device"),
                                  args.get("Collective name")))
        return
    pid, tid = ef.key_value(e, "pid"), ef.key_value(e, "tid")
    out.spans.append((name, pid, tid, ts, end, cat))
    if cat in LAUNCH_CATS and "correlation" in args:
        out.launches[args["correlation"]] = (pid, tid, ts)


def load_trace(path: str | Path, limit: FileLimit = DEFAULT_LIMIT) -> dict[str, Any]:
    """The JSON object of a Kineto trace file (``.json`` or ``.json.gz``), read as a stream of
    at most ``limit`` bytes (after decompression); content that cannot start a JSON trace is
    refused at its first bytes."""
    p = Path(path)
    _check_start(p, limit)
    raw = read_bounded(p, limit, TraceError, gunzip=True)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise TraceError(f"{p} is not a JSON trace: {type(exc).__name__}: {str(exc)[:200]}") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{p} has no traceEvents list: not a Chrome/Kineto trace")
    return data


def _check_start(path: Path, limit: FileLimit) -> None:
    """Refuse a file that does not start as a JSON trace does (``{`` or ``[`` after blanks),
    from its first MB (decompressed), so junk such as a gzip bomb of zeros costs no more."""
    with open_bounded(path, limit, TraceError, gunzip=True) as fh:
        head = fh.read(MB).removeprefix(b"\xef\xbb\xbf").lstrip()
    if head[:1] not in (b"{", b"["):
        raise TraceError(f"{path} is not a JSON trace: it starts with {bytes(head[:16])!r}, not {{ or [")


def trace_rank(data: Mapping[str, Any], path: str | Path, rank: int | None = None) -> tuple[int, int | None]:
    """``(rank, world)``: from ``distributedInfo``, else ``rank``, else ``rankN`` in the file name."""
    info = data.get("distributedInfo")
    info = info if isinstance(info, Mapping) else {}
    try:
        world = ef.rank_number(info.get("world_size"), "distributedInfo.world_size", ef.MAX_RANKS, True)
        if "rank" in info:
            return ef.rank_number(info["rank"], "distributedInfo.rank", ef.MAX_RANKS - 1), world
        if rank is not None:
            return rank, world
        m = _RANK_IN_NAME.search(Path(path).name)
        if m:
            digits = m.group(1)
            return ef.rank_number(int(digits) if len(digits) < 9 else digits, "rank in the file name",
                                  ef.MAX_RANKS - 1), world
    except ef.BadField as bad:
        raise TraceError(f"{path}: {bad}") from None
    raise TraceError(f"{path}: no rank in the trace (distributedInfo) or the file name (rankN); pass --rank")


def trace_host(data: Mapping[str, Any], path: str | Path) -> str | None:
    """The host the trace was recorded on: the trace's ``hostname`` / ``host`` entry (added with
    ``prof.add_metadata``) or Kineto's ``host_name``, else the ``<host>_<pid>.<time>.pt.trace.json``
    file name of ``tensorboard_trace_handler``'s default worker name; None when neither says."""
    for key in HOST_KEYS:
        v = data.get(key)
        if isinstance(v, str) and v.strip():
            return v.strip()
    m = _HANDLER_NAME.match(Path(path).name)
    # a worker name such as "rank_3" or "rank3_<pid>" names a rank, not a host
    if m and not any(_RANK_IN_NAME.fullmatch(m.group(g)) for g in ("worker", "host")):
        return m.group("host")
    return None


def read_host_map(path: str | Path) -> dict[int, str]:
    """Rank -> host from a small file: JSON (``.json``) or TOML (anything else).

    Keys are ranks or rank ranges (``"0-7"``, ``"8,10-11"``), values host names;
    the mapping may stand at the top level or in a ``hosts`` table::

        [hosts]
        0-7 = "gpu-node-017"
        8-15 = "gpu-node-018"
    """
    p = Path(path)
    try:
        text = read_bounded(p, FileLimit(), TraceError).decode("utf-8")
        table = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, ValueError, RecursionError) as exc:   # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise TraceError(f"cannot read host map {p}: {exc}") from None
    if isinstance(table, dict) and isinstance(table.get("hosts"), dict):
        table = table["hosts"]
    if not isinstance(table, dict) or not table:
        raise TraceError(f"host map {p}: expected a table of rank (or 'N-M') = host name")
    out: dict[int, str] = {}
    for spec, host in table.items():
        if not isinstance(host, str) or not host.strip():
            raise TraceError(f"host map {p}: ranks {spec!r} need a host name, got {host!r}")
        try:
            ranks = parse_ranks(spec)
        except ValueError as exc:
            raise TraceError(f"host map {p}: {exc}") from None
        for r in ranks.tolist():
            if out.get(r, host.strip()) != host.strip():
                raise TraceError(f"host map {p}: rank {r} is mapped to {out[r]!r} and {host.strip()!r}")
            out[r] = host.strip()
    return out
