"""Who this process is in the job: rank, parallel coordinates, node and job name.

Every ``stage_latency`` point carries these tags (``job, rank, pp, dp, tp,
ep_group, node``), so the analyzer can compare the ranks of one parallel group.
They come, in order of preference, from

1. Megatron-LM's ``megatron.core.parallel_state`` when it is importable and
   initialised (its TP/PP/DP/EP sizes build the :class:`Topology`, and the
   rank's own coordinates are cross-checked against it);
2. the user's :class:`~rankscope.topology.Topology` plus the global rank of
   ``torch.distributed`` (or the ``RANK`` environment variable of torchrun);
3. without either, a pure data-parallel job over the whole world.

The job name comes from the argument, else ``RANKSCOPE_JOB``, else torchrun's
``TORCHELASTIC_RUN_ID``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from rankscope.lineprotocol import check_key
from rankscope.topology import Topology


class CoordinatesError(ValueError):
    """The rank, world or job name cannot be determined, or do not fit the topology."""


@dataclass(frozen=True)
class RankCoordinates:
    """The tags of one rank's points."""

    job: str
    rank: int
    pp: int
    dp: int
    tp: int
    ep_group: int
    node: int

    def tags(self) -> dict[str, Any]:
        """The ``stage_latency`` tag columns of this rank."""
        return asdict(self)

    @classmethod
    def from_topology(cls, topology: Topology, rank: int, job: str) -> RankCoordinates:
        """Coordinates of ``rank`` in ``topology``."""
        if not isinstance(job, str) or not job:
            raise CoordinatesError(f"job name must be a non-empty string, got {job!r}")
        check_key(job, "job name")
        c = topology.coords_of(rank)
        return cls(job=job, rank=c["rank"], pp=c["pp"], dp=c["dp"], tp=c["tp"],
                   ep_group=c["ep_group"], node=c["node"])


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
) -> tuple[RankCoordinates, Topology]:
    """This process's coordinates and the job's topology (see the module docstring).

    ``gpus_per_node`` defaults to ``LOCAL_WORLD_SIZE`` (torchrun), else the
    topology's own, else the whole world on one node. ``parallel_state`` may
    be passed explicitly (default: Megatron-LM's when present).
    """
    env = os.environ if env is None else env
    name = job_name(job, env)
    world, rank = world_and_rank(env)
    if world < 1 or not 0 <= rank < world:
        raise CoordinatesError(f"rank {rank} is outside a world of {world} ranks")
    if gpus_per_node is None and env.get("LOCAL_WORLD_SIZE"):
        gpus_per_node = int(env["LOCAL_WORLD_SIZE"])
    ps = parallel_state if parallel_state is not None else (None if topology else megatron_parallel_state())
    if topology is None and ps is not None:
        topology = topology_from_megatron(ps, world, gpus_per_node or min(world, 8))
        coords = RankCoordinates.from_topology(topology, rank, name)
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
    return RankCoordinates.from_topology(topology, rank, name), topology
