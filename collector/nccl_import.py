"""Collective timings recorded without code changes -> ``stage_latency`` points.

Two sources write, for every collective a rank runs, how long it took; neither needs a change
to the training script, only environment variables.

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
gaps, counted in :attr:`NcclImport.missing`); keep it well below that (the README uses 500 us).

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

Both are read into one record table (:data:`RECORD_COLUMNS`): per record the global rank,
communicator, its members, the operation, sequence number, duration and a timestamp.

**Global ranks and communicators.** A Flight Recorder dump names its rank and every process
group's global members. An Inspector file is one process: its global rank is its rank in the
job-wide communicator (``n_ranks`` equal to the largest ``n_ranks`` seen), and a
communicator's members are the processes whose files report its ``id``.

**Kind of a communicator and stage of a collective** (:func:`comm_kinds`, :func:`stage_of`):
a communicator whose member set is a group of the job's layout (``--tp/--pp/--dp/--ep``) has
that kind (``tp``, ``dp``, ``ep``, ``edp``, ``pipeline``), tried in that order; one of two
members that only sends and receives is ``pipeline``; one spanning the whole job is ``world``.
Then:

========================================= =============================== =================
operation, communicator kind              stage                           group
========================================= =============================== =================
all-to-all (or SendRecv) on ``ep``        ``dispatch``, ``combine``       ep
                                          (alternating in an iteration)
send / recv on ``pipeline``               ``pp_send`` / ``pp_recv``       pipeline
reduce-scatter, all-reduce on ``dp``      ``reduce_scatter``              dp
all-gather on ``dp``                      ``all_gather``                  dp
reduce-scatter, all-reduce on ``edp``     ``expert_reduce``               edp
anything else (tp, world, broadcast, ...) ``comm_other``                  dp
========================================= =============================== =================

(An all-reduce is a reduce-scatter plus an all-gather; as the stage timer's DDP hook does, it
is the DP gradient sync ``reduce_scatter``.) A stage's time in an iteration is the sum of its
records' durations (ms).

**Iterations.** The *anchor* communicator (default: the one with the most members, ties to
the lowest id; ``anchor=``) runs ``per_iteration`` collectives per iteration (default 1, e.g.
one gradient all-reduce): its record of sequence number ``sn`` ends iteration
``(sn - first_sn) // per_iteration`` when ``sn`` is the last of that block. Every other record
of a rank belongs to the iteration of the first anchor record of the same rank at or after it
in that rank's own order (Flight Recorder: ``record_id``; Inspector: its end timestamp, then
its line). Records after a rank's last anchor record belong to an iteration not finished yet
and are not written. An iteration is written for the ranks whose anchor record closing it was
recorded.

**Time.** A point's time is its rank's own end of the iteration's anchor collective: Flight
Recorder ``time_discovered_completed_ns`` (else ``time_created_ns + duration_ms``); Inspector
the last ``kernel_stop_ts`` when verbose, else ``dump_timestamp_us`` (later by at most one dump
interval). ``iteration_ms`` is the time between a rank's consecutive anchor ends (the first
iteration: from its first record). Times are kept strictly increasing per rank (1 ms apart at
least).
"""

from __future__ import annotations

import ast
import json
import pickle
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.topology import Topology, TopologyError

#: Columns of the normalised record table both readers produce.
RECORD_COLUMNS = ("source", "line", "rank", "comm", "n_ranks", "op", "sn", "ms", "end_us", "order", "host")

#: Inspector ``coll`` -> operation.
INSPECTOR_OPS = {"AllGather": "all_gather", "AllReduce": "all_reduce", "Broadcast": "broadcast",
                 "Recv": "recv", "Reduce": "reduce", "ReduceScatter": "reduce_scatter",
                 "SendRecv": "all_to_all", "Send": "send", "AllToAll": "all_to_all"}

