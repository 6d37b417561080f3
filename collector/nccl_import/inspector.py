"""Parse NCCL Inspector logs into the record table.

**NCCL Inspector** (NVIDIA/nccl ``ext-profiler/inspector``, README and ``inspector.cc``): NCCL's
profiler plugin, enabled by ``NCCL_PROFILER_PLUGIN=.../libnccl-profiler-inspector.so``,
``NCCL_INSPECTOR_ENABLE=1`` and ``NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=<us>``. Its
dump thread appends to ``<NCCL_INSPECTOR_DUMP_DIR>/<hostname>-pid<pid>.log`` (default directory
``nccl-inspector-<SLURM_JOBID>`` or ``nccl-inspector-unknown-jobid``) one JSON object per line,
per completed collective per communicator::

    {"header": {"id": "0x7f8c496ae9f661", "rank": 2, "n_ranks": 8, "nnodes": 1},
     "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism":
                  "nccl_profiler_interface", "dump_timestamp_us": 1748030377748202,
                  "hostname": "example-hostname", "pid": 1639453},
     "coll_perf": {"coll": "AllReduce", "coll_sn": 1407, "coll_msg_size_bytes": 17179869184,
                   "coll_exec_time_us": 61974, "coll_timing_source": "kernel_gpu",
                   "coll_algobw_gbs": 277.2, "coll_busbw_gbs": 485.1}}

``header.id`` is the communicator's hash (the same on every member), ``header.rank`` the rank
*inside that communicator*, ``coll`` one of ``AllGather AllReduce Broadcast Recv Reduce
ReduceScatter SendRecv Send``, ``coll_sn`` the communicator's collective sequence number,
``coll_exec_time_us`` the kernel execution time. With ``NCCL_INSPECTOR_DUMP_VERBOSE=1``,
``coll_perf.event_trace_ts`` adds ``coll_start_ts``, ``coll_stop_ts`` and ``kernel_events``
(``kernel_start_ts`` / ``kernel_stop_ts`` per channel), epoch microseconds. The dump thread
writes the *latest* completed collective of each communicator once per interval: an interval
longer than the gap between two collectives of a communicator loses records (``coll_sn``
gaps, counted in ``NcclImport.missing``); keep it well below that (the README uses 500 us).

**Global ranks and communicators.** An Inspector file is one process: its global rank is its
rank in the job-wide communicator (``n_ranks`` equal to the largest ``n_ranks`` seen), and a
communicator's members are the processes whose files report its ``id``.

**Time.** A record's end is the last ``kernel_stop_ts`` when verbose, else ``dump_timestamp_us``
(later by at most one dump interval); its order in the rank is that end, then its line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from collector.nccl_import.records import (
    MAX_DURATION_MS,
    MAX_RANKS,
    MAX_SEQ,
    MAX_TIME_US,
    NcclError,
    get_field,
    number,
    with_members,
)
from collector.untrusted.bounded_read import DEFAULT_LIMIT, FileLimit, open_bounded

#: Inspector ``coll`` -> operation.
INSPECTOR_OPS = {"AllGather": "all_gather", "AllReduce": "all_reduce", "Broadcast": "broadcast",
                 "Recv": "recv", "Reduce": "reduce", "ReduceScatter": "reduce_scatter",
                 "SendRecv": "all_to_all", "Send": "send", "AllToAll": "all_to_all"}

INSPECTOR_FIELDS = {"header": ("id", "rank", "n_ranks"), "metadata": ("dump_timestamp_us",),
                    "coll_perf": ("coll", "coll_sn", "coll_exec_time_us")}


def _end_us(meta: dict, perf: dict, where: str) -> float:
    """The last kernel's stop when the record is verbose, else the dump thread's time."""
    end_us = float(number(meta["dump_timestamp_us"], "metadata.dump_timestamp_us", where, most=MAX_TIME_US))
    trace = perf.get("event_trace_ts")
    events = trace.get("kernel_events") if isinstance(trace, dict) else None
    if isinstance(events, list) and events:
        stops = [k.get("kernel_stop_ts", 0) for k in events if isinstance(k, dict)]
        stops = [s for s in stops if isinstance(s, int | float) and not isinstance(s, bool) and s > 0]
        if stops:
            end_us = float(number(max(stops), "kernel_stop_ts", where, most=MAX_TIME_US))
    return end_us


def _parse_line(text: str, source: str, i: int) -> dict:
    where = f"{source}:{i}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NcclError(f"{where}: not a JSON record ({exc.msg} at column {exc.colno})") from None
    head, meta, perf = (get_field(obj, k, where) for k in ("header", "metadata", "coll_perf"))
    for part, keys in INSPECTOR_FIELDS.items():
        for k in keys:
            get_field(obj[part], k, f"{where}: {part}")
    coll = perf["coll"]
    if not isinstance(coll, str) or coll not in INSPECTOR_OPS:
        raise NcclError(f"{where}: coll_perf.coll {str(coll)[:40]!r} is not one of {', '.join(INSPECTOR_OPS)}")
    if not isinstance(head["id"], str | int) or isinstance(head["id"], bool):
        raise NcclError(f"{where}: field 'header.id' must be a communicator id, got {str(head['id'])[:40]!r}")
    end_us = _end_us(meta, perf, where)
    host = meta.get("hostname", "")
    return {
        "source": source, "line": i, "comm": str(head["id"]),
        "comm_rank": int(number(head["rank"], "header.rank", where, True, MAX_RANKS - 1)),
        "n_ranks": int(number(head["n_ranks"], "header.n_ranks", where, True, MAX_RANKS)),
        "op": INSPECTOR_OPS[coll], "sn": int(number(perf["coll_sn"], "coll_perf.coll_sn", where, True, MAX_SEQ)),
        "ms": float(number(perf["coll_exec_time_us"], "coll_perf.coll_exec_time_us", where,
                           most=MAX_DURATION_MS * 1000)) / 1000.0,
        "end_us": end_us, "host": host if isinstance(host, str) and host else None,
    }


def parse_inspector_lines(lines: Iterable[str], source: str, first_line: int = 1) -> list[dict]:
    """Inspector JSON lines -> raw records (process-local: ``comm_rank``, not the global rank).

    Every line is checked; one bad line refuses them all (a record dropped would move the
    collectives around it into another iteration), naming the first and counting the rest."""
    out, bad, first = [], 0, ""
    for i, text in enumerate(lines, start=first_line):
        text = text.strip()
        if text:
            try:
                out.append(_parse_line(text, source, i))
            except NcclError as exc:
                bad, first = bad + 1, first or str(exc)
    if bad:
        raise NcclError(first + (f" ({bad} bad records in all; the first is shown)" if bad > 1 else ""))
    return out


def inspector_records(raw: list[dict], unranked: list[str] | None = None) -> pd.DataFrame:
    """Raw Inspector records of several processes -> the record table (global ranks, members).

    A file with no record of the job-wide communicator has no known global rank: an error,
    or, given the list ``unranked``, left out with its message appended there."""
    if not raw:
        raise NcclError("no Inspector record in the given files")
    df = pd.DataFrame(raw)
    world = int(df["n_ranks"].max())
    top = df[df["n_ranks"] == world]
    if unranked is not None:
        lost = sorted(set(df["source"]) - set(top["source"]))
        unranked += [f"{s}: no record of a job-wide communicator (n_ranks {world}), so its global rank "
                     f"is unknown; import the files of every rank" for s in lost]
        df = df[df["source"].isin(set(top["source"]))]
    per_file = top.groupby("source")["comm_rank"].nunique()
    multi = per_file[per_file > 1]
    if len(multi):
        raise NcclError(f"{multi.index[0]}: one process reports {int(multi.iloc[0])} ranks of the job-wide "
                        f"communicator (one process driving several GPUs is not supported)")
    rank_of = top.groupby("source")["comm_rank"].first()
    missing = sorted(set(df["source"]) - set(rank_of.index))
    if missing:
        raise NcclError(f"{missing[0]}: no record of a job-wide communicator (n_ranks {world}), so its "
                        f"global rank is unknown; import the files of every rank")
    dup = rank_of[rank_of.duplicated(keep=False)]
    if len(dup):
        raise NcclError(f"{', '.join(dup.index[:2])}: both are global rank {int(dup.iloc[0])}")
    df["rank"] = rank_of.loc[df["source"]].to_numpy()
    df["order"] = df["end_us"]
    return with_members(df)


def read_inspector(path: Path, start_line: int = 1, offset: int = 0,
                   limit: FileLimit = DEFAULT_LIMIT) -> tuple[list[dict], int, int]:
    """Complete lines of an Inspector log from byte ``offset``: (raw records, next line, next offset).

    The lines are streamed, at most ``limit`` bytes of them per call (more is refused, naming
    the file and the flag). A last line without its newline is being written: it is left for
    the next read."""
    seen = [0, 0]   # complete lines, their bytes

    def complete(fh) -> Iterable[str]:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return
            seen[0], seen[1] = seen[0] + 1, seen[1] + len(raw)
            yield raw.decode("utf-8", errors="replace")

    with open_bounded(path, limit, NcclError, offset=offset) as fh:
        records = parse_inspector_lines(complete(fh), str(path), start_line)
    return records, start_line + seen[0], offset + seen[1]
