"""A node swapped out of a running job: from iteration ``at`` its ranks run on another machine.

``[[swap]]`` in a scenario: ``node`` (the node id), ``at`` (the first iteration on the new
machine), ``host`` (its host name, default ``gpu-spare-<node>``). From ``at`` on, the ranks of
that node report the new host, and the faults of those ranks end (the slow GPUs stayed behind
in the old machine), and the job restarts (its points' ``attempt`` counts the swaps, as torchrun's
restart count does; the iterations go on from ``at``): what a scheduler's node replacement, or an
operator's swap after a drain, looks like in the data. The layout is unchanged: the same ranks,
the same groups.

Example::

    >>> from rankscope.topology import Topology
    >>> topo = Topology(tp=1, pp=1, dp=8, ep=1, gpus_per_node=4, host_pattern="gpu-{node:02d}")
    >>> swap = NodeSwap(node=1, at=5, host="spare-1")
    >>> placed_hosts(topo, [swap], 4)[1], placed_hosts(topo, [swap], 5)[1]
    ('gpu-01', 'spare-1')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankscope.topology import Topology

#: The host name of a replacement machine unless the swap names one.
SPARE_PATTERN = "gpu-spare-{node:05d}"


@dataclass(frozen=True)
class NodeSwap:
    node: int
    at: int
    host: str

    def to_dict(self) -> dict:
        return {"node": int(self.node), "at": int(self.at), "host": self.host}


def placed_hosts(topo: Topology, swaps: list[NodeSwap], iteration: int) -> tuple[str, ...] | None:
    """The host name of every node at ``iteration`` (None: the topology names no hosts)."""
    if topo.hosts is None:
        return None
    hosts = list(topo.hosts)
    for s in swaps:
        if iteration >= s.at:
            hosts[s.node] = s.host
    return tuple(hosts)


def placement_at(topo: Topology, swaps: list[NodeSwap], iteration: int) -> Topology:
    """``topo`` with the swaps done by ``iteration`` (the same object when none is)."""
    if not any(iteration >= s.at for s in swaps):
        return topo
    return topo.with_placement(topo.node_index if topo.placement is not None else None,
                               placed_hosts(topo, swaps, iteration))


def swapped_ranks(topo: Topology, swaps: list[NodeSwap], iteration: int) -> np.ndarray:
    """The ranks on new machines by ``iteration`` (their faults have ended)."""
    done = [s.node for s in swaps if iteration >= s.at]
    return topo.node_ranks(done) if done else np.empty(0, dtype=np.int64)
