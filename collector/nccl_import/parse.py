"""Step 1, parse: files and directories -> the record table (one format for all of them)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from collector.nccl_import.flight_recorder import FR_PREFIX, read_flight_recorder
from collector.nccl_import.inspector import inspector_records, read_inspector
from collector.nccl_import.records import NcclError, with_members


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
    return with_members(df)
