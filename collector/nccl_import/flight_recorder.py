"""Parse PyTorch Flight Recorder dumps into the record table.

**PyTorch Flight Recorder** (pytorch ``torch/csrc/distributed/c10d/FlightRecorder.hpp`` and
``FlightRecorderDetail.hpp``, ``tools/flight_recorder/components/loader.py``): the ring buffer
of ``TORCH_NCCL_TRACE_BUFFER_SIZE`` entries per process that ProcessGroupNCCL keeps; with
``TORCH_NCCL_ENABLE_TIMING=1`` completed entries carry their duration. A dump (pickle, as
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank writes it, default ``/tmp/nccl_trace_rank_<rank>``,
or the same dict as JSON from ``dump_json``) is a dict ``{"version", "pg_config", "pg_status",
"entries", ...}``: ``pg_config[name] = {"name", "desc", "ranks": "[0, 1, ...]"}`` (global ranks),
and each entry has ``record_id``, ``pg_id``, ``process_group`` (``[name, desc]``),
``collective_seq_id``, ``p2p_seq_id``, ``is_p2p``, ``op_id``, ``profiling_name``
(``nccl:all_reduce``, ``nccl:send 0->1``, ``nccl:recv 1<-0``, ...), ``time_created_ns``,
``duration_ms`` (only when timed and completed), ``state`` (``scheduled|started|completed``),
``time_discovered_started_ns``, ``time_discovered_completed_ns``, ``input_sizes``, ...
The rank is the file name's number after its prefix, as ``loader.read_dump`` takes it.

A pickled dump is read by :func:`collector.untrusted.plain_unpickle.loads_plain`: plain data only, any
global refused by name (``pickle.loads`` would run what a crafted dump names), and every
value is checked (finite, in range) before it becomes a record.

A dump names its rank and every process group's global members (gloo's dumps leave
``pg_config`` empty: the members are then the ranks whose dumps report the group). Its host is
what the file name holds before the prefix (``<host>.nccl_trace_rank_<rank>``, as
``TORCH_FR_DUMP_TEMP_FILE=/shared/fr/$(hostname).nccl_trace_rank_`` writes it), else unknown.
A record's order in the rank is its ``record_id``.

**Without timing** (PyTorch's default; gloo's entries stay ``state: scheduled`` with no
duration) an entry still says when its rank arrived: ``time_created_ns``. Its row then has no
``ms`` (NaN) and its arrival in ``start_us``; :mod:`collector.nccl_import.arrivals` turns the
arrivals of every rank into waits. A record's end is ``time_discovered_completed_ns``, else
``time_created_ns + duration_ms``, else (no duration) NaN until the waits are known.

A dump cut short (a rank still writing it) or empty raises
:class:`~collector.nccl_import.records.Incomplete`: the import skips it with a warning.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import pandas as pd

from collector.nccl_import.records import (
    MAX_DURATION_MS,
    MAX_RANKS,
    MAX_SEQ,
    MAX_TIME_US,
    RECORD_COLUMNS,
    Incomplete,
    NcclError,
    get_field,
    number,
)
from collector.untrusted.bounded_read import DEFAULT_LIMIT, FileLimit, read_bounded
from collector.untrusted.plain_unpickle import RefusedPickle, loads_plain

#: Flight Recorder ``profiling_name`` (after ``nccl:``) -> operation, first match wins.
_FR_OPS = (("all_to_all", "all_to_all"), ("alltoall", "all_to_all"), ("reduce_scatter", "reduce_scatter"),
           ("all_gather", "all_gather"), ("allgather", "all_gather"), ("all_reduce", "all_reduce"),
           ("allreduce", "all_reduce"), ("broadcast", "broadcast"), ("send", "send"), ("recv", "recv"),
           ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"))

FR_ENTRY_FIELDS = ("record_id", "process_group", "collective_seq_id", "p2p_seq_id", "profiling_name",
                   "time_created_ns")
FR_PREFIX = "nccl_trace_rank_"
#: Columns of a dump's rows: the record table's, its members, and the rank's arrival (epoch us).
FR_COLUMNS = (*RECORD_COLUMNS, "members", "start_us")


def _fr_rank(path: Path) -> int:
    name = path.name
    m = re.search(r"(\d+)(?:\.[A-Za-z]+)?$", name)
    if not m:
        raise NcclError(f"{path}: a Flight Recorder dump's name ends with its rank "
                        f"({FR_PREFIX}<rank>, as TORCH_NCCL_DEBUG_INFO_TEMP_FILE writes it)")
    if len(m.group(1)) > 7 or int(m.group(1)) >= MAX_RANKS:
        raise NcclError(f"{path}: rank {m.group(1)} in the file name is not below {MAX_RANKS}")
    return int(m.group(1))


def fr_host(path: Path) -> str | None:
    """The host a dump's file name holds before :data:`FR_PREFIX` (``node-7.nccl_trace_rank_3``:
    ``node-7``), else None."""
    head = path.name.split(FR_PREFIX, 1)[0] if FR_PREFIX in path.name else ""
    head = head.rstrip("._-")
    return head or None


def _fr_op(name: str, where: str) -> str:
    base = name.split(":", 1)[1] if ":" in name else name
    base = base.split(" ", 1)[0].lower()
    for key, op in _FR_OPS:
        if key in base:
            return op
    return "other"


def _fr_ranks(spec, where) -> list[int]:
    if isinstance(spec, str):
        try:
            spec = ast.literal_eval(spec)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise NcclError(f"{where}: ranks {spec[:60]!r} is not a list of ranks") from None
    if not isinstance(spec, list | tuple) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_RANKS for r in spec):
        raise NcclError(f"{where}: ranks {str(spec)[:60]!r} is not a list of ranks (each in 0..{MAX_RANKS - 1})")
    return [int(r) for r in spec]


def _members(config, source: str) -> dict[str, tuple[int, ...]]:
    """Global members of every process group ``pg_config`` names."""
    members: dict[str, tuple[int, ...]] = {}
    if isinstance(config, dict):
        for name, pg in config.items():
            if isinstance(pg, dict) and "ranks" in pg:
                ranks = tuple(sorted(_fr_ranks(pg["ranks"], f"{source}: pg_config[{name!r}]")))
                if ranks:   # gloo writes {"": {"ranks": "[]"}}: members unknown
                    members[str(name)] = ranks
    return members


def _times(e: dict, where: str) -> tuple[float, float, float]:
    """An entry's duration (ms, NaN when untimed), its arrival and its end (epoch us; the end
    NaN when neither a completion nor a duration says it)."""
    timed = e.get("duration_ms") is not None
    ms = float(number(e["duration_ms"], "duration_ms", where, most=MAX_DURATION_MS)) if timed else float("nan")
    # an integer of ns divided as such: float(ns) would lose a quarter microsecond
    created_us = number(e["time_created_ns"], "time_created_ns", where, most=MAX_TIME_US * 1000) / 1000
    done = e.get("time_discovered_completed_ns") or 0
    if isinstance(done, int | float) and not isinstance(done, bool) and done > 0:
        end_us = float(number(done, "time_discovered_completed_ns", where, most=MAX_TIME_US * 1000)) / 1000.0
    else:
        end_us = created_us + ms * 1000.0
    if end_us > MAX_TIME_US:
        raise NcclError(f"{where}: ends after the latest time a store holds (2262)")
    return ms, float(created_us), end_us


def _entry_row(e: dict, where: str, source: str, i: int, rank: int,
               members: dict[str, tuple[int, ...]], host: str | None) -> dict:
    """One entry's row of the record table (``ms`` NaN when the entry has no duration)."""
    for k in FR_ENTRY_FIELDS:
        get_field(e, k, where)
    pg = e["process_group"]
    if not isinstance(pg, list | tuple) or not pg:
        raise NcclError(f"{where}: field 'process_group' must be [name, desc], got {pg!r}")
    comm = str(pg[0])
    is_p2p = bool(e.get("is_p2p", False))
    ms, start_us, end_us = _times(e, where)
    seq = "p2p_seq_id" if is_p2p else "collective_seq_id"
    return {"source": source, "line": i, "rank": rank, "comm": comm,
            "n_ranks": len(members.get(comm, ())) or -1, "op": _fr_op(str(e["profiling_name"]), where),
            "sn": int(number(e[seq], seq, where, True, MAX_SEQ)), "ms": ms, "end_us": end_us,
            "order": float(number(e["record_id"], "record_id", where, True, MAX_SEQ)), "host": host,
            "members": members.get(comm), "start_us": start_us}


