"""Who this process is in the job: rank, parallel coordinates, node, machine and job name.

Every ``stage_latency`` point carries these tags (``job, rank, pp, dp, tp,
ep_group, node, host`` and, where known, ``gpu``; the GPU's UUID as the
``gpu_uuid`` field), so the analyzer can compare the ranks of one parallel group
and an operator knows which machine to drain. The parallel coordinates come, in
order of preference, from

1. Megatron-LM's ``megatron.core.parallel_state`` when it is importable and
   initialised (its TP/PP/DP/EP sizes build the :class:`Topology`, and the
   rank's own coordinates are cross-checked against it);
2. the user's :class:`~rankscope.topology.Topology` plus the global rank of
   ``torch.distributed`` (or the ``RANK`` environment variable of torchrun);
3. without either, a pure data-parallel job over the whole world.

The job name comes from the argument, else ``RANKSCOPE_JOB``, else torchrun's
``TORCHELASTIC_RUN_ID``. The machine: the host name from the argument, else
``RANKSCOPE_HOST``, else :func:`socket.gethostname`; the local GPU from torchrun's
``LOCAL_RANK``, else the current CUDA device when CUDA is already initialised
(see :func:`local_gpu`). After a restart torchrun's ``TORCHELASTIC_RESTART_COUNT`` is the
``attempt`` field of every point (see :func:`attempt`): the analyzer tells a restart from a
checkpoint (iteration numbers going back) by it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.lineprotocol import check_key
from rankscope.stage_rows import COORD_TAGS, stage_rows
from rankscope.topology import Topology

#: Environment variable overriding the host name the points carry.
HOST_ENV = "RANKSCOPE_HOST"


class CoordinatesError(ValueError):
    """The rank, world or job name cannot be determined, or do not fit the topology."""


@dataclass(frozen=True)
class RankCoordinates:
    """The tags of one rank's points, and the identity of the machine it runs on.

    ``host`` is the machine's host name (what an operator drains), ``gpu`` the local
    device index (None when unknown, e.g. on CPU outside torchrun) and ``gpu_uuid``
    the GPU's UUID (``GPU-...``): a field of the points, not a tag; so is ``attempt``, how
    often the job was restarted (torchrun's ``TORCHELASTIC_RESTART_COUNT``; None: unknown).
    """

    job: str
    rank: int
    pp: int
    dp: int
    tp: int
    ep_group: int
    node: int
    host: str
    gpu: int | None = None
    gpu_uuid: str | None = None
    attempt: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise CoordinatesError(f"host name must be a non-empty string, got {self.host!r}")
        check_key(self.host, "host name")
        if self.gpu is not None and (isinstance(self.gpu, bool) or not isinstance(self.gpu, int)
                                     or self.gpu < 0):
            raise CoordinatesError(f"gpu must be a non-negative device index or None, got {self.gpu!r}")
        if self.attempt is not None and (isinstance(self.attempt, bool) or not isinstance(self.attempt, int)
                                         or self.attempt < 0):
            raise CoordinatesError(f"attempt must be a non-negative restart count or None, got {self.attempt!r}")

    def tags(self) -> dict[str, Any]:
        """The ``stage_latency`` tag columns of this rank (``gpu`` only when known)."""
        out: dict[str, Any] = {"job": self.job, "rank": self.rank, "pp": self.pp, "dp": self.dp,
                               "tp": self.tp, "ep_group": self.ep_group, "node": self.node,
                               "host": self.host}
        if self.gpu is not None:
            out["gpu"] = self.gpu
        return out

    def fields(self) -> dict[str, Any]:
        """Constant fields of this rank's points: ``gpu_uuid`` and ``attempt`` when known."""
        out: dict[str, Any] = {} if not self.gpu_uuid else {schema.GPU_UUID_FIELD: self.gpu_uuid}
        if self.attempt is not None:
            out[schema.ATTEMPT_FIELD] = self.attempt
        return out

    def rows(self, iteration: Any, time_ms: Any, stages: Mapping[str, Any],
             iteration_ms: Any = None) -> pd.DataFrame:
        """This rank's ``stage_latency`` rows (scalars: one row; arrays: one per iteration),
        built by :func:`~rankscope.stage_rows.stage_rows` with :meth:`tags` and :meth:`fields`."""
        coords = {t: getattr(self, t) for t in COORD_TAGS}
        return stage_rows(self.job, np.full(np.size(iteration), self.rank), iteration, time_ms, stages,
                          coords=coords, iteration_ms=iteration_ms, host=self.host, gpu=self.gpu,
                          fields=self.fields())

    @classmethod
    def from_topology(cls, topology: Topology, rank: int, job: str, host: str | None = None,
                      gpu: int | None = None, gpu_uuid: str | None = None,
                      attempt: int | None = None) -> RankCoordinates:
        """Coordinates of ``rank`` in ``topology``.

        ``host`` defaults to the topology's host name of the rank's node when it has host
        names, else to this machine's (:func:`host_name`).
        """
        if not isinstance(job, str) or not job:
            raise CoordinatesError(f"job name must be a non-empty string, got {job!r}")
        check_key(job, "job name")
        c = topology.coords_of(rank)
        if host is None:
            host = topology.host_names([c["node"]])[0] if topology.hosts is not None else host_name()
        return cls(job=job, rank=c["rank"], pp=c["pp"], dp=c["dp"], tp=c["tp"],
                   ep_group=c["ep_group"], node=c["node"], host=host, gpu=gpu, gpu_uuid=gpu_uuid,
                   attempt=attempt)


def host_name(host: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """This machine's host name: ``host``, else ``RANKSCOPE_HOST``, else :func:`socket.gethostname`."""
    env = os.environ if env is None else env
    name = host or env.get(HOST_ENV) or socket.gethostname()
    if not name:
        raise CoordinatesError(f"no host name: pass host=... or set {HOST_ENV}")
    return name


def local_gpu(env: Mapping[str, str] | None = None, cuda: Any = None) -> tuple[int | None, str | None]:
    """``(local device index, GPU UUID)`` of this process, each None when unknown.

    The index is torchrun's ``LOCAL_RANK``, else ``torch.cuda.current_device()`` when CUDA
    is available and already initialised (this function never initialises CUDA: that
    would create a context as a side effect). The UUID comes from
    ``torch.cuda.get_device_properties(current_device).uuid`` under the same condition.
    Every torch call is guarded: a failure leaves the value unknown. ``cuda`` stands in
    for ``torch.cuda`` (default: that module, when torch is installed).
    """
    env = os.environ if env is None else env
    gpu = _env_count(env, "LOCAL_RANK")
    if cuda is None:
        try:
            import torch

            cuda = torch.cuda
        except Exception:  # noqa: BLE001 - no torch (or a broken one): no GPU to name
            return gpu, None
    try:
        if not (cuda.is_available() and cuda.is_initialized()):
            return gpu, None
        device = int(cuda.current_device())
    except Exception:  # noqa: BLE001 - a driver error leaves the device unknown
        return gpu, None
    if gpu is None:
        gpu = device
    try:
        uuid = str(cuda.get_device_properties(device).uuid)
    except Exception:  # noqa: BLE001 - older torch has no uuid property
        return gpu, None
    if not uuid:
        return gpu, None
    return gpu, uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def attempt(env: Mapping[str, str] | None = None) -> int | None:
    """How often torchrun restarted the job: ``TORCHELASTIC_RESTART_COUNT`` (None outside torchrun)."""
    return _env_count(os.environ if env is None else env, "TORCHELASTIC_RESTART_COUNT")


def _env_count(env: Mapping[str, str], name: str) -> int | None:
    """The non-negative integer in ``env[name]`` (None: unset or empty); anything else is an error naming it."""
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise CoordinatesError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise CoordinatesError(f"{name}={raw!r} is negative")
    return value


def job_name(job: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The job name: ``job``, else ``RANKSCOPE_JOB``, else ``TORCHELASTIC_RUN_ID``."""
    env = os.environ if env is None else env
    name = job or env.get("RANKSCOPE_JOB") or env.get("TORCHELASTIC_RUN_ID")
    if not name:
        raise CoordinatesError("no job name: pass job=... or set RANKSCOPE_JOB")
    return name


def world_and_rank(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(world_size, rank)`` from an initialised ``torch.distributed``, else ``WORLD_SIZE``/``RANK``."""
    env = os.environ if env is None else env
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
    except ImportError:
        pass
    try:
        return int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "0"))
    except ValueError:
        raise CoordinatesError(
            f"WORLD_SIZE={env.get('WORLD_SIZE')!r} / RANK={env.get('RANK')!r} are not integers") from None


def megatron_parallel_state() -> ModuleType | None:
    """Megatron-LM's ``parallel_state`` module when importable and initialised, else None."""
    try:
        from megatron.core import parallel_state  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        if not parallel_state.model_parallel_is_initialized():
            return None
    except Exception:  # older releases lack the function or raise before init
        return None
    return parallel_state


def topology_from_megatron(ps: Any, world: int, gpus_per_node: int) -> Topology:
    """The :class:`Topology` Megatron-LM's parallel state describes (its default rank order)."""
    tp = int(ps.get_tensor_model_parallel_world_size())
    pp = int(ps.get_pipeline_model_parallel_world_size())
    dp = int(ps.get_data_parallel_world_size())
    ep_fn = getattr(ps, "get_expert_model_parallel_world_size", None)
    ep = int(ep_fn()) if ep_fn is not None else 1
    if tp * pp * dp != world:
        raise CoordinatesError(
            f"Megatron-LM parallel state tp={tp} x pp={pp} x dp={dp} = {tp * pp * dp} "
            f"does not match the world size {world} (context parallelism is not modelled)")
    return Topology(tp=tp, pp=pp, dp=dp, ep=ep, gpus_per_node=gpus_per_node)


def detect(
    topology: Topology | None = None,
    job: str | None = None,
    gpus_per_node: int | None = None,
    env: Mapping[str, str] | None = None,
    parallel_state: Any | None = None,
    host: str | None = None,
    cuda: Any = None,
) -> tuple[RankCoordinates, Topology]:
    """This process's coordinates and the job's topology (see the module docstring).

    ``gpus_per_node`` defaults to ``LOCAL_WORLD_SIZE`` (torchrun), else the
    topology's own, else the whole world on one node. ``parallel_state`` may
    be passed explicitly (default: Megatron-LM's when present).

    The host is where this process runs (``host``, else ``RANKSCOPE_HOST``, else the
    machine's host name), even when the topology names other hosts for the rank's node:
    the analyzer follows the hosts the ranks report. ``cuda`` as for :func:`local_gpu`.
    """
    env = os.environ if env is None else env
    name = job_name(job, env)
    machine = host_name(host, env)
    gpu, gpu_uuid = local_gpu(env, cuda)
    ident = {"host": machine, "gpu": gpu, "gpu_uuid": gpu_uuid, "attempt": attempt(env)}
    world, rank = world_and_rank(env)
    if world < 1 or not 0 <= rank < world:
        raise CoordinatesError(f"rank {rank} is outside a world of {world} ranks")
    if gpus_per_node is None and env.get("LOCAL_WORLD_SIZE"):
        gpus_per_node = int(env["LOCAL_WORLD_SIZE"])
    ps = parallel_state if parallel_state is not None else (None if topology else megatron_parallel_state())
    if topology is None and ps is not None:
        topology = topology_from_megatron(ps, world, gpus_per_node or min(world, 8))
        coords = RankCoordinates.from_topology(topology, rank, name, **ident)
        want = {"tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
                "dp": ps.get_data_parallel_rank()}
        got = {"tp": coords.tp, "pp": coords.pp, "dp": coords.dp}
        if {k: int(v) for k, v in want.items()} != got:
            raise CoordinatesError(
                f"rank {rank}: Megatron-LM says {want} but the tp-dp-pp order gives {got}; "
                f"pass topology=Topology(..., order=...) matching the job's rank order")
        return coords, topology
    if topology is None:
        topology = Topology(dp=world, gpus_per_node=gpus_per_node or world)
    elif topology.world != world:
        raise CoordinatesError(
            f"the topology describes {topology.world} ranks (tp={topology.tp}, pp={topology.pp}, "
            f"dp={topology.dp}) but the job has a world of {world}")
    return RankCoordinates.from_topology(topology, rank, name, **ident), topology