#: Flight Recorder ``profiling_name`` (after ``nccl:``) -> operation, first match wins.
_FR_OPS = (("all_to_all", "all_to_all"), ("alltoall", "all_to_all"), ("reduce_scatter", "reduce_scatter"),
           ("all_gather", "all_gather"), ("allgather", "all_gather"), ("all_reduce", "all_reduce"),
           ("allreduce", "all_reduce"), ("broadcast", "broadcast"), ("send", "send"), ("recv", "recv"),
           ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"))

INSPECTOR_FIELDS = {"header": ("id", "rank", "n_ranks"), "metadata": ("dump_timestamp_us",),
                    "coll_perf": ("coll", "coll_sn", "coll_exec_time_us")}
FR_ENTRY_FIELDS = ("record_id", "process_group", "collective_seq_id", "p2p_seq_id", "profiling_name",
                   "time_created_ns")
FR_PREFIX = "nccl_trace_rank_"

#: Comm kinds tried against the layout, in order.
_LAYOUT_KINDS = ("tp", "dp", "ep", "edp", "pipeline")


class NcclError(ValueError):
    """Collective records that cannot be imported (the message names the file, record, field)."""


# ------------------------------------------------------------------------------------ readers
def _get(obj, key, where):
    if not isinstance(obj, dict) or key not in obj:
        raise NcclError(f"{where}: missing field {key!r}")
    return obj[key]


def _number(value, key, where, integer=False):
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value) or value < 0:
        raise NcclError(f"{where}: field {key!r} must be a non-negative number, got {value!r}")
    if integer and int(value) != value:
        raise NcclError(f"{where}: field {key!r} must be an integer, got {value!r}")
    return value


def parse_inspector_lines(lines: Iterable[str], source: str, first_line: int = 1) -> list[dict]:
    """Inspector JSON lines -> raw records (process-local: ``comm_rank``, not the global rank)."""
    out = []
    for i, text in enumerate(lines, start=first_line):
        text = text.strip()
        if not text:
            continue
        where = f"{source}:{i}"
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NcclError(f"{where}: not a JSON record ({exc.msg} at column {exc.colno})") from None
        head, meta, perf = (_get(obj, k, where) for k in ("header", "metadata", "coll_perf"))
        for part, keys in INSPECTOR_FIELDS.items():
            for k in keys:
                _get(obj[part], k, f"{where}: {part}")
        coll = perf["coll"]
        if coll not in INSPECTOR_OPS:
            raise NcclError(f"{where}: coll_perf.coll {coll!r} is not one of {', '.join(INSPECTOR_OPS)}")
        end_us = float(_number(meta["dump_timestamp_us"], "metadata.dump_timestamp_us", where))
        trace = perf.get("event_trace_ts")
        if isinstance(trace, dict) and trace.get("kernel_events"):
            stops = [k.get("kernel_stop_ts", 0) for k in trace["kernel_events"] if isinstance(k, dict)]
            stops = [s for s in stops if isinstance(s, int | float) and s > 0]
            if stops:
                end_us = float(max(stops))
        out.append({
            "source": source, "line": i, "comm": str(head["id"]),
            "comm_rank": int(_number(head["rank"], "header.rank", where, True)),
            "n_ranks": int(_number(head["n_ranks"], "header.n_ranks", where, True)),
            "op": INSPECTOR_OPS[coll], "sn": int(_number(perf["coll_sn"], "coll_perf.coll_sn", where, True)),
            "ms": float(_number(perf["coll_exec_time_us"], "coll_perf.coll_exec_time_us", where)) / 1000.0,
            "end_us": end_us, "host": str(meta.get("hostname", "")) or None,
        })
    return out


def inspector_records(raw: list[dict]) -> pd.DataFrame:
    """Raw Inspector records of several processes -> the record table (global ranks, members)."""
    if not raw:
        raise NcclError("no Inspector record in the given files")
    df = pd.DataFrame(raw)
    world = int(df["n_ranks"].max())
    top = df[df["n_ranks"] == world]
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
    return _finish(df)


