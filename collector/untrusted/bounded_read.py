"""Reading a file from the cluster with a bound: streamed, gunzipped on the fly, never more
than a limit.

The importers read files from folders every rank of a job can write to. Each file is read
as a stream (gunzipped on the fly when asked and its first bytes say gzip); once more than
the limit's bytes of input have come out (counted after decompression), the read stops with
an error naming the file and the flag that raises the limit. A 1 GiB gzip bomb in a 1 MB
file so costs one buffer, not a gigabyte; ``/dev/zero`` or a file still growing is bounded
the same way. Only regular files are read (a FIFO would block the import).

The limit (:class:`FileLimit`) is ``--max-file-mb`` on ``import-trace``, ``import-nccl``
and ``import-ops``, default :data:`DEFAULT_MAX_FILE_MB` (MB of 2^20 bytes).
"""

from __future__ import annotations

import argparse
import gzip
import io
import math
import os
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

#: Bytes in the MB of ``--max-file-mb``.
MB = 1 << 20
#: Default bound on one file's input, in MB (decompressed).
DEFAULT_MAX_FILE_MB = 1024
#: The flag that raises the bound.
FLAG = "--max-file-mb"
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class FileLimit:
    """The most bytes of input one read of a file may bring in, and the flag that raises it."""

    max_bytes: int = DEFAULT_MAX_FILE_MB * MB
    flag: str = FLAG

    @classmethod
    def mb(cls, mb: float) -> FileLimit:
        """The limit of ``mb`` MB (2^20 bytes each)."""
        if isinstance(mb, bool) or not isinstance(mb, int | float) or not math.isfinite(mb) or mb <= 0:
            raise ValueError(f"{FLAG} must be a positive number of MB, got {mb!r}")
        return cls(max(1, int(mb * MB)))

    def refusal(self, path: str | Path) -> str:
        """The error of a file that exceeds the limit."""
        return (f"{path}: more than {self.max_bytes / MB:g} MB of input (counted after decompression); "
                f"refused to read further. If the file is genuine, raise the limit with "
                f"{self.flag} (MB; default {DEFAULT_MAX_FILE_MB})")


#: The default limit.
DEFAULT_LIMIT = FileLimit()


def add_limit_option(parser: argparse.ArgumentParser) -> None:
    """``--max-file-mb`` on an import command."""
    parser.add_argument(FLAG, type=float, default=DEFAULT_MAX_FILE_MB, metavar="MB",
                        help=f"read at most this many MB (2^20 bytes) of input per file, counted after "
                             f"decompression (default {DEFAULT_MAX_FILE_MB}); a larger file is refused "
                             f"by name, so a gzip bomb or a runaway file cannot take all memory")


class _Bounded(io.RawIOBase):
    """A binary stream that raises ``error`` once it has given more than ``limit`` bytes."""

    def __init__(self, inner: BinaryIO, path: Path, limit: FileLimit, error: type[Exception]):
        super().__init__()
        self._inner, self._path, self._limit, self._error = inner, path, limit, error
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - any writable buffer
        want = min(len(buffer), _CHUNK, self._limit.max_bytes - self.count + 1)
        try:
            n = self._inner.readinto(memoryview(buffer)[:want])
        except (OSError, EOFError, zlib.error) as exc:
            raise self._error(f"{self._path}: cannot read: {type(exc).__name__}: {exc}") from None
        self.count += n or 0
        if self.count > self._limit.max_bytes:
            raise self._error(self._limit.refusal(self._path))
        return n or 0


def _opened(path: Path, error: type[Exception]) -> BinaryIO:
    """``path`` opened for reading, once it is known to be a regular file."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path}: not a regular file (a directory, device or FIFO is not read)")
        return open(path, "rb")  # noqa: SIM115 - closed by open_bounded
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


@contextmanager
def open_bounded(path: str | Path, limit: FileLimit, error: type[Exception] = ValueError, *,
                 gunzip: bool = False, offset: int = 0) -> Iterator[BinaryIO]:
    """``path`` as a buffered binary stream from byte ``offset`` that raises ``error`` (naming the
    file and the flag) once more than ``limit`` bytes have come out of it; with ``gunzip``, a file
    whose first bytes say gzip is decompressed on the fly (and the limit counts what comes out)."""
    p = Path(path)
    raw = _opened(p, error)
    with raw:
        if offset:
            raw.seek(offset)
        inner: BinaryIO = raw
        if gunzip and raw.peek(2)[:2] == _GZIP_MAGIC:  # type: ignore[attr-defined]
            inner = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        elif os.fstat(raw.fileno()).st_size - offset > limit.max_bytes:
            raise error(limit.refusal(p))   # a plain file's size says it at once
        with io.BufferedReader(_Bounded(inner, p, limit, error), _CHUNK) as stream:
            yield stream  # type: ignore[misc]


def read_bounded(path: str | Path, limit: FileLimit, error: type[Exception] = ValueError, *,
                 gunzip: bool = False) -> bytearray:
    """The whole content of ``path`` (see :func:`open_bounded`), read in chunks."""
    out = bytearray()
    with open_bounded(path, limit, error, gunzip=gunzip) as fh:
        while chunk := fh.read(_CHUNK):
            out += chunk
    return out
