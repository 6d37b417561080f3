"""The topology a job's ``stage_latency`` tags describe: inferred back from the rows.

The analyzer knows a job only by what its ranks report. :func:`infer_topology` finds the
sizes, rank order, ranks per node and (from the hosts the ranks name) the placement that
produced a window's per-rank tags.

    >>> from rankscope.topology import Topology
    >>> t = Topology(tp=2, pp=2, dp=4, ep=2, gpus_per_node=4)
    >>> r = t.ranks
    >>> infer_topology(r, t.tp_index, t.pp_index, t.dp_index, t.group_ids("ep"), t.node_index) == t
    True
"""

from __future__ import annotations

import numpy as np

from rankscope.topology import Topology, TopologyError


def infer_topology(ranks, tp, pp, dp, ep_group, node, host=None) -> Topology:
    """The topology that produced these per-rank tags (from ``stage_latency``).

    Sizes are the largest index + 1, ``ep`` follows from the number of EP groups
    per DP group, ``gpus_per_node`` from the ranks per node, and the rank order
    is the one that maps every coordinate back to its rank. Raises when no
    topology fits (inconsistent tags).

    ``host``: the host name each rank reported, when the collectors report one. The
    node grouping then follows the hosts (node ids in order of each host's lowest
    rank), whatever the ``node`` tags say: the real placement is not always
    ``rank // gpus_per_node``. Hosts that do not hold equally many ranks (a partial
    iteration) leave the placement to the ``node`` tags.
    """
    ranks, tp, pp, dp, ep_group, node = (np.asarray(a, dtype=np.int64) for a in (ranks, tp, pp, dp, ep_group, node))
    if ranks.size == 0:
        raise TopologyError("no ranks to infer a topology from")
    ranks, first = np.unique(ranks, return_index=True)   # one row per rank
    tp, pp, dp, ep_group, node = tp[first], pp[first], dp[first], ep_group[first], node[first]
    sizes = {"tp": int(tp.max()) + 1, "pp": int(pp.max()) + 1, "dp": int(dp.max()) + 1}
    world = sizes["tp"] * sizes["pp"] * sizes["dp"]
    if ranks.max() >= world:
        raise TopologyError(f"rank {int(ranks.max())} does not fit tp*pp*dp = {world} from the tags")
    placement, hosts = None, None
    if host is not None:
        names = np.asarray(host, dtype=object)[first]
        placement, hosts = _placement_from_hosts(ranks, names, world)
    # ranks per node: the most common count of distinct ranks on a node, padded to the world
    if placement is not None:
        gpus = world // len(hosts)
    else:
        per_node = np.bincount(node, minlength=int(node.max()) + 1)
        gpus = int(np.max(per_node))
    if world % gpus:
        raise TopologyError(f"node tags give {gpus} ranks per node, which does not divide world {world}")
    # EP groups per DP group: distinct ep_group ids among ranks of one DP group
    dp_group = pp * sizes["tp"] + tp
    pairs = np.unique(np.stack([dp_group, ep_group]), axis=1)
    groups_per_dp = int(np.bincount(pairs[0]).max())
    ep = sizes["dp"] // max(groups_per_dp, 1)
    for order in ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"):
        try:
            t = Topology(tp=sizes["tp"], pp=sizes["pp"], dp=sizes["dp"], ep=ep, gpus_per_node=gpus, order=order)
        except TopologyError:
            continue
        if (np.array_equal(t.rank_of(tp=tp, pp=pp, dp=dp), ranks)
                and np.array_equal(t.group_ids("ep")[ranks], ep_group)
                and (placement is not None or np.array_equal(t.node_index[ranks], node))):
            if placement is None or np.array_equal(placement, t.node_index):
                placement = None   # the default block placement: nothing to keep
            return t.with_placement(placement, hosts) if (placement is not None or hosts) else t
    raise TopologyError(
        f"no rank order maps the tags to their ranks (sizes tp={sizes['tp']} pp={sizes['pp']} "
        f"dp={sizes['dp']} ep={ep} gpus_per_node={gpus})")


def _placement_from_hosts(ranks: np.ndarray, names: np.ndarray, world: int
                          ) -> tuple[np.ndarray | None, tuple[str, ...] | None]:
    """Node id of every rank and the host of every node, from the hosts the ranks reported;
    ``(None, None)`` when they do not describe a whole, even placement."""
    known = np.array([isinstance(h, str) and h != "" for h in names])
    if len(ranks) != world or not known.all():
        return None, None
    uniq, inverse = np.unique(names.astype(str), return_inverse=True)
    counts = np.bincount(inverse)
    if (counts != counts[0]).any() or world % len(uniq):
        return None, None
    # node ids in order of each host's lowest rank (the usual block placement keeps its numbers)
    lowest = np.full(len(uniq), np.iinfo(np.int64).max)
    np.minimum.at(lowest, inverse, ranks)
    order = np.argsort(lowest, kind="stable")
    node_of_host = np.empty(len(uniq), dtype=np.int64)
    node_of_host[order] = np.arange(len(uniq))
    placement = np.empty(world, dtype=np.int64)
    placement[ranks] = node_of_host[inverse]
    return placement, tuple(uniq[order].tolist())
