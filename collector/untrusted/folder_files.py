"""The files of a folder, never a file outside it.

An importer given a folder reads the regular files in it whose names it wants. A symlink in
the folder whose target lies outside it (a file of another user, ``/etc/shadow``, a device)
is refused, by name, together with its target: the folder is shared by every rank's
process, and whoever can write to it must not make the importer read elsewhere. Symlinks
to folders are not followed; symlinks that stay inside the folder are read. A file named on
the command line is read wherever it lies: the user chose it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path


def files_in(folder: Path, wanted: Callable[[Path], bool], *, recursive: bool = True,
             error: type[Exception] = ValueError) -> list[Path]:
    """The regular files under ``folder`` (in its subfolders too with ``recursive``) that
    ``wanted`` picks, sorted; ``error`` naming every picked symlink that points outside it."""
    root = folder.resolve()
    found: list[Path] = []
    outside: list[str] = []
    for f in sorted(folder.rglob("*") if recursive else folder.glob("*")):
        if not wanted(f):
            continue
        try:
            target = f.resolve()
        except (OSError, RuntimeError):   # a symlink loop
            outside.append(f"{f} -> (a symlink loop)")
            continue
        if not target.is_relative_to(root):
            outside.append(f"{f} -> {os.readlink(f) if f.is_symlink() else target}")
        elif f.is_file():
            found.append(f)
    if outside:
        shown = "; ".join(outside[:5]) + (f"; and {len(outside) - 5} more" if len(outside) > 5 else "")
        raise error(f"{folder}: refused {len(outside)} symlink(s) pointing outside the folder: {shown}. "
                    f"Copy those files in, or name them on the command line")
    return found


def named_files(paths: Iterable[str | Path], wanted: Callable[[Path], bool], *, what: str,
                error: type[Exception] = ValueError, allow_empty: bool = False) -> list[Path]:
    """The files named, and those ``wanted`` picks in the folders named (:func:`files_in`).
    A folder with none of ``what`` in it is an ``error``, unless ``allow_empty`` (a job that
    has not written yet); so is a name that does not exist."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = files_in(p, wanted, error=error)
            if not found and not allow_empty:
                raise error(f"{p}: no {what} in it")
            out += found
        elif p.exists():
            out.append(p)
        else:
            raise error(f"{p}: no such file or directory")
    return out
