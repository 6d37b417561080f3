"""``rankscope import-nccl FILE_OR_DIR... --job NAME``: NCCL Inspector logs or PyTorch Flight
Recorder dumps -> ``stage_latency`` points (the collector/nccl_import package says how)."""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd

from collector import nccl_import as ni
from collector import nccl_prom_cli as prom
from collector.stop_signals import StopSignals
from collector.untrusted.bounded_read import DEFAULT_LIMIT, FileLimit, add_limit_option
from collector.untrusted.clear_errors import clear_errors
from collector.untrusted.folder_files import files_in
from rankscope import schema
from rankscope.topology import Topology, TopologyError

#: Exit status when points were written but some file was refused.
REFUSED = 3


def _wrap(text: str) -> str:
    return "\n\n".join(textwrap.fill(par, 90, break_on_hyphens=False) for par in text.split("\n\n"))


#: The command's --help text.
DESCRIPTION = (
    "Read the collective timings NCCL's Inspector profiler plugin (NCCL_PROFILER_PLUGIN, "
    "NCCL_INSPECTOR_ENABLE=1: <dir>/<host>-pid<pid>.log, one JSON record per collective per "
    "communicator) or PyTorch's Flight Recorder (TORCH_NCCL_TRACE_BUFFER_SIZE, "
    "NCCL or gloo: nccl_trace_rank_<rank> dumps, pickle or JSON) write, and "
    "write one stage_latency point per rank per iteration: each communication stage the "
    "iteration's total of its collectives (ms).\n\n"
    "Flight Recorder without TORCH_NCCL_ENABLE_TIMING=1 (PyTorch's default; gloo always) has "
    "no durations: each collective is then timed by who arrives last (time_created_ns), a "
    "rank's time being its wait for the last member. Ranks of one host are compared "
    "exactly; across hosts a wait counts only beyond --clock-skew-ms. A dump's host is what "
    "its file name holds before the prefix (<host>.nccl_trace_rank_<rank>); a rank of "
    "unknown host is compared with every other as across hosts.\n\n"
    "A communicator's kind comes from its members against the job's layout (--tp/--pp/--dp/"
    "--ep, default pure DP): all-to-alls on EP groups are dispatch/combine, sends and receives "
    "pp_send/pp_recv, reduce-scatters and all-reduces on DP groups reduce_scatter, all-gathers "
    "all_gather, the rest comm_other.\n\n" + prom.DESCRIPTION +
    "Iterations: the anchor communicator (--anchor, default the one with the most members) "
    "runs --per-iteration collectives per iteration; its last one ends the iteration, and "
    "every other collective of a rank belongs to the iteration of the next anchor collective "
    "of that rank. Point times are the ranks' own clocks.\n\n"
    "Files are data: a pickled dump is read as plain data (any code it names is refused by "
    "name), every file within --max-file-mb, every value checked (a bad record refuses its "
    "file, naming the file, the record and the field, and counting the others: a record "
    "left out would move collectives into another iteration). A symlink in a given directory "
    "that points outside it is refused by name.\n\n"
    "What is good is kept: an empty file, or one still being written (a dump cut short, a "
    "log's last line without its newline), is skipped with a warning; a file that cannot be "
    "read (a bad record, not a record file, over --max-file-mb) is refused, named on stderr, "
    "and the others are imported.\n\n"
    "Exit status: 0 every file imported (skipped ones warned about); 3 points written, but "
    "some file(s) refused; 1 nothing imported (or the import failed); 2 bad arguments.")