def read_inspector(path: Path, start_line: int = 1, offset: int = 0) -> tuple[list[dict], int, int]:
    """Complete lines of an Inspector log from byte ``offset``: (raw records, next line, next offset).

    A last line without its newline is being written: it is left for the next read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError as exc:
        raise NcclError(f"{path}: cannot read: {exc}") from None
    cut = data.rfind(b"\n") + 1
    text = data[:cut].decode("utf-8", errors="replace")
    lines = text.split("\n")[:-1] if cut else []
    return parse_inspector_lines(lines, str(path), start_line), start_line + len(lines), offset + cut


def _fr_rank(path: Path) -> int:
    name = path.name
    m = re.search(r"(\d+)(?:\.[A-Za-z]+)?$", name)
    if not m:
        raise NcclError(f"{path}: a Flight Recorder dump's name ends with its rank "
                        f"({FR_PREFIX}<rank>, as TORCH_NCCL_DEBUG_INFO_TEMP_FILE writes it)")
    return int(m.group(1))


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
        except (ValueError, SyntaxError):
            raise NcclError(f"{where}: ranks {spec!r} is not a list of ranks") from None
    if not isinstance(spec, list | tuple) or not all(isinstance(r, int) for r in spec):
        raise NcclError(f"{where}: ranks {spec!r} is not a list of ranks")
    return [int(r) for r in spec]


def flight_recorder_records(dump: dict, source: str, rank: int) -> pd.DataFrame:
    """One rank's Flight Recorder dump (the dict) -> its rows of the record table."""
    entries = _get(dump, "entries", source)
    config = dump.get("pg_config", {})
    if not isinstance(entries, list):
        raise NcclError(f"{source}: 'entries' must be a list")
    members: dict[str, tuple[int, ...]] = {}
    if isinstance(config, dict):
        for name, pg in config.items():
            if isinstance(pg, dict) and "ranks" in pg:
                members[str(name)] = tuple(sorted(_fr_ranks(pg["ranks"], f"{source}: pg_config[{name!r}]")))
    rows = []
    for i, e in enumerate(entries):
        where = f"{source}: entry {i}"
        for k in FR_ENTRY_FIELDS:
            _get(e, k, where)
        if "duration_ms" not in e or e["duration_ms"] is None:
            continue   # not completed, or not timed (TORCH_NCCL_ENABLE_TIMING unset)
        pg = e["process_group"]
        if not isinstance(pg, list | tuple) or not pg:
            raise NcclError(f"{where}: field 'process_group' must be [name, desc], got {pg!r}")
        comm = str(pg[0])
        is_p2p = bool(e.get("is_p2p", False))
        ms = float(_number(e["duration_ms"], "duration_ms", where))
        created = float(_number(e["time_created_ns"], "time_created_ns", where))
        done = e.get("time_discovered_completed_ns") or 0
        end_us = float(done) / 1000.0 if isinstance(done, int | float) and done > 0 else created / 1000.0 + ms * 1000.0
        rows.append({"source": source, "line": i, "rank": rank, "comm": comm,
                     "n_ranks": len(members.get(comm, ())) or -1, "op": _fr_op(str(e["profiling_name"]), where),
                     "sn": int(_number(e["p2p_seq_id"] if is_p2p else e["collective_seq_id"],
                                       "p2p_seq_id" if is_p2p else "collective_seq_id", where, True)),
                     "ms": ms, "end_us": end_us,
                     "order": float(_number(e["record_id"], "record_id", where, True)), "host": None,
                     "members": members.get(comm)})
    if entries and not rows:
        raise NcclError(f"{source}: no entry has 'duration_ms': run with TORCH_NCCL_ENABLE_TIMING=1")
    return pd.DataFrame(rows, columns=[*RECORD_COLUMNS, "members"])


