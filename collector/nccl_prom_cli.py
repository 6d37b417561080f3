"""``rankscope import-nccl`` of NCCL Inspector's Prometheus output: ``.prom`` textfiles, or the
same samples pulled from a running Prometheus (``--prometheus URL``), once or ``--follow``.

The samples become records (:mod:`collector.nccl_import.prom_records`), the records snapshots,
and the snapshots ``stage_latency`` rows (:mod:`collector.nccl_import.snapshots`). The command's
other options (layout, ``--anchor``, ``--per-iteration``, the store) are ``import-nccl``'s
(:mod:`collector.nccl_cli`, which hands over here).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from collector.nccl_import.inspector import inspector_records
from collector.nccl_import.prom_api import DEFAULT_MAX_RESPONSE_MB, RESPONSE_FLAG, PromSource
from collector.nccl_import.prom_records import EXEC_METRIC, prom_records
from collector.nccl_import.prom_text import (
    PROM_PREFIX,
    PROM_SUFFIX,
    prom_file,
    prom_files,
    read_texts,
)
from collector.nccl_import.records import NcclError
from collector.nccl_import.rows import NcclImport
from collector.nccl_import.snapshots import snapshot_frame
from collector.stop_signals import StopSignals
from collector.untrusted.bounded_read import MB, FileLimit
from rankscope.store import Store
from rankscope.times import parse_time

FORMAT = "inspector-prom"
#: The command's description of these sources (a paragraph of ``import-nccl --help``).
DESCRIPTION = (
    "NCCL Inspector's Prometheus mode (NCCL_INSPECTOR_PROM_DUMP=1: nccl_inspector_metrics_<gpu-uuid>.prom, "
    "rewritten every 30 s or more for node_exporter's textfile collector) is read from those files, or "
    "from the cluster's Prometheus that scraped them (--prometheus URL --since 6h [--selector "
    "'slurm_job_id=\"4711\"']). Each dump holds only the last collective of each communicator: one point "
    "per rank per dump, placed by the dump's time, stamped with the anchor's iteration at the dump; "
    "iteration_ms from the anchor's coll_sn progress between dumps. A sample with bad labels is refused "
    "(exit status 3), the rest imported.\n\n")
#: Each --follow read of a Prometheus reaches this far back (scrapes still being written).
FOLLOW_OVERLAP_MS = 60_000
_KEY = ["source", "comm", "comm_rank", "sn", "end_us"]

Topo = Callable[[argparse.Namespace, pd.DataFrame], object]
Summary = Callable[[NcclImport, pd.DataFrame, str], str]


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of the Prometheus sources."""
    g = p.add_argument_group("NCCL Inspector's Prometheus output (NCCL_INSPECTOR_PROM_DUMP=1)")
    g.add_argument("--prometheus", metavar="URL", default=None,
                   help="read the Inspector's samples from this Prometheus (http://host:9090) instead of files")
    g.add_argument("--selector", default="", metavar='LABEL="VALUE",...',
                   help='PromQL label matchers that pick the job\'s series, e.g. slurm_job_id="4711"')
    g.add_argument("--since", default="6h", help="with --prometheus: from this time or this long ago (default 6h)")
    g.add_argument("--until", default=None, help="with --prometheus: up to this time (default now)")
    g.add_argument("--timeout", type=float, default=30.0, help="with --prometheus: seconds per request (default 30)")
    g.add_argument(RESPONSE_FLAG, type=float, default=DEFAULT_MAX_RESPONSE_MB, metavar="MB",
                   help=f"with --prometheus: the largest answer read (default {DEFAULT_MAX_RESPONSE_MB}); a larger "
                        f"one is asked again for half the time")


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command reads Prometheus samples: ``--prometheus``, ``--format inspector-prom``,
    or (``--format auto``) ``.prom`` files named or found in the given directories."""
    if args.prometheus or args.format == FORMAT:
        return True
    if args.format != "auto":
        return False
    for p in map(Path, args.paths):
        if prom_file(p) or p.suffix == PROM_SUFFIX:
            return True
        if p.is_dir() and next(p.rglob(f"{PROM_PREFIX}*{PROM_SUFFIX}"), None) is not None:
            if next(p.rglob("*.log"), None) is not None:
                raise NcclError(f"{p}: holds Inspector logs (*.log) and Prometheus files (*.prom): give "
                                f"--format inspector or --format {FORMAT}")
            return True
    return False


class Gather:
    """The raw records read so far (each collective once), from files or a Prometheus."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.limit = FileLimit.mb(args.max_file_mb)
        self.source = None
        if args.prometheus:
            if args.paths:
                raise NcclError("give files or --prometheus, not both")
            limit = FileLimit(round(_positive(args.max_response_mb, RESPONSE_FLAG) * MB), RESPONSE_FLAG)
            self.source = PromSource(args.prometheus, args.selector, args.timeout, limit)
        elif not args.paths:
            raise NcclError("nothing to import: give Inspector files or directories, or --prometheus URL")
        self.raw = pd.DataFrame()
        self.refused = 0
        self.read_until_ms: int | None = None
        self._told: set[str] = set()

    def _samples(self, quiet_empty: bool) -> pd.DataFrame:
        if self.source is None:
            read = read_texts(prom_files(self.args.paths, allow_empty=quiet_empty), frozenset([EXEC_METRIC]),
                              self.limit)
            if read.refused:
                self._tell("refused", f"{read.first_refused} ({read.refused} line(s) refused in all)")
                self.refused += read.refused
            for text in read.unreadable:
                self._tell("refused", text)
            self.refused += len(read.unreadable)
            for name in read.partial if not quiet_empty else ():
                self._tell("warning", f"{name}: its last line (no newline yet) is being written; left out")
            for name in read.empty if not quiet_empty else ():
                self._tell("warning", f"{name}: no sample (what a process that has just started leaves); skipped")
            return read.samples
        now = int(time.time() * 1000)
        if self.read_until_ms is None:
            start = parse_time(self.args.since, "--since", now_ms=now, assume_utc=True)
            end = parse_time(self.args.until, "--until", assume_utc=True) if self.args.until else now
        else:
            start, end = self.read_until_ms - FOLLOW_OVERLAP_MS, now
        samples = self.source.fetch(start, end)
        self.read_until_ms = end
        return samples

    def poll(self, quiet_empty: bool = False) -> int:
        """Read once more; the number of collectives not seen before."""
        raw, refusals = prom_records(self._samples(quiet_empty))
        if refusals.count:
            self._tell("refused", str(refusals))
            self.refused += refusals.count
        before = len(self.raw)
        merged = pd.concat([self.raw, raw], ignore_index=True) if len(self.raw) else raw
        self.raw = merged.drop_duplicates(_KEY, keep="last").reset_index(drop=True)
        return len(self.raw) - before

    def records(self) -> pd.DataFrame:
        """The record table of everything read (processes without a global rank: refused)."""
        if not len(self.raw):
            where = self.args.prometheus or ", ".join(map(str, self.args.paths))
            raise NcclError(f"{where}: no {EXEC_METRIC} sample to import (a selector that matches nothing, "
                            f"a --since before the job, or files of no dump yet)")
        unranked: list[str] = []
        records = inspector_records(self.raw.to_dict("records"), unranked=unranked)
        for text in unranked:
            self._tell("refused", text)
        self.refused += len(unranked)
        return records

    def _tell(self, what: str, text: str) -> None:
        if text not in self._told:
            self._told.add(text)
            print(f"rankscope import-nccl: {what}: {text}", file=sys.stderr, flush=True)


