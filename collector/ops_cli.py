"""``rankscope import-ops FILE... --job NAME``: per-operation traces -> ``stage_latency`` points."""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd

from collector.ops_import import (
    OPTYPE_STAGES,
    REQUIRED_COLUMNS,
    OpsError,
    check_times,
    read_ops,
    stage_frame,
)
from collector.ops_import.values import INTEGER_COLUMNS, SECOND_COLUMNS, Refusals, checked_rows
from collector.untrusted.bounded_read import DEFAULT_LIMIT, FileLimit, add_limit_option
from collector.untrusted.clear_errors import clear_errors

_MAPPING = "; ".join(f"{op} -> {stage or '(none)'}" for op, stage in OPTYPE_STAGES.items())
_RULES = (", ".join(f"{c} an integer in 0..{most}" for c, most in INTEGER_COLUMNS.items()) + ", "
          + ", ".join(f"{c} finite seconds in 0..{most:g}" for c, most in SECOND_COLUMNS.items())
          + ", optype text")


def _wrap(text: str) -> str:
    return "\n\n".join(textwrap.fill(par, 90, break_on_hyphens=False) for par in text.split("\n\n"))


def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    p = sub.add_parser(
        "import-ops", help="import per-operation traces (StragglerAnalysis format) as stage latencies",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap("Read per-operation traces, one row per recorded operation with the columns "
                    + ", ".join(REQUIRED_COLUMNS) + " (the format of ByteDance-Seed/StragglerAnalysis' "
                    "data/trace-*.parquet; Parquet, or CSV by the .csv suffix; several files are one "
                    "job's, concatenated), and write one stage_latency point per recorded worker "
                    "per step: each stage the step's total of its operations (ms).\n\n"
                    "A worker is a (stage, dp_rank) cell: such traces record one rank of each "
                    "tensor-/sequence-parallel group. Imported rank r is the worker dp + DP * pp, "
                    "i.e. ranks r*R .. r*R+R-1 of the real job, R = --tp x --dsp; a node holds "
                    "--gpus-per-node / R workers.\n\n"
                    "Times start at 0 in every step of such a trace: a point's time is its rank's "
                    "own end of the step, step s starting at --start + (s - first step) x the "
                    "longest step (whole seconds).\n\n"
                    "Files are data: each is read within --max-file-mb, and every value is checked "
                    "(" + _RULES + "). A row that fails is refused, the others imported; the refused "
                    "rows are counted on stderr with the first named by file, row (from 1, a CSV "
                    "header not counted), column and value. The exit status is 0 when points were "
                    "written (some rows may have been refused), 1 when no row was usable or the "
                    "import failed.\n\nStages of the optypes: " + _MAPPING))
    add_store_options(p)
    p.add_argument("files", nargs="+", metavar="FILE", help="per-operation trace files of one job")
    p.add_argument("--job", required=True, help="job name the points are tagged with")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel size of the job (ranks of a worker's TP group; default 1)")
    p.add_argument("--dsp", type=int, default=1,
                   help="sequence-parallel size (the trace's dsp_size; default 1)")
    p.add_argument("--meta", type=Path, default=None, metavar="YAML",
                   help="the trace's meta-<name>.yaml (tp_size, dsp_size, pp_size, dp_size): sets "
                        "--tp/--dsp and checks the trace's pp and dp against it")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--host-pattern", default=None, metavar="PATTERN",
                   help="host name of each node id, e.g. 'gpu-node-{node:03d}', for a job placed in "
                        "blocks of --gpus-per-node ranks (the traces name no host); writes the host "
                        "and gpu tags, so incidents name the host to drain")
    p.add_argument("--start", default=None, metavar="TIME",
                   help="time of the first step: RFC 3339 (UTC without a zone), epoch ms, or "
                        "'6h' (that long ago); default: the import ends now")
    add_limit_option(p)
    p.set_defaults(func=run)


def read_meta(path: Path) -> dict[str, int]:
    import yaml

    try:
        meta = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise OpsError(f"cannot read --meta {path}: {exc}") from None
    if not isinstance(meta, dict):
        raise OpsError(f"--meta {path}: expected a mapping of tp_size, dsp_size, pp_size, dp_size")
    out = {}
    for key in ("tp_size", "dsp_size", "pp_size", "dp_size"):
        v = meta.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OpsError(f"--meta {path}: {key} must be a positive integer, got {v!r}")
        out[key] = v
    return out


def load(files: list[str | Path], limit: FileLimit = DEFAULT_LIMIT) -> tuple[pd.DataFrame, list[Refusals]]:
    """The rows of every file whose values pass their checks, and each file's refusals; an
    error when no row of any file is usable."""
    frames, refusals = [], []
    for f in files:
        good, refused = checked_rows(read_ops(f, limit), str(f))
        frames.append(good)
        refusals.append(refused)
    ops = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    if not len(ops):
        shown = "; ".join(str(r) if r.refused else f"{r.source}: no row" for r in refusals)
        raise OpsError(f"no usable row to import: {shown}")
    return ops, [r for r in refusals if r.refused]


@clear_errors(OpsError, "files")
def run(args: argparse.Namespace) -> int:
    from rankscope.store import open_store
    from rankscope.times import parse_time

    tp, dsp = args.tp, args.dsp
    ops, refusals = load(args.files, FileLimit.mb(args.max_file_mb))
    for refused in refusals:
        print(f"rankscope import-ops: warning: {refused}; importing the rest", file=sys.stderr, flush=True)
    if args.meta is not None:
        meta = read_meta(args.meta)
        tp, dsp = meta["tp_size"], meta["dsp_size"]
        found = {"pp_size": int(ops["stage"].max()) + 1, "dp_size": int(ops["dp_rank"].max()) + 1}
        wrong = [f"{k} {meta[k]} (the trace has {v})" for k, v in found.items() if meta[k] != v]
        if wrong:
            raise OpsError(f"--meta {args.meta} does not describe the trace: {', '.join(wrong)}")
    if tp < 1 or dsp < 1:
        raise OpsError("--tp and --dsp must be positive")
    now_ms = int(time.time() * 1000)
    start_ms = 0 if args.start is None else parse_time(args.start, "--start", now_ms=now_ms, assume_utc=True)
    frame, lay = stage_frame(ops, args.job, start_ms, ranks_per_worker=tp * dsp, gpus_per_node=args.gpus_per_node,
                             host_pattern=args.host_pattern)
    if args.start is None:   # the last point is now
        frame["time"] += now_ms - int(frame["time"].max())
        check_times(frame["time"].to_numpy(np.float64), frame["iteration"].to_numpy())
    with open_store(args.store, args.bucket) as store:
        store.write_stage_latency(frame)
    stages = [c for c in frame.columns if c in set(OPTYPE_STAGES.values())]
    t = lay.topology
    print(f"imported {len(frame)} point(s): {t.world} worker(s) (pp {t.pp} x dp {t.dp}, "
          f"{lay.ranks_per_worker} rank(s) each, {t.gpus_per_node} per node), "
          f"{frame['iteration'].nunique()} step(s) {int(frame['iteration'].min())}-"
          f"{int(frame['iteration'].max())}, stages {', '.join(stages)}", file=sys.stdout)
    return 0
