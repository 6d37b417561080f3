"""Step 1, parse: files and directories -> the record table (one format for all of them).

Every file is read within a :class:`~collector.untrusted.bounded_read.FileLimit`; a directory gives its
files, never a symlink out of it (:func:`collector.untrusted.folder_files.named_files`).

**What is good is kept** (:func:`read_files`). Each file is read on its own:

- an empty file, or one cut short (a process that has just started, a dump still being
  written: :class:`~collector.nccl_import.records.Incomplete`), is skipped with a warning; so
  is an Inspector log's last line without its newline (the lines before it are read);
- a file that cannot be read (not a record file, a device, over the size limit, a bad record,
  a log without the job-wide communicator that gives its rank) is refused, named, and the
  others are imported. A bad record refuses its whole file, never itself alone: a record left
  out would move the collectives around it into another iteration.

:func:`load` is the strict form: any refused file raises. Flight Recorder rows are timed by
:func:`~collector.nccl_import.arrivals.timed` (durations, else waits from arrivals).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from collector.nccl_import.arrivals import CLOCK_SKEW_MS, Timing, timed
from collector.nccl_import.flight_recorder import FR_PREFIX, read_flight_recorder
from collector.nccl_import.inspector import inspector_records, read_inspector
from collector.nccl_import.records import Incomplete, NcclError, with_members
from collector.untrusted.bounded_read import DEFAULT_LIMIT, FileLimit
from collector.untrusted.folder_files import named_files

FORMATS = ("inspector", "flight-recorder", "auto")


@dataclass
class Loaded:
    """What :func:`read_files` made of the files."""

    #: The record table of the files read.
    records: pd.DataFrame
    #: ``inspector`` or ``flight-recorder``.
    fmt: str
    #: Files (or last lines) skipped as still being written, one message each.
    skipped: list[str] = field(default_factory=list)
    #: Files refused, one message each naming the file and what was wrong.
    refused: list[str] = field(default_factory=list)
    #: How Flight Recorder collectives were timed (None for Inspector logs: durations).
    timing: Timing | None = None


def detect_format(path: Path) -> str:
    """``inspector`` (a ``.log`` of JSON lines, or any file of them with a ``coll_perf``) or
    ``flight-recorder`` (its name holds :data:`FR_PREFIX`, or a pickle or a JSON dump)."""
    if FR_PREFIX in path.name:
        return "flight-recorder"
    if path.exists() and not path.is_file():
        raise NcclError(f"{path}: not a regular file (a device or FIFO is not read)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise NcclError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not head:
        raise Incomplete(f"{path}: empty (what a process that has just started leaves)")
    if head[:1] == b"{" and (b'"coll_perf"' in head or path.suffix == ".log"):
        return "inspector"
    if head[:1] == b"{" and b'"entries"' in head or head[:1] == b"\x80":
        return "flight-recorder"
    raise NcclError(f"{path}: neither an NCCL Inspector log (JSON lines with coll_perf) nor a Flight "
                    f"Recorder dump ({FR_PREFIX}<rank>, pickle or JSON); give --format")


def record_file(path: Path) -> bool:
    """Whether a file of a directory is one to read: an Inspector log or a Flight Recorder dump."""
    return path.suffix == ".log" or FR_PREFIX in path.name


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files, and the files of directories (Inspector ``*.log``, Flight Recorder dumps); a
    symlink in a directory that points outside it is refused, by name."""
    return named_files(paths, record_file, error=NcclError,
                       what=f"Inspector log (*.log) or Flight Recorder dump (*{FR_PREFIX}*)")


def _read_one(path: Path, fmt: str, limit: FileLimit, skipped: list[str]) -> tuple[str, object]:
    """One file's format and content: Inspector raw records, or a dump's rows."""
    kind = detect_format(path) if fmt == "auto" else fmt
    if kind == "flight-recorder":
        return kind, read_flight_recorder(path, limit)
    raw, _, read = read_inspector(path, limit=limit)
    size = path.stat().st_size
    if not raw:
        raise Incomplete(f"{path}: {'empty' if not size else 'no complete record yet'} (what a process "
                         f"that has just started leaves)")
    if read < size:
        skipped.append(f"{path}: its last line ({size - read} bytes, no newline yet) is being written; "
                       f"left out")
    return kind, raw


def read_files(paths: Iterable[str | Path], fmt: str = "auto", limit: FileLimit = DEFAULT_LIMIT,
               clock_skew_ms: float = CLOCK_SKEW_MS) -> Loaded:
    """The record table of the files that could be read (one format for all), and what was
    skipped or refused (see the module's doc); raises when nothing could be imported."""
    if fmt not in FORMATS:
        raise NcclError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    skipped: list[str] = []
    refused: list[str] = []
    parts: dict[Path, tuple[str, object]] = {}
    for f in expand(paths):
        try:
            parts[f] = _read_one(f, fmt, limit, skipped)
        except Incomplete as exc:
            skipped.append(f"{exc}; skipped")
        except NcclError as exc:
            refused.append(str(exc))
    kinds = {kind for kind, _ in parts.values()}
    if len(kinds) > 1:
        raise NcclError("the files mix Inspector logs and Flight Recorder dumps; import them separately")
    if not parts:
        raise NcclError(_nothing(refused, skipped))
    if kinds == {"inspector"}:
        raw = [r for _, recs in parts.values() for r in recs]   # type: ignore[union-attr]
        records = inspector_records(raw, unranked=refused)
        return Loaded(records, "inspector", skipped, refused)
    df = pd.concat([rows for _, rows in parts.values()], ignore_index=True)   # type: ignore[misc]
    dup = df.groupby("rank")["source"].nunique()
    if (dup > 1).any():
        r = int(dup.index[dup > 1][0])
        raise NcclError(f"rank {r} has more than one dump: {', '.join(sorted(set(df.loc[df['rank'] == r, 'source'])))}")
    df, timing = timed(df, clock_skew_ms)
    return Loaded(with_members(df), "flight-recorder", skipped, refused, timing)


def _nothing(refused: list[str], skipped: list[str]) -> str:
    """The error when no file could be read: the one reason, or the count and the first few."""
    reasons = refused + skipped
    if len(reasons) == 1:
        return reasons[0]
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    return f"nothing to import: {len(refused)} file(s) refused, {len(skipped)} skipped: {shown}"


def load(paths: Iterable[str | Path], fmt: str = "auto", limit: FileLimit = DEFAULT_LIMIT,
         clock_skew_ms: float = CLOCK_SKEW_MS) -> pd.DataFrame:
    """The record table of the given files, strictly: any refused file raises (naming it)."""
    loaded = read_files(paths, fmt, limit, clock_skew_ms)
    if loaded.refused:
        more = len(loaded.refused) - 1
        raise NcclError(loaded.refused[0] + (f" (and {more} more file(s) refused)" if more else ""))
    return loaded.records
