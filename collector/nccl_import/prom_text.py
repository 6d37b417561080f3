"""Read Prometheus textfiles (the text exposition format, version 0.0.4) as data.

NCCL Inspector's Prometheus mode (``NCCL_INSPECTOR_PROM_DUMP=1``; NVIDIA/nccl
``ext-profiler/inspector/inspector_prom.cc``) rewrites ``nccl_inspector_metrics_<gpu-uuid>.prom``
in ``NCCL_INSPECTOR_DUMP_DIR`` for node_exporter's textfile collector. The format, one sample a
line::

    # HELP name text          (and # TYPE name gauge; any other line starting with # too: ignored)
    name{label="value",...} value [timestamp]

Label values escape ``\\\\``, ``\\"`` and ``\\n``; a value is a float, ``NaN``, ``+Inf`` or ``-Inf``.

The files come from every node of a cluster, so each is read as hostile data: within
``--max-file-mb`` (:func:`~collector.untrusted.bounded_read.open_bounded`), a line at most
:data:`MAX_LINE_BYTES` long (a longer one is refused without being held), at most
:data:`MAX_LABELS` labels a sample. A line that breaks the format is refused, counted and the
first named (``FILE:LINE``); the others are kept. A file that cannot be read at all (over the
limit, not a regular file) is named and the others read. The plugin truncates and rewrites its file in
place, so a reader may catch it half written: a last line without its newline is left out
(named in :attr:`TextRead.partial`), and an empty file holds no sample.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd

from collector.nccl_import.records import NcclError
from collector.untrusted.bounded_read import DEFAULT_LIMIT, FileLimit, open_bounded
from collector.untrusted.folder_files import named_files

#: The Inspector's Prometheus files: ``nccl_inspector_metrics_<gpu-uuid>.prom``.
PROM_PREFIX, PROM_SUFFIX = "nccl_inspector_metrics_", ".prom"
#: The longest line read (the plugin's are below 2 KiB).
MAX_LINE_BYTES = 64 << 10
#: The most labels one sample may carry (the plugin writes 12).
MAX_LABELS = 64
#: Columns of a samples frame besides the labels (``@`` never starts a label name).
WHERE, VALUE, SEEN_MS = "@where", "@value", "@seen_ms"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?Inf|NaN"
_SAMPLE = re.compile(rf"({_NAME})[ \t]*(?:\{{(.*)\}})?[ \t]+({_NUMBER})(?:[ \t]+-?\d+)?[ \t]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,?)')
_ESCAPE = re.compile(r"\\(.)")
_TOO_LONG = object()


@dataclass
class TextRead:
    """What reading textfiles gave: the samples of the wanted metrics, and what was left out."""

    #: One row per sample: :data:`WHERE` (``FILE:LINE``), :data:`VALUE`, :data:`SEEN_MS` (NaN:
    #: a file says nothing of when it was scraped), the metric (``__name__``) and the labels.
    samples: pd.DataFrame
    #: Lines that break the format, and the first of them (``FILE:LINE: why``).
    refused: int = 0
    first_refused: str = ""
    #: Half-written last lines left out, and files that held no sample.
    partial: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    #: Files that could not be read at all (over the limit, not a regular file), one message each.
    unreadable: list[str] = field(default_factory=list)


def prom_file(path: Path) -> bool:
    """Whether a file of a directory is one of the Inspector's Prometheus files."""
    return path.name.startswith(PROM_PREFIX) and path.name.endswith(PROM_SUFFIX)


def prom_files(paths: list[str | Path], allow_empty: bool = False) -> list[Path]:
    """Given files, and the Inspector's ``.prom`` files in given directories (and their
    subdirectories: copies kept per snapshot); a symlink out of a directory is refused. A
    directory without one is an error, unless ``allow_empty`` (a job not started yet)."""
    return named_files(paths, prom_file, error=NcclError, allow_empty=allow_empty,
                       what=f"NCCL Inspector Prometheus file ({PROM_PREFIX}*{PROM_SUFFIX})")


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: {"n": "\n", "\\": "\\", '"': '"'}.get(m.group(1), "\\" + m.group(1)), text)


