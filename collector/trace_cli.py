"""``rankscope import-trace FILES...``: PyTorch profiler traces -> ``stage_latency`` points."""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from collector.kineto import (
    DEFAULT_PATTERNS,
    StagePatterns,
    TraceError,
    import_traces,
    read_host_map,
)
from collector.untrusted.bounded_read import FileLimit, add_limit_option
from collector.untrusted.clear_errors import clear_errors
from rankscope.schema import DEFAULT_STAGES, TRACE_STAGES, StageSet
from rankscope.topology import Topology

#: ProfilerSteps per kernel window when --kernels is not given.
DEFAULT_KERNEL_STEPS = 10


def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    defaults = "; ".join(f"{s}: {' | '.join(p)}" for s, p in DEFAULT_PATTERNS.items())
    p = sub.add_parser(
        "import-trace", help="import PyTorch profiler (Kineto) traces as stage latencies",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read one torch.profiler trace per rank (.json or .json.gz, from export_chrome_trace "
                    "or tensorboard_trace_handler), cut it into iterations at its ProfilerStep#N "
                    "annotations, map operator, annotation, module and kernel events to stages by "
                    "name patterns, and write one stage_latency point per rank per iteration.\n\n"
                    "A stage's time is the union of its matching events, of the backward operators "
                    "of forward operators run inside them, and (GPU) of the kernels they launched. "
                    "Every kernel no named stage claims counts for a model-agnostic stage ("
                    + ", ".join(TRACE_STAGES.names) + "): communication (NCCL) kernels, computation "
                    "kernels, memory copies/sets, and the time the GPU runs nothing.\n\n"
                    "The rank comes from the trace's distributedInfo, else 'rankN' in the file name, "
                    "else --rank; the host from --host-map, else the trace's host_name, else a "
                    "tensorboard_trace_handler file name (host_pid.time.pt.trace.json); the GPU from "
                    "the kernels' device.\n\nFiles are data: each is read (and gunzipped) as a "
                    "stream of at most --max-file-mb, and every event's fields are checked (types, "
                    "finite, in range); an event that fails is refused and counted (the first named "
                    "by file, event and field), the others imported. The exit status is 0 when "
                    "points were written, 1 when nothing could be imported.\n\n"
                    "Default patterns (regular expressions): " + defaults)
    add_store_options(p)
    p.add_argument("files", nargs="+", metavar="FILE", help="trace files, one per rank")
    p.add_argument("--job", required=True, help="job name the points are tagged with")
    p.add_argument("--config", type=Path, default=None,
                   help="TOML file with a [trace.patterns] table (stage = [regex, ...]) replacing "
                        "the default patterns of those stages, and optionally a [stages] table "
                        "declaring the job's own stages")
    p.add_argument("--pattern", action="append", default=[], metavar="STAGE=REGEX",
                   help="replace a stage's patterns (repeatable; several for one stage add up)")
    p.add_argument("--rank", type=int, default=None, help="rank of a single trace without rank information")
    p.add_argument("--host-map", type=Path, default=None, metavar="FILE",
                   help="rank -> host name for traces that record no host (wins over the trace's own): "
                        "TOML ('0-7 = \"gpu-node-017\"', optionally in a [hosts] table) or JSON "
                        "('{\"0-7\": \"gpu-node-017\"}', by the .json suffix)")
    p.add_argument("--iteration-offset", type=int, default=0,
                   help="added to the ProfilerStep number to give the training iteration")
    for dim in ("tp", "pp", "dp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=None,
                       help=f"{dim.upper()} size of the job (default: pure DP over the traces' world)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default 8)")
    p.add_argument("--kernels", type=int, default=None, metavar="N",
                   help="windows of N ProfilerSteps in which each trace's kernel durations (GPU kernels; "
                        f"a CPU trace's operators) are written as kernel_stats, compressed per kernel as "
                        f"the live kernel channel does, for the analyzer's kernel-level comparison (L3); "
                        f"written whenever a trace holds such events (default {DEFAULT_KERNEL_STEPS}); 0: off")
    add_limit_option(p)
    p.set_defaults(func=run)


def _patterns(args: argparse.Namespace) -> StagePatterns:
    stages: StageSet = DEFAULT_STAGES
    table: dict[str, list[str]] = {}
    if args.config is not None:
        try:
            conf = tomllib.loads(args.config.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise TraceError(f"cannot read --config {args.config}: {exc}") from None
        if "stages" in conf:
            stages = StageSet.from_config(conf["stages"])
        pats = conf.get("trace", {}).get("patterns", {})
        if not isinstance(pats, dict):
            raise TraceError(f"{args.config}: [trace.patterns] must be a table of stage = [regex, ...]")
        table.update({k: [v] if isinstance(v, str) else list(v) for k, v in pats.items()})
    cli: dict[str, list[str]] = {}
    for spec in args.pattern:
        stage, sep, regex = spec.partition("=")
        if not sep or not stage or not regex:
            raise TraceError(f"--pattern {spec!r}: expected STAGE=REGEX")
        cli.setdefault(stage, []).append(regex)
    table.update(cli)
    base = StagePatterns.build({s: p for s, p in DEFAULT_PATTERNS.items() if s in stages}, stages)
    for stage in table:
        if stage not in stages:
            raise TraceError(f"pattern for unknown stage {stage!r}; known: {', '.join(stages.names)}")
    return base.with_overrides(table) if table else base


def _topology(args: argparse.Namespace) -> Topology | None:
    dims = {d: getattr(args, d) for d in ("tp", "pp", "dp", "ep") if getattr(args, d) is not None}
    if not dims:
        return None
    return Topology(**dims, gpus_per_node=args.gpus_per_node)


@clear_errors(TraceError, "files")
def run(args: argparse.Namespace) -> int:
    from rankscope.store import open_store

    asked = args.kernels is not None
    steps = args.kernels if asked else DEFAULT_KERNEL_STEPS
    if steps < 0:
        raise TraceError(f"--kernels {args.kernels}: expected the ProfilerSteps of a window (>= 1), or 0 for off")
    limit = FileLimit.mb(args.max_file_mb)
    patterns = _patterns(args)
    topology = _topology(args)
    hosts = read_host_map(args.host_map) if args.host_map is not None else None
    with open_store(args.store, args.bucket) as store:
        report = import_traces(args.files, store, args.job, topology, patterns,
                               iteration_offset=args.iteration_offset, rank=args.rank,
                               progress=lambda msg: print(msg, file=sys.stderr, flush=True), hosts=hosts,
                               limit=limit, kernel_steps=steps)
    shown = ", ".join(report.hosts[:4]) + (f" (+{len(report.hosts) - 4})" if len(report.hosts) > 4 else "")
    print(f"imported {report.points} point(s): {report.files} trace(s), ranks "
          f"{','.join(map(str, report.ranks))}, {report.iterations} iteration(s), "
          f"stages {', '.join(report.stages)}; hosts {shown or 'unknown'}"
          + (f"; refused {report.refused} event(s) with bad values" if report.refused else "")
          + (f"; {report.kernel_points} kernel window(s) of {steps} step(s)" if report.kernel_points or (asked and steps) else ""))
    if asked and steps and report.no_kernels:
        print(f"no kernel or operator events in the traces of rank(s) {','.join(map(str, report.no_kernels))}: "
              "no kernel window for them (their stage latencies were imported)", file=sys.stderr)
    return 0