def read_flight_recorder(path: Path) -> pd.DataFrame:
    """A Flight Recorder dump file (pickle, or JSON by its first byte)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise NcclError(f"{path}: cannot read: {exc}") from None
    try:
        dump = json.loads(data) if data[:1] == b"{" else pickle.loads(data)  # noqa: S301 - the user's own dump
    except Exception as exc:  # a broken pickle raises anything
        raise NcclError(f"{path}: not a Flight Recorder dump (pickle or JSON): {type(exc).__name__}: {exc}") from None
    if not isinstance(dump, dict):
        raise NcclError(f"{path}: a Flight Recorder dump is a dict with 'entries', got {type(dump).__name__}")
    return flight_recorder_records(dump, str(path), _fr_rank(path))


def _finish(df: pd.DataFrame) -> pd.DataFrame:
    """Members of every communicator (global ranks seen reporting it, unless given)."""
    seen = df.groupby("comm")["rank"].agg(lambda r: tuple(sorted(set(int(x) for x in r))))
    if "members" in df.columns:
        given = df.dropna(subset=["members"]).groupby("comm")["members"].first()
        seen.update(given)
    df = df.copy()
    df["members"] = seen.loc[df["comm"]].to_numpy()
    return df[[*RECORD_COLUMNS, "members"]].reset_index(drop=True)


def detect_format(path: Path) -> str:
    """``inspector`` (a ``.log`` of JSON lines with a ``coll_perf``) or ``flight-recorder``."""
    if path.name.startswith(FR_PREFIX):
        return "flight-recorder"
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise NcclError(f"{path}: cannot read: {exc}") from None
    if head[:1] == b"{" and b'"coll_perf"' in head:
        return "inspector"
    if head[:1] == b"{" and b'"entries"' in head or head[:1] == b"\x80":
        return "flight-recorder"
    raise NcclError(f"{path}: neither an NCCL Inspector log (JSON lines with coll_perf) nor a Flight "
                    f"Recorder dump ({FR_PREFIX}<rank>, pickle or JSON); give --format")


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files, and the files of directories (Inspector ``*.log``, Flight Recorder dumps)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and (f.suffix == ".log" or f.name.startswith(FR_PREFIX)))
            if not files:
                raise NcclError(f"{p}: no Inspector log (*.log) or Flight Recorder dump ({FR_PREFIX}*) in it")
            out += files
        elif p.exists():
            out.append(p)
        else:
            raise NcclError(f"{p}: no such file or directory")
    return out


def load(paths: Iterable[str | Path], fmt: str = "auto") -> pd.DataFrame:
    """The record table of the given files (one format for all)."""
    files = expand(paths)
    fmts = {f: (detect_format(f) if fmt == "auto" else fmt) for f in files}
    kinds = set(fmts.values())
    if len(kinds) > 1:
        raise NcclError("the files mix Inspector logs and Flight Recorder dumps; import them separately")
    if kinds == {"inspector"}:
        raw: list[dict] = []
        for f in files:
            raw += read_inspector(f)[0]
        return inspector_records(raw)
    if kinds != {"flight-recorder"}:
        raise NcclError(f"unknown format {fmt!r}; one of inspector, flight-recorder, auto")
    parts = [read_flight_recorder(f) for f in files]
    df = pd.concat(parts, ignore_index=True)
    dup = df.groupby("rank")["source"].nunique()
    if (dup > 1).any():
        r = int(dup.index[dup > 1][0])
        raise NcclError(f"rank {r} has more than one dump: {', '.join(sorted(set(df.loc[df['rank'] == r, 'source'])))}")
    return _finish(df)


# --------------------------------------------------------------------------------- the frame
def default_topology(records: pd.DataFrame, gpus_per_node: int | None = None) -> Topology:
    """Pure data parallelism over the ranks the records name."""
    world = int(records["rank"].max()) + 1
    gpn = gpus_per_node or (8 if world % 8 == 0 else world)
    try:
        return Topology(dp=world, gpus_per_node=gpn)
    except TopologyError as exc:
        raise NcclError(f"the records' {world} ranks do not fit a topology: {exc}") from None


def comm_kinds(records: pd.DataFrame, topo: Topology) -> dict[str, str]:
    """Kind of every communicator: a group kind of ``topo`` its members form, else ``pipeline``
    (two members, only sends and receives), ``world`` (the whole job) or ``other``."""
    sets = {kind: {tuple(sorted(row)) for row in topo.members(kind).tolist()} for kind in _LAYOUT_KINDS}
    ops = records.groupby("comm")["op"].agg(lambda o: set(o))
    members = records.groupby("comm")["members"].first()
    out = {}
    for comm, mem in members.items():
        mem = tuple(mem)
        p2p_only = ops[comm] <= {"send", "recv"}
        kind = next((k for k in _LAYOUT_KINDS if mem in sets[k] and topo.group_size(k) > 1), None)
        if kind == "tp" and p2p_only:
            kind = None
        if kind is None:
            kind = ("pipeline" if p2p_only and len(mem) == 2 else
                    "world" if len(mem) == topo.world else "other")
        out[str(comm)] = kind
    return out


def stage_of(op: str, kind: str) -> str:
    """The stage of an operation on a communicator of ``kind`` (``dispatch`` for all-to-alls: the
    caller alternates dispatch / combine)."""
    if op == "all_to_all" and kind in ("ep", "world", "other", "dp"):
        return "dispatch"
    if op in ("send", "recv") and kind in ("pipeline", "other"):
        return "pp_send" if op == "send" else "pp_recv"
    if kind == "dp":
        return {"reduce_scatter": "reduce_scatter", "all_reduce": "reduce_scatter",
                "all_gather": "all_gather"}.get(op, "comm_other")
    if kind == "edp" and op in ("reduce_scatter", "all_reduce"):
        return "expert_reduce"
    return "comm_other"


@dataclass
class NcclImport:
    """What :func:`stage_frame` made of the records."""

    frame: pd.DataFrame
    topology: Topology
    anchor: str
    kinds: dict[str, str]
    #: Records lost to the Inspector's sampling (sequence-number gaps), per communicator.
    missing: dict[str, int] = field(default_factory=dict)
    #: Last anchor iteration each rank closed (follow mode writes those below the minimum).
    closed: dict[int, int] = field(default_factory=dict)


def choose_anchor(records: pd.DataFrame) -> str:
    size = records.groupby("comm")["members"].first().map(len)
    best = size[size == size.max()].index
    return str(sorted(best)[0])


def stage_frame(records: pd.DataFrame, job: str, topo: Topology | None = None, per_iteration: int = 1,
                anchor: str | None = None, first_sn: int | None = None, iteration_offset: int = 0) -> NcclImport:
    """One ``stage_latency`` row per rank per iteration (see the module's doc). Pure."""
    if per_iteration < 1:
        raise NcclError("--per-iteration must be at least 1")
    if not len(records):
        raise NcclError("no collective record to import")
    topo = topo or default_topology(records)
    bad = records["rank"][(records["rank"] < 0) | (records["rank"] >= topo.world)]
    if len(bad):
        raise NcclError(f"rank {int(bad.iloc[0])} is outside the job's {topo.world} ranks (give --tp/--pp/--dp/--ep)")
    anchor = anchor if anchor is not None else choose_anchor(records)
    if anchor not in set(records["comm"]):
        raise NcclError(f"anchor communicator {anchor!r} has no record; known: {', '.join(sorted(set(records['comm'])))}")
    kinds = comm_kinds(records, topo)
    df = records.sort_values(["rank", "order", "line"], kind="stable").reset_index(drop=True)
    pos = np.arange(len(df))
    rank = df["rank"].to_numpy(np.int64)
    is_anchor = (df["comm"] == anchor).to_numpy()
    sn = df["sn"].to_numpy(np.int64)
    first = int(sn[is_anchor].min()) if first_sn is None else int(first_sn)
    block = (sn - first) // per_iteration
    closes = is_anchor & ((sn - first) % per_iteration == per_iteration - 1) & (sn >= first)
    a_pos, a_rank, a_iter = pos[closes], rank[closes], block[closes]
    a_end = df["end_us"].to_numpy(np.float64)[closes]
    idx = np.searchsorted(a_pos, pos, side="left")
    ok = idx < len(a_pos)
    idx_c = np.minimum(idx, max(len(a_pos) - 1, 0))
    ok &= (a_rank[idx_c] == rank) if len(a_pos) else False
    # anchor records of a later block of the same rank belong to their own block's closing record
    it = np.where(ok, a_iter[idx_c] if len(a_pos) else 0, -1)
    ok &= ~is_anchor | (block == it)
    if not ok.any():
        raise NcclError(f"no iteration is complete: the anchor communicator {anchor} ({kinds[anchor]}) closed "
                        f"none ({per_iteration} collective(s) per iteration)")
    kind = df["comm"].map(kinds).to_numpy()
    key = pd.Series(df["op"].to_numpy(dtype=str), dtype=object) + "|" + pd.Series(kind, dtype=object)
    stage = key.map({k: stage_of(*k.split("|")) for k in pd.unique(key)}).to_numpy()
    work = pd.DataFrame({"rank": rank[ok], "iteration": it[ok], "stage": stage[ok], "ms": df["ms"].to_numpy()[ok],
                         "comm": df["comm"].to_numpy()[ok]})
    # all-to-alls of an iteration alternate dispatch / combine, per rank and communicator
    a2a = work["stage"] == "dispatch"
    if a2a.any():
        nth = work[a2a].groupby(["rank", "iteration", "comm"]).cumcount().to_numpy()
        work.loc[a2a, "stage"] = np.where(nth % 2 == 0, "dispatch", "combine")
    per_stage = work.groupby(["rank", "iteration", "stage"])["ms"].sum().unstack("stage")
    keys = pd.MultiIndex.from_arrays([a_rank, a_iter], names=["rank", "iteration"])
    ends = pd.Series(a_end, index=keys)
    ends = ends[~ends.index.duplicated(keep="last")].sort_index()
    per_stage = per_stage.reindex(ends.index)
    r = ends.index.get_level_values("rank").to_numpy(np.int64)
    k = ends.index.get_level_values("iteration").to_numpy(np.int64)
    end_ms = ends.to_numpy() / 1000.0
    prev = np.r_[np.nan, end_ms[:-1]]
    same = np.r_[False, r[1:] == r[:-1]]
    start_ms = work.assign(s=df["end_us"].to_numpy()[ok] / 1000.0 - df["ms"].to_numpy()[ok]) \
        .groupby("rank")["s"].min()
    iter_ms = np.where(same, end_ms - prev, end_ms - start_ms.reindex(r).to_numpy())
    t = np.round(end_ms).astype(np.int64)
    t = _increasing(t, same)   # strictly increasing per rank
    out = pd.DataFrame({
        "time": t, "job": job, "rank": r,
        "pp": topo.pp_index[r], "dp": topo.dp_index[r], "tp": topo.tp_index[r],
        "ep_group": topo.group_ids("ep")[r], "node": topo.node_index[r],
        schema.ITERATION_FIELD: k + iteration_offset,
        schema.ITERATION_MS_FIELD: np.maximum(iter_ms, 0.0),
    })
    hosts = df.groupby("rank")["host"].first() if "host" in df.columns else None
    if hosts is not None and hosts.notna().all() and len(hosts) == topo.world:
        out["host"] = hosts.reindex(r).to_numpy()
    order = [s for s in schema.KNOWN_STAGES.names if s in per_stage.columns]
    for s in order:
        out[s] = per_stage[s].to_numpy(np.float64)
    span = df.groupby(["comm", "rank"])["sn"].agg(["min", "max", "nunique"])
    gaps = (span["max"] - span["min"] + 1 - span["nunique"]).groupby(level="comm").sum()
    missing = {str(c): int(n) for c, n in gaps[gaps > 0].items()}
    closed = pd.Series(a_iter, index=a_rank).groupby(level=0).max()
    return NcclImport(out.reset_index(drop=True), topo, anchor, kinds, missing,
                      {int(a): int(b) for a, b in closed.items()})


def _increasing(t: np.ndarray, same: np.ndarray) -> np.ndarray:
    """``t`` made strictly increasing inside each run of ``same`` (a rank's rows), +1 ms steps."""
    n = np.arange(len(t))
    start = np.maximum.accumulate(np.where(~same, n, 0))
    # t'_i = max_{j<=i in run}(t_j + (i - j)) = (i - start) + cummax(t_j - (j - start)) within the run
    shifted = t - (n - start)
    run_id = np.cumsum(~same)
    cm = pd.Series(shifted).groupby(run_id).cummax().to_numpy()
    return cm + (n - start)