def parse_sample(line: str) -> tuple[str, dict[str, str], float]:
    """One sample line -> (metric, labels, value); ValueError saying what breaks the format."""
    m = _SAMPLE.fullmatch(line)
    if m is None:
        raise ValueError("not a sample (name{label=\"value\",...} value [timestamp])")
    labels: dict[str, str] = {}
    block, pos = m.group(2) or "", 0
    while pos < len(block.rstrip()):
        lm = _LABEL.match(block, pos)
        if lm is None:
            raise ValueError(f"bad label at {block[pos:pos + 40]!r}")
        if lm.group(1) in labels:
            raise ValueError(f"label {lm.group(1)!r} given twice")
        if len(labels) >= MAX_LABELS:
            raise ValueError(f"more than {MAX_LABELS} labels")
        labels[lm.group(1)] = _unescape(lm.group(2))
        pos = lm.end()
        if not lm.group(3):
            break
    if block[pos:].strip():
        raise ValueError(f"bad label at {block[pos:pos + 40]!r}")
    return m.group(1), labels, float(m.group(3))


def _lines(fh: BinaryIO) -> Iterator[bytes | object]:
    """Lines of at most MAX_LINE_BYTES (a longer one: ``_TOO_LONG``, never held whole)."""
    while raw := fh.readline(MAX_LINE_BYTES + 1):
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = fh.readline(MAX_LINE_BYTES + 1)
            yield _TOO_LONG
        else:
            yield raw


def read_text(path: Path, metrics: frozenset[str], limit: FileLimit = DEFAULT_LIMIT) -> TextRead:
    """The samples of ``metrics`` in one textfile (see the module's doc for what is left out)."""
    rows: list[dict[str, str]] = []
    where: list[str] = []
    values: list[float] = []
    out = TextRead(pd.DataFrame())
    with open_bounded(path, limit, NcclError) as fh:
        for i, raw in enumerate(_lines(fh), start=1):
            if raw is not _TOO_LONG and not raw.endswith(b"\n"):
                out.partial.append(str(path))
                break
            try:
                if raw is _TOO_LONG:
                    raise ValueError(f"line longer than {MAX_LINE_BYTES} bytes")
                text = raw.decode("utf-8").strip()
                if not text or text.startswith("#"):
                    continue
                name, labels, value = parse_sample(text)
            except (ValueError, UnicodeDecodeError) as exc:
                out.refused += 1
                out.first_refused = out.first_refused or f"{path}:{i}: {exc}"
                continue
            if name in metrics:
                rows.append({"__name__": name, **labels})
                where.append(f"{path}:{i}")
                values.append(value)
    if not rows:
        out.empty.append(str(path))
    out.samples = samples_frame(rows, where, values)
    return out


def samples_frame(labels: list[dict[str, str]], where: list[str], values: list[float],
                  seen_ms: list[float] | None = None) -> pd.DataFrame:
    """The samples frame of :class:`TextRead` from per-sample label dicts and values."""
    frame = pd.DataFrame(labels, dtype=object)
    frame[WHERE] = np.asarray(where, dtype=object)
    frame[VALUE] = np.asarray(values, dtype=np.float64)
    frame[SEEN_MS] = np.asarray(seen_ms if seen_ms is not None else [np.nan] * len(values), dtype=np.float64)
    return frame


def read_texts(paths: list[Path], metrics: frozenset[str], limit: FileLimit = DEFAULT_LIMIT) -> TextRead:
    """The samples of ``metrics`` in several textfiles, and what each left out, added up."""
    reads, unreadable = [], []
    for p in paths:
        try:
            reads.append(read_text(p, metrics, limit))
        except NcclError as exc:
            unreadable.append(str(exc))
    frames = [r.samples for r in reads if len(r.samples)]
    total = TextRead(pd.concat(frames, ignore_index=True) if frames else samples_frame([], [], []),
                     unreadable=unreadable)
    for r in reads:
        total.refused += r.refused
        total.first_refused = total.first_refused or r.first_refused
        total.partial += r.partial
        total.empty += r.empty
    return total