def _positive(value: float, flag: str) -> float:
    if not isinstance(value, int | float) or not np.isfinite(value) or value <= 0:
        raise NcclError(f"{flag} must be a positive number, got {value!r}")
    return float(value)


def describe(frame: pd.DataFrame) -> str:
    """What the snapshots are: how many per rank, how far apart."""
    if not len(frame):
        return "no snapshot"
    per_rank = frame.groupby("rank").size()
    gaps = frame.sort_values(["rank", "time"]).groupby("rank")["time"].diff().dropna()
    every = f", every {np.median(gaps) / 1000:.0f} s" if len(gaps) else ""
    return (f"snapshots: {int(per_rank.median())} per rank{every}; a stage's value is the last collective "
            f"of each of its communicators at the dump, iteration_ms from the anchor's coll_sn progress")


def run(args: argparse.Namespace, topology: Topo, summary: Summary) -> bool:
    """Import once (or ``--follow``); whether anything was refused."""
    from rankscope.store import open_store

    gather = Gather(args)
    if args.follow:
        return follow(args, gather, topology, summary)
    gather.poll()
    records = gather.records()
    imp = snapshot_frame(records, args.job, topology(args, records), args.per_iteration, args.anchor,
                         iteration_offset=args.iteration_offset)
    with open_store(args.store, args.bucket) as store:
        store.write_stage_latency(imp.frame)
    print(f"{summary(imp, imp.frame, 'imported')}; {describe(imp.frame)}", file=sys.stdout)
    return gather.refused > 0


