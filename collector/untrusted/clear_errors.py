"""An import command's last line of defence: an error message, never a traceback.

The importers check what they read and raise their own errors (``ValueError``s naming the
file, the record and the field), which the command line prints. Anything else that escapes
an import (a case no check foresaw, or memory running out) is turned into such an error
here, naming the command's inputs and the exception; the traceback goes to the debug log
(``rankscope -vv``), not to the user.
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

Command = Callable[[argparse.Namespace], int]


def clear_errors(error: type[ValueError], inputs: str) -> Callable[[Command], Command]:
    """Wrap a command's ``run(args)``: an exception the command line would not print (anything
    but a ``ValueError``, ``OSError`` or ``RuntimeError``; a ``RecursionError`` too) becomes
    ``error``, naming the files in ``args.<inputs>``."""

    def wrap(run: Command) -> Command:
        @functools.wraps(run)
        def guarded(args: argparse.Namespace) -> int:
            try:
                return run(args)
            except RecursionError:
                raise error(f"{_named(getattr(args, inputs, ()))}: nested too deeply to read") from None
            except (ValueError, OSError, RuntimeError, KeyboardInterrupt):
                raise   # the importers' own errors: the command line prints them
            except MemoryError:
                raise error(f"{_named(getattr(args, inputs, ()))}: ran out of memory; lower --max-file-mb "
                            f"to refuse such files early, or import fewer files at once") from None
            except Exception as exc:  # the point of this wrapper: no traceback reaches the user
                log.debug("unexpected error importing %s", getattr(args, inputs, ()), exc_info=True)
                raise error(f"{_named(getattr(args, inputs, ()))}: cannot import: {type(exc).__name__}: "
                            f"{str(exc)[:300]} (rankscope -vv shows where)") from None
        return guarded

    return wrap


def _named(paths: Sequence[object]) -> str:
    shown = ", ".join(map(str, list(paths)[:3]))
    return shown + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")