def flight_recorder_records(dump: dict, source: str, rank: int, host: str | None = None) -> pd.DataFrame:
    """One rank's Flight Recorder dump (the dict) -> its rows (:data:`FR_COLUMNS`): every entry,
    timed or not (:mod:`collector.nccl_import.arrivals` decides which timing the import uses)."""
    entries = get_field(dump, "entries", source)
    config = dump.get("pg_config", {})
    if not isinstance(entries, list):
        raise NcclError(f"{source}: 'entries' must be a list")
    members = _members(config, source)
    rows, bad, first = [], 0, ""
    for i, e in enumerate(entries):
        try:
            rows.append(_entry_row(e, f"{source}: entry {i}", source, i, rank, members, host))
        except NcclError as exc:   # every entry is checked, so the count is the whole dump's
            bad, first = bad + 1, first or str(exc)
    if bad:
        raise NcclError(first + (f" ({bad} bad entries in all; the first is shown)" if bad > 1 else ""))
    return pd.DataFrame(rows, columns=list(FR_COLUMNS))


def read_flight_recorder(path: Path, limit: FileLimit = DEFAULT_LIMIT) -> pd.DataFrame:
    """A Flight Recorder dump file (pickle, or JSON by its first byte), read within ``limit``;
    a pickle is unpickled as plain data only (any global refused by name). An empty dump, or
    one cut short, raises :class:`~collector.nccl_import.records.Incomplete`."""
    data = read_bounded(path, limit, NcclError)
    if not data.strip():
        raise Incomplete(f"{path}: empty (a dump still being written)")
    try:
        if data[:1] == b"{":
            dump = json.loads(data)
        else:
            dump = loads_plain(data, str(path), "Flight Recorder dumps")
    except RefusedPickle as exc:
        raise NcclError(str(exc)) from None
    except (EOFError, pickle.UnpicklingError, json.JSONDecodeError) as exc:
        if isinstance(exc, EOFError) or "truncated" in str(exc) or not data.rstrip().endswith((b".", b"}")):
            raise Incomplete(f"{path}: cut short ({type(exc).__name__}: {str(exc)[:80]}): a dump still "
                             f"being written") from None
        raise NcclError(f"{path}: not a Flight Recorder dump (pickle or JSON): {type(exc).__name__}: "
                        f"{str(exc)[:200]}") from None
    except Exception as exc:  # a broken pickle raises anything (MemoryError for a length it lies about)
        raise NcclError(f"{path}: not a Flight Recorder dump (pickle or JSON): {type(exc).__name__}: "
                        f"{str(exc)[:200]}") from None
    if not isinstance(dump, dict):
        raise NcclError(f"{path}: a Flight Recorder dump is a dict with 'entries', got {type(dump).__name__}")
    return flight_recorder_records(dump, str(path), _fr_rank(path), fr_host(path))