class _Writes:
    """What --follow has written: each snapshot once every rank has dumped past it."""

    def __init__(self, args: argparse.Namespace, gather: Gather, topology: Topo, summary: Summary,
                 store: Store) -> None:
        self.args, self.gather, self.topology, self.summary, self.store = args, gather, topology, summary, store
        self.written = -1
        self.first_sn: int | None = None
        self.topo = self.anchor = None
        self.total = 0

    def _import(self, final: bool) -> NcclImport | None:
        try:
            records = self.gather.records()
            if self.topo is None:
                self.topo = self.topology(self.args, records)
            imp = snapshot_frame(records, self.args.job, self.topo, self.args.per_iteration,
                                 self.anchor or self.args.anchor, self.first_sn, self.args.iteration_offset)
        except NcclError:
            if final:
                raise
            return None   # not every rank has dumped the job-wide communicator yet
        if self.first_sn is None:
            self.anchor = imp.anchor
            self.first_sn = int(records.loc[records["comm"] == imp.anchor, "sn"].min())
        return imp

    def step(self, final: bool) -> None:
        """Write the snapshots every rank has dumped past (with ``final``: all of them)."""
        if not len(self.gather.raw):
            return
        imp = self._import(final)
        if imp is None or not len(imp.frame):
            return
        it = imp.frame["iteration"] - self.args.iteration_offset
        done = int(it.max()) if final else min(imp.closed.get(r, -1) for r in range(imp.topology.world))
        new = imp.frame[(it > self.written) & (it <= done)]
        if len(new):
            self.store.write_stage_latency(new.reset_index(drop=True))
            self.total += len(new)
            self.written = done
            print(f"{self.summary(imp, new, 'wrote')}; {describe(imp.frame)}", file=sys.stdout, flush=True)


def follow(args: argparse.Namespace, gather: Gather, topology: Topo, summary: Summary) -> bool:
    """Poll every ``--interval`` seconds until Ctrl-C (or SIGTERM) or ``--max-seconds``; whether anything
    was refused."""
    from rankscope.store import open_store

    if args.until:
        raise NcclError("--follow reads up to now: leave --until out")
    deadline = None if args.max_seconds is None else time.monotonic() + args.max_seconds
    with open_store(args.store, args.bucket) as store:
        writes = _Writes(args, gather, topology, summary, store)
        with StopSignals() as stop:   # Ctrl-C or SIGTERM: this turn ends, then the last read
            while not stop.requested:
                gather.poll(quiet_empty=True)
                writes.step(final=False)
                if deadline is not None and time.monotonic() >= deadline:
                    break
                stop.sleep(args.interval)
        gather.poll(quiet_empty=True)
        writes.step(final=True)
    print(f"followed {'Prometheus ' + args.prometheus if args.prometheus else 'Inspector Prometheus files'}: "
          f"{writes.total} point(s) written", file=sys.stdout)
    return gather.refused > 0
