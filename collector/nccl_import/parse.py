"""Step 1, parse: files and directories -> the record table (one format for all of them).

Every file is read within a :class:`~collector.untrusted.bounded_read.FileLimit`; a directory gives its
files, never a symlink out of it (:func:`collector.untrusted.folder_files.files_in`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from collector.nccl_import.flight_recorder import FR_PREFIX, read_flight_recorder
from collector.nccl_import.inspector import inspector_records, read_inspector
from collector.nccl_import.records import NcclError, with_members
from collector.untrusted.bounded_read import DEFAULT_LIMIT, FileLimit
from collector.untrusted.folder_files import files_in


def detect_format(path: Path) -> str:
    """``inspector`` (a ``.log`` of JSON lines with a ``coll_perf``) or ``flight-recorder``."""
    if path.name.startswith(FR_PREFIX):
        return "flight-recorder"
    if path.exists() and not path.is_file():
        raise NcclError(f"{path}: not a regular file (a device or FIFO is not read)")
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


def record_file(path: Path) -> bool:
    """Whether a file of a directory is one to read: an Inspector log or a Flight Recorder dump."""
    return path.suffix == ".log" or path.name.startswith(FR_PREFIX)


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files, and the files of directories (Inspector ``*.log``, Flight Recorder dumps); a
    symlink in a directory that points outside it is refused, by name."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files = files_in(p, record_file, error=NcclError)
            if not files:
                raise NcclError(f"{p}: no Inspector log (*.log) or Flight Recorder dump ({FR_PREFIX}*) in it")
            out += files
        elif p.exists():
            out.append(p)
        else:
            raise NcclError(f"{p}: no such file or directory")
    return out


def load(paths: Iterable[str | Path], fmt: str = "auto", limit: FileLimit = DEFAULT_LIMIT) -> pd.DataFrame:
    """The record table of the given files (one format for all), each read within ``limit``."""
    files = expand(paths)
    fmts = {f: (detect_format(f) if fmt == "auto" else fmt) for f in files}
    kinds = set(fmts.values())
    if len(kinds) > 1:
        raise NcclError("the files mix Inspector logs and Flight Recorder dumps; import them separately")
    if kinds == {"inspector"}:
        raw: list[dict] = []
        for f in files:
            raw += read_inspector(f, limit=limit)[0]
        return inspector_records(raw)
    if kinds != {"flight-recorder"}:
        raise NcclError(f"unknown format {fmt!r}; one of inspector, flight-recorder, auto")
    parts = [read_flight_recorder(f, limit) for f in files]
    df = pd.concat(parts, ignore_index=True)
    dup = df.groupby("rank")["source"].nunique()
    if (dup > 1).any():
        r = int(dup.index[dup > 1][0])
        raise NcclError(f"rank {r} has more than one dump: {', '.join(sorted(set(df.loc[df['rank'] == r, 'source'])))}")
    return with_members(df)
