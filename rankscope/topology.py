"""Rank topology of a hybrid-parallel (TP/PP/DP/EP) training job.

Maps global ranks to parallel coordinates and every rank to the id of each
parallel group it belongs to, vectorised over the whole world (no Python loop
over ranks), so a 100,000-rank job is built in milliseconds.

Rank order follows Megatron-LM: the default ``"tp-dp-pp"`` makes TP the fastest
varying dimension and PP the slowest, i.e. ``rank = (pp * dp_size + dp) * tp_size + tp``.
Expert-parallel groups are carved out of the data-parallel dimension: EP group
``k`` of a DP group holds its consecutive dp indices ``k*ep .. k*ep+ep-1``. The
expert-data-parallel group of a rank holds the ranks that keep the same experts: the
same position in every EP group of its DP group (``dp % ep`` equal), across which
expert gradients are reduced.

Example (the IL-0477 job)::

    >>> t = Topology(tp=1, pp=9, dp=1440, ep=32, gpus_per_node=8)
    >>> t.world
    12960
    >>> t.coords_of(10352)
    {'rank': 10352, 'tp': 0, 'pp': 7, 'dp': 272, 'node': 1294, 'ep_group': 323}
    >>> t.group_ranks("ep", 10352)[[0, -1]].tolist()
    [10336, 10367]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np

GroupKind = Literal["tp", "dp", "ep", "edp", "pipeline", "node"]
GROUP_KINDS: tuple[GroupKind, ...] = ("tp", "dp", "ep", "edp", "pipeline", "node")
_DIMS = ("tp", "dp", "pp")


class TopologyError(ValueError):
    """Sizes or ranks that do not describe a consistent job."""


@dataclass(frozen=True)
class Topology:
    """Sizes of the parallel dimensions and the rank order.

    Parameters
    ----------
    tp, pp, dp:
        Tensor-, pipeline- and data-parallel sizes; ``world = tp * pp * dp``.
    ep:
        Expert-parallel size; must divide ``dp`` (EP groups are chunks of a DP group).
    gpus_per_node:
        Ranks per node; ``world`` must be a multiple of it. Node ``n`` holds ranks
        ``n*gpus_per_node .. (n+1)*gpus_per_node - 1``.
    order:
        The dimensions from fastest to slowest varying, joined by ``-``; any
        permutation of ``tp``, ``dp`` and ``pp``. Default Megatron-LM's ``tp-dp-pp``.
    hosts:
        The host name of every node id (what an operator drains), or None when unknown.
    host_pattern:
        Host names made from the node id instead, e.g. ``"gpu-node-{node:05d}"``.
    placement:
        The node id of every rank when the job's real placement (SLURM, torchrun, a node
        replaced after an elastic restart) is not ``rank // gpus_per_node``; every node
        must hold ``gpus_per_node`` ranks. None: the default block placement.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    gpus_per_node: int = 8
    order: str = "tp-dp-pp"
    hosts: tuple[str, ...] | None = field(default=None, compare=False, repr=False)
    host_pattern: str | None = field(default=None, compare=False)
    placement: np.ndarray | None = field(default=None, compare=False, repr=False)
    _strides: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise TopologyError(f"{name} must be a positive integer, got {value!r}")
        if self.dp % self.ep:
            raise TopologyError(f"ep={self.ep} does not divide dp={self.dp}")
        if self.world % self.gpus_per_node:
            raise TopologyError(
                f"world size {self.world} (tp*pp*dp) is not divisible by gpus_per_node={self.gpus_per_node}"
            )
        dims = self.order.split("-")
        if sorted(dims) != sorted(_DIMS):
            raise TopologyError(
                f"order {self.order!r} must be a permutation of tp, dp, pp joined by '-' (e.g. 'tp-dp-pp')"
            )
        strides: dict[str, int] = {}
        stride = 1
        for dim in dims:
            strides[dim] = stride
            stride *= getattr(self, dim)
        object.__setattr__(self, "_strides", strides)
        if self.placement is not None:
            place = np.asarray(self.placement, dtype=np.int64).reshape(-1)
            if len(place) != self.world:
                raise TopologyError(f"placement names a node for {len(place)} ranks; the world has {self.world}")
            if place.min() < 0 or place.max() >= self.nodes:
                raise TopologyError(f"placement uses node ids outside 0..{self.nodes - 1}")
            counts = np.bincount(place, minlength=self.nodes)
            if (counts != self.gpus_per_node).any():
                bad = int(np.flatnonzero(counts != self.gpus_per_node)[0])
                raise TopologyError(f"placement puts {int(counts[bad])} ranks on node {bad}; every node "
                                    f"holds gpus_per_node={self.gpus_per_node}")
            place.setflags(write=False)
            object.__setattr__(self, "placement", place)
        if self.host_pattern is not None and self.hosts is None:
            try:
                names = tuple(self.host_pattern.format(node=n) for n in range(self.nodes))
            except (KeyError, IndexError, ValueError) as exc:
                raise TopologyError(f"host_pattern {self.host_pattern!r} is not a pattern of {{node}} "
                                    f"(e.g. 'gpu-node-{{node:05d}}'): {exc}") from None
            object.__setattr__(self, "hosts", names)
        if self.hosts is not None:
            hosts = tuple(str(h) for h in self.hosts)
            if len(hosts) != self.nodes:
                raise TopologyError(f"{len(hosts)} host names for {self.nodes} nodes")
            if len(set(hosts)) != len(hosts):
                raise TopologyError("host names must be unique (one per node); a host_pattern must "
                                    "use {node}")
            object.__setattr__(self, "hosts", hosts)

    # ------------------------------------------------------------------ sizes
    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def nodes(self) -> int:
        return self.world // self.gpus_per_node

    @property
    def ep_groups_per_dp(self) -> int:
        return self.dp // self.ep

    def group_size(self, kind: GroupKind) -> int:
        return {"tp": self.tp, "dp": self.dp, "ep": self.ep, "edp": self.dp // self.ep, "pipeline": self.pp,
                "node": self.gpus_per_node}[_check_kind(kind)]

    def group_count(self, kind: GroupKind) -> int:
        return self.world // self.group_size(kind)

    # ---------------------------------------------------------- coordinates
    @cached_property
    def ranks(self) -> np.ndarray:
        return np.arange(self.world, dtype=np.int64)

    def _coord(self, dim: str, ranks: np.ndarray) -> np.ndarray:
        return (ranks // self._strides[dim]) % getattr(self, dim)

    @cached_property
    def tp_index(self) -> np.ndarray:
        return self._coord("tp", self.ranks)

    @cached_property
    def pp_index(self) -> np.ndarray:
        return self._coord("pp", self.ranks)

    @cached_property
    def dp_index(self) -> np.ndarray:
        return self._coord("dp", self.ranks)

    @cached_property
    def node_index(self) -> np.ndarray:
        """Node id of every rank: the placement's, or ``rank // gpus_per_node``."""
        return self.placement if self.placement is not None else self.ranks // self.gpus_per_node

    @cached_property
    def local_index(self) -> np.ndarray:
        """Every rank's position on its node (0..gpus_per_node-1, by rank): its local GPU."""
        order = np.lexsort((self.ranks, self.node_index))
        local = np.empty(self.world, dtype=np.int64)
        local[order] = np.tile(np.arange(self.gpus_per_node), self.nodes)
        return local

    def host_names(self, nodes) -> list[str]:
        """Host names of node ids (``node N`` where the topology knows no host names)."""
        n = np.asarray(nodes, dtype=np.int64).reshape(-1)
        if self.hosts is None:
            return [f"node {int(x)}" for x in n]
        return [self.hosts[int(x)] for x in n]

    def hosts_of(self, ranks) -> list[str]:
        """Sorted host names of the nodes holding ``ranks`` (empty when host names are unknown)."""
        if self.hosts is None:
            return []
        return sorted(self.host_names(self.nodes_of(ranks)))

    def with_placement(self, placement: np.ndarray | None, hosts: tuple[str, ...] | None) -> Topology:
        """The same parallel layout with another rank placement and host names."""
        return Topology(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep, gpus_per_node=self.gpus_per_node,
                        order=self.order, hosts=hosts, placement=placement)

    def same_placement(self, other: Topology) -> bool:
        """Whether ``other`` puts every rank on the same node with the same host names."""
        return (self.hosts == other.hosts
                and np.array_equal(self.node_index, other.node_index))

    def rank_of(self, tp=0, pp=0, dp=0) -> np.ndarray | int:
        """Global rank(s) for coordinates; accepts scalars or arrays (broadcast)."""
        tp_a, pp_a, dp_a = (np.asarray(v, dtype=np.int64) for v in (tp, pp, dp))
        for name, arr, size in (("tp", tp_a, self.tp), ("pp", pp_a, self.pp), ("dp", dp_a, self.dp)):
            if arr.size and (arr.min() < 0 or arr.max() >= size):
                raise TopologyError(f"{name} index out of range 0..{size - 1}")
        out = tp_a * self._strides["tp"] + pp_a * self._strides["pp"] + dp_a * self._strides["dp"]
        return int(out) if out.ndim == 0 else out

    def check_ranks(self, ranks) -> np.ndarray:
        """Return ``ranks`` as an int array, raising when any lies outside the world."""
        arr = np.asarray(ranks, dtype=np.int64).reshape(-1)
        bad = arr[(arr < 0) | (arr >= self.world)]
        if bad.size:
            raise TopologyError(
                f"rank {int(bad[0])} is outside the world 0..{self.world - 1} "
                f"({bad.size} rank(s) out of range)"
            )
        return arr

    def coords_of(self, rank: int) -> dict[str, int]:
        """Coordinates and group ids of one rank (for messages and tests)."""
        r = int(self.check_ranks([rank])[0])
        return {
            "rank": r,
            "tp": int(self.tp_index[r]),
            "pp": int(self.pp_index[r]),
            "dp": int(self.dp_index[r]),
            "node": int(self.node_index[r]),
            "ep_group": int(self.group_ids("ep")[r]),
        }

    # --------------------------------------------------------------- groups
    def group_ids(self, kind: GroupKind) -> np.ndarray:
        """Group id of every rank for one group kind (array of length ``world``).

        - ``tp``: same pp and dp;          id = pp * dp + dp_index
        - ``dp``: same pp and tp;          id = pp * tp + tp_index
        - ``ep``: a chunk of ``ep`` consecutive dp indices inside one DP group;
          id = dp_group * (dp / ep) + dp_index // ep
        - ``edp``: the same position in every EP group of a DP group (same experts);
          id = dp_group * ep + dp_index % ep
        - ``pipeline``: same dp and tp;    id = dp_index * tp + tp_index
        - ``node``: rank // gpus_per_node
        """
        return self._group_ids[_check_kind(kind)]

    @cached_property
    def _group_ids(self) -> dict[str, np.ndarray]:
        dp_group = self.pp_index * self.tp + self.tp_index
        return {
            "tp": self.pp_index * self.dp + self.dp_index,
            "dp": dp_group,
            "ep": dp_group * self.ep_groups_per_dp + self.dp_index // self.ep,
            "edp": dp_group * self.ep + self.dp_index % self.ep,
            "pipeline": self.dp_index * self.tp + self.tp_index,
            "node": self.node_index,
        }

    def members(self, kind: GroupKind) -> np.ndarray:
        """Matrix ``[n_groups, group_size]`` of the ranks of every group, rows by group id.

        All groups of a kind have the same size, so per-group statistics are plain
        reductions along axis 1 of ``values[members]``.
        """
        return self._members[_check_kind(kind)]

    @cached_property
    def _members(self) -> dict[str, np.ndarray]:
        out = {}
        for kind in GROUP_KINDS:
            ids = self._group_ids[kind]
            order = np.argsort(ids, kind="stable")
            out[kind] = order.reshape(self.group_count(kind), self.group_size(kind))
        return out

    def group_ranks(self, kind: GroupKind, rank: int) -> np.ndarray:
        """Sorted ranks of the ``kind`` group that ``rank`` belongs to."""
        r = int(self.check_ranks([rank])[0])
        return np.sort(self.members(kind)[self.group_ids(kind)[r]])

    def nodes_of(self, ranks) -> np.ndarray:
        """Sorted unique node ids hosting ``ranks``."""
        return np.unique(self.node_index[self.check_ranks(ranks)])

    def node_ranks(self, nodes) -> np.ndarray:
        """All ranks of the given node ids, sorted."""
        n = np.asarray(nodes, dtype=np.int64).reshape(-1)
        bad = n[(n < 0) | (n >= self.nodes)]
        if bad.size:
            raise TopologyError(f"node {int(bad[0])} is outside 0..{self.nodes - 1}")
        return np.sort(self.members("node")[n].reshape(-1))

    def to_dict(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep,
                                     "gpus_per_node": self.gpus_per_node, "order": self.order}
        if self.host_pattern is not None:
            out["host_pattern"] = self.host_pattern
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Topology:
        allowed = {"tp", "pp", "dp", "ep", "gpus_per_node", "order", "host_pattern"}
        unknown = set(data) - allowed
        if unknown:
            raise TopologyError(f"unknown topology key(s): {', '.join(sorted(unknown))}; "
                                f"allowed: {', '.join(sorted(allowed))}")
        return cls(**data)


def _check_kind(kind: str) -> str:
    if kind not in GROUP_KINDS:
        raise TopologyError(f"unknown group kind {kind!r}; one of {', '.join(GROUP_KINDS)}")
    return kind


def format_ranks(ranks) -> str:
    """Compact text for a rank set: ``[1, 2, 3, 7]`` -> ``"1-3,7"``."""
    arr = np.unique(np.asarray(ranks, dtype=np.int64))
    if arr.size == 0:
        return ""
    breaks = np.flatnonzero(np.diff(arr) != 1)
    starts = np.r_[arr[0], arr[breaks + 1]]
    ends = np.r_[arr[breaks], arr[-1]]
    return ",".join(str(s) if s == e else f"{s}-{e}" for s, e in zip(starts, ends, strict=True))


def rank_phrase(ranks, capital: bool = False) -> str:
    """A rank set as a sentence names it (one rank is not "ranks 1379"); ``capital`` to begin one.

        >>> rank_phrase([1379]), rank_phrase(range(10352, 10360), capital=True)
        ('rank 1379', 'Ranks 10352-10359')
    """
    text = format_ranks(ranks)
    noun = "rank" if text.isdigit() else "ranks"
    return f"{noun.capitalize() if capital else noun} {text}"


def parse_ranks(spec) -> np.ndarray:
    """Parse ``"10352-10359"``, ``"1,4,7-9"``, an int, or a list of ints/ranges into sorted ranks."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return np.array([int(spec)], dtype=np.int64)
    if isinstance(spec, (list, tuple)):
        parts = [parse_ranks(p) for p in spec]
        return np.unique(np.concatenate(parts)) if parts else np.array([], dtype=np.int64)
    if not isinstance(spec, str):
        raise ValueError(f"cannot read ranks from {spec!r}: expected '1-3,7', an int or a list")
    out: list[np.ndarray] = []
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(f"cannot read ranks from {spec!r}: {part!r} is not N or N-M") from None
        if b < a:
            raise ValueError(f"cannot read ranks from {spec!r}: range {part!r} runs backwards")
        out.append(np.arange(a, b + 1, dtype=np.int64))
    if not out:
        raise ValueError(f"cannot read ranks from {spec!r}: empty")
    return np.unique(np.concatenate(out))
