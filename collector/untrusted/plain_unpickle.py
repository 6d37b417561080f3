"""Unpickling plain data only: containers and scalars, never code.

``pickle.loads`` runs whatever a file names: a ``__reduce__`` that returns ``os.system`` runs a
command on load. A pickle of plain data (``dict``, ``list``, ``tuple``, ``str``, ``bytes``,
``int``, ``float``, ``bool``, ``None``, ``set``, ``frozenset``) is built by opcodes alone and
names no global (protocols 0 to 2 name ``builtins.set``/``frozenset`` and build bytes with
``_codecs.encode(text, "latin1")``: those are allowed, checked); PyTorch's Flight Recorder dumps (its C++ pickler, checked
on torch 2.13) are such pickles. This unpickler refuses every global and every persistent id,
by name, before anything is called, with one exception: a numpy number (``numpy.dtype`` of a
bool, integer or float kind, and ``numpy._core.multiarray.scalar``, as numpy pickles
``np.float64(1.5)``) is read from its bytes as the Python number it holds, without handing
numpy anything but the kind's name and those bytes (an object-dtype scalar would be a raw
pointer, so any other dtype is refused).
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Callable
from typing import Any

import numpy as np

#: ``numpy.dtype`` specs of plain numbers: bool, signed and unsigned integers, floats.
_NUMBER_SPEC = re.compile(r"[biuf][1248]|f16")
_SCALAR = {("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar")}
#: What protocols 0 to 2 name for plain data: sets, and bytes as ``_codecs.encode(text, "latin1")``.
_PLAIN = {("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
          ("__builtin__", "set"): set, ("__builtin__", "frozenset"): frozenset}


class RefusedPickle(ValueError):
    """A pickle that names code (a global or a persistent id); the message names it."""


class _NumberDtype:
    """A numpy dtype of a plain number as a pickle builds it: its spec and byte order only."""

    def __init__(self, spec: object, refuse: Callable[[str], RefusedPickle], *_flags: object):
        if not isinstance(spec, str) or not _NUMBER_SPEC.fullmatch(spec):
            raise refuse(f"numpy.dtype({str(spec)[:20]!r})")
        self.spec, self.order, self._refuse = spec, "=", refuse

    def __setstate__(self, state: object) -> None:
        if not isinstance(state, tuple) or len(state) < 2 or state[1] not in ("<", ">", "|", "="):
            raise self._refuse("a numpy.dtype state")
        self.order = state[1] if state[1] in ("<", ">") else "="

    def number(self, data: object) -> int | float | bool:
        """The number ``data`` (the scalar's raw bytes) holds."""
        dtype = np.dtype(self.spec).newbyteorder(self.order)
        if not isinstance(data, bytes) or len(data) != dtype.itemsize:
            raise self._refuse(f"a numpy {self.spec} scalar of {len(data) if isinstance(data, bytes) else '?'} bytes")
        return np.frombuffer(data, dtype=dtype)[0].item()


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data and refuses every global (but numpy numbers)."""

    def __init__(self, data: bytes | bytearray, source: str, what: str):
        super().__init__(io.BytesIO(data))
        self._source, self._what = source, what

    def _refuse(self, name: str) -> RefusedPickle:
        return RefusedPickle(f"refused to unpickle {name!r} in {self._source}: {self._what} hold plain data only")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("numpy", "dtype"):
            return self._dtype
        if (module, name) in _SCALAR:
            return self._number
        if (module, name) == ("_codecs", "encode"):
            return self._latin1
        if (module, name) in _PLAIN:
            return _PLAIN[module, name]
        raise self._refuse(f"{module}.{name}")

    def _latin1(self, text: object, encoding: object = None) -> bytes:
        if not isinstance(text, str) or encoding != "latin1":
            raise self._refuse(f"_codecs.encode(..., {str(encoding)[:20]!r})")
        return text.encode("latin1")

    def _dtype(self, spec: object, *flags: object) -> _NumberDtype:
        return _NumberDtype(spec, self._refuse, *flags)

    def _number(self, dtype: object, data: object = None) -> int | float | bool:
        if not isinstance(dtype, _NumberDtype):
            raise self._refuse("a numpy scalar of a non-number dtype")
        return dtype.number(data)

    def persistent_load(self, pid: Any) -> Any:
        raise self._refuse("a persistent id")


def loads_plain(data: bytes | bytearray, source: str, what: str = "these files") -> Any:
    """The plain data pickled in ``data``; :class:`RefusedPickle` (naming the global and
    ``source``) for anything that would call code. Other damage raises what ``pickle`` raises."""
    return _PlainUnpickler(data, source, what).load()