def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    p = sub.add_parser(
        "import-nccl", help="import NCCL Inspector logs or Flight Recorder dumps (collective timings) as stage latencies",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap(DESCRIPTION))
    add_store_options(p)
    p.add_argument("paths", nargs="*", metavar="FILE_OR_DIR", help="Inspector logs or .prom files, Flight Recorder dumps, or directories of them")
    p.add_argument("--job", required=True, help="job name the points are tagged with")
    p.add_argument("--format", choices=("inspector", "flight-recorder", prom.FORMAT, "auto"), default="auto",
                   help="record format (default: from each file's name and first bytes)")
    p.add_argument("--per-iteration", type=int, default=1, metavar="N",
                   help="collectives the anchor communicator runs per iteration (default 1)")
    p.add_argument("--anchor", default=None, metavar="COMM",
                   help="communicator id (Inspector header.id) or process group name (Flight Recorder) "
                        "whose collectives delimit iterations (default: the one with the most members)")
    p.add_argument("--iteration-offset", type=int, default=0, help="added to the iteration numbers (default 0)")
    p.add_argument("--clock-skew-ms", type=float, default=ni.CLOCK_SKEW_MS, metavar="MS",
                   help="bound on the hosts' clock skew, for Flight Recorder dumps without durations: a "
                        "rank's wait for a member on another host counts only beyond it "
                        f"(default {ni.CLOCK_SKEW_MS:g}: NTP on a data-centre network; 0 with PTP)")
    for dim in ("tp", "pp", "dp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=None, help=f"{dim.upper()} size of the job")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default 8, or the world if smaller)")
    p.add_argument("--follow", action="store_true",
                   help="keep reading growing Inspector logs and write each iteration once every rank "
                        "finished it, until Ctrl-C or SIGTERM (or --max-seconds)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reads with --follow (default 1)")
    p.add_argument("--max-seconds", type=float, default=None, help="stop following after this long")
    add_limit_option(p)
    prom.add_options(p)
    p.set_defaults(func=run)


