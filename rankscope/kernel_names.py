"""How a kernel is named in the database: a short id from its name, its kind, and its name once.

Kernel names are many and long (a templated CUDA kernel's runs to thousands of characters), so a
kernel is stored as a field prefix ``k`` + 10 hex digits of the BLAKE2b hash of its name (never a
tag: the series stay one per rank) and its name once, in ``kernel_name``, stamped at the hour so
that every rank's copy of it is one point.

A kernel's mode ``j`` is three fields of a ``kernel_stats`` point, :func:`mode_field` (``n``,
``p50``, ``p99``), which :data:`MODE_FIELD` reads back; where the window's steps are known, its
time per step (its fastest quarter over the steps of the sum of its events in each) is one more,
:func:`step_field`.

Example::

    >>> mode_field("k0d1674e042", 0, "p50"), MODE_FIELD.match("k0d1674e042_m1_n").groups()
    ('k0d1674e042_m0_p50', ('k0d1674e042', '1', 'n'))
    >>> kernel_id("aten::mm"), kernel_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    ('k0d1674e042', 'comm')
    >>> kernel_kind("aten::broadcast_tensors"), kernel_kind("record_param_comms")
    ('compute', 'comm')
"""

from __future__ import annotations

import hashlib
import re

#: Characters of a kernel's name kept in ``kernel_name``.
MAX_NAME = 512
#: ``kernel_name`` points are stamped at the hour: all ranks' names of a kernel are one point.
HOUR_MS = 3_600_000
#: The id of the kernels pooled past the top K of a window.
OTHER = "other"
#: Modes a kernel may have in a point (the channel keeps 3); fields of others are not read.
MAX_MODES = 8
#: A mode field's name: (kernel id, mode, n | p50 | p99).
MODE_FIELD = re.compile(rf"^(k[0-9a-z]+)_m([0-{MAX_MODES - 1}])_(n|p50|p99)$")
_COMM = re.compile(r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast(?!_tensors)|nccl|gloo|"
                   r"c10d|record_param_comms|send|recv", re.IGNORECASE)


def kernel_id(name: str) -> str:
    """The field prefix of a kernel: ``k`` and 10 hex digits of its name's BLAKE2b hash."""
    return "k" + hashlib.blake2b(name.encode("utf-8", "replace"), digest_size=5).hexdigest()


def kernel_kind(name: str) -> str:
    """``comm`` for a collective or point-to-point transfer, else ``compute``."""
    return "comm" if _COMM.search(name) else "compute"


def mode_field(kid: str, mode: int, part: str) -> str:
    """The ``kernel_stats`` field of a kernel's mode: ``<id>_m<mode>_<n|p50|p99>``."""
    return f"{kid}_m{mode}_{part}"


def step_field(kid: str) -> str:
    """The ``kernel_stats`` field of a kernel's time per step (us): ``<id>_step_us``."""
    return f"{kid}_step_us"


def name_point(job: str, kid: str, name: str, kind: str, group: str, time_ms: int) -> dict:
    """A ``kernel_name`` point: the name cut to ``MAX_NAME``, stamped at the hour of ``time_ms``
    (every rank's copy of it is one point)."""
    return {"time": int(time_ms) // HOUR_MS * HOUR_MS, "job": job, "kernel": kid, "name": name[:MAX_NAME],
            "kind": kind, "group": group}