def topology(args: argparse.Namespace, records: pd.DataFrame) -> Topology:
    """The layout given (--tp/--pp/--dp/--ep), else the one the records show (pure data
    parallelism, each host's intra-node groups as TP groups: ``default_topology``)."""
    if all(getattr(args, d) is None for d in ("tp", "pp", "dp", "ep")):
        return ni.default_topology(records, args.gpus_per_node)
    world = ni.world_of(records)
    tp, pp, ep = args.tp or 1, args.pp or 1, args.ep or 1
    dp = args.dp or max(1, world // (tp * pp))
    if tp * pp * dp != world:
        raise ni.NcclError(f"--tp {tp} x --pp {pp} x --dp {dp} = {tp * pp * dp} ranks, but the records name {world}")
    gpn = args.gpus_per_node or (8 if world % 8 == 0 else world)
    try:
        return Topology(tp=tp, pp=pp, dp=dp, ep=ep, gpus_per_node=gpn)
    except TopologyError as exc:
        raise ni.NcclError(f"the layout does not fit: {exc}") from None


def _summary(imp: ni.NcclImport, frame: pd.DataFrame, what: str, timing: ni.Timing | None = None) -> str:
    t = imp.topology
    stages = [c for c in frame.columns if c in schema.KNOWN_STAGES.names]
    kinds = ", ".join(f"{c} {k}" for c, k in sorted(imp.kinds.items()))
    its = (f"iterations {int(frame['iteration'].min())}-{int(frame['iteration'].max())}"
           if len(frame) else "no iteration")
    text = (f"{what} {len(frame)} point(s): {t.world} rank(s) (tp {t.tp} x pp {t.pp} x dp {t.dp}, ep {t.ep}), "
            f"{its}, stages {', '.join(stages)}; anchor {imp.anchor}; communicators: {kinds}")
    if timing is not None:
        text += f"; {timing.describe()}"
    if imp.missing:
        text += ("; records missing (sequence-number gaps; shorten NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_"
                 "MICROSECONDS): " + ", ".join(f"{c} {n}" for c, n in sorted(imp.missing.items())))
    return text


@clear_errors(ni.NcclError, "paths")
def run(args: argparse.Namespace) -> int:
    from rankscope.store import open_store

    if prom.wanted(args):
        return REFUSED if prom.run(args, topology, _summary) else 0
    if not args.paths:
        raise ni.NcclError("nothing to import: give Inspector logs, Flight Recorder dumps or directories of "
                           "them, or --prometheus URL")
    if args.follow:
        return follow(args)
    loaded = ni.read_files(args.paths, args.format, FileLimit.mb(args.max_file_mb), args.clock_skew_ms)
    for text in loaded.skipped:
        print(f"rankscope import-nccl: warning: {text}", file=sys.stderr)
    for text in loaded.refused:
        print(f"rankscope import-nccl: refused: {text}", file=sys.stderr)
    records = loaded.records
    imp = ni.stage_frame(records, args.job, topology(args, records), args.per_iteration, args.anchor,
                         iteration_offset=args.iteration_offset)
    with open_store(args.store, args.bucket) as store:
        store.write_stage_latency(imp.frame)
    print(_summary(imp, imp.frame, "imported", loaded.timing), file=sys.stdout)
    if loaded.refused:
        print(f"rankscope import-nccl: {len(loaded.refused)} file(s) refused (named above); the others "
              f"imported", file=sys.stderr)
        return REFUSED
    return 0


class Follower:
    """Tails Inspector logs: new complete lines of known files, new files in given directories."""

    def __init__(self, paths: list[str], limit: FileLimit = DEFAULT_LIMIT):
        self.paths = [Path(p) for p in paths]
        self.limit = limit
        self.pos: dict[Path, tuple[int, int]] = {}   # file -> (next line, byte offset)
        self.raw: list[dict] = []

    def files(self) -> list[Path]:
        out = []
        for p in self.paths:
            if p.is_dir():
                out += files_in(p, lambda f: f.suffix == ".log", recursive=False, error=ni.NcclError)
            elif p.exists():
                out.append(p)
        return out

    def poll(self) -> int:
        n = 0
        for f in self.files():
            if ni.FR_PREFIX in f.name:
                raise ni.NcclError(f"{f}: --follow tails Inspector logs; a Flight Recorder dump is rewritten whole")
            line, off = self.pos.get(f, (1, 0))
            new, line, off = ni.read_inspector(f, line, off, self.limit)
            self.pos[f] = (line, off)
            self.raw += new
            n += len(new)
        return n


class _Writes:
    """What --follow has written so far: each iteration once every rank finished it."""

    def __init__(self, args: argparse.Namespace, tail: Follower, store):
        self.args, self.tail, self.store = args, tail, store
        self.written = -1          # the last iteration written
        self.first_sn = self.anchor = self.topo = None
        self.total = 0

    def _import(self, final: bool) -> ni.NcclImport | None:
        """The frame of all records so far; None while it cannot be made yet (raises when ``final``)."""
        try:
            records = ni.inspector_records(self.tail.raw)
        except ni.NcclError:
            if final:
                raise
            return None   # not every rank has written its job-wide communicator yet
        if self.topo is None:
            self.topo = topology(self.args, records)
            self.anchor = self.args.anchor or ni.choose_anchor(records)
            self.first_sn = int(records.loc[records["comm"] == self.anchor, "sn"].min())
        try:
            return ni.stage_frame(records, self.args.job, self.topo, self.args.per_iteration, self.anchor,
                                  self.first_sn)
        except ni.NcclError:
            if final:
                raise
            return None   # no iteration complete yet

    def step(self, final: bool) -> None:
        """Write the iterations finished since the last step (with ``final``: all of them)."""
        if not self.tail.raw:
            return
        imp = self._import(final)
        if imp is None:
            return
        frame, offset = imp.frame, self.args.iteration_offset
        if final:
            done = int(frame["iteration"].max()) - offset
        else:
            done = min(imp.closed.get(r, -1) for r in range(self.topo.world))
        new = frame[(frame["iteration"] - offset > self.written) & (frame["iteration"] - offset <= done)]
        if len(new):
            self.store.write_stage_latency(new.reset_index(drop=True))
            self.total += len(new)
            self.written = done
            print(_summary(imp, new, "wrote"), file=sys.stdout, flush=True)


def follow(args: argparse.Namespace) -> int:
    from rankscope.store import open_store

    if args.format == "flight-recorder":
        raise ni.NcclError("--follow tails Inspector logs; Flight Recorder dumps are written whole: import them once")
    for p in map(Path, args.paths):
        if not p.exists():
            raise ni.NcclError(f"{p}: no such file or directory")
    tail = Follower(args.paths, FileLimit.mb(args.max_file_mb))
    deadline = None if args.max_seconds is None else time.monotonic() + args.max_seconds
    with open_store(args.store, args.bucket) as store:
        writes = _Writes(args, tail, store)
        with StopSignals() as stop:   # Ctrl-C or SIGTERM: this turn ends, then the last read
            while not stop.requested:
                tail.poll()
                writes.step(final=False)
                if deadline is not None and time.monotonic() >= deadline:
                    break
                stop.sleep(args.interval)
        tail.poll()
        writes.step(final=True)
    print(f"followed {len(tail.pos)} file(s): {writes.total} point(s) written", file=sys.stdout)
    return 0
