"""Out-of-band events against the evidence: supported, contradicted or unrelated.

Monitors outside the training job report events ("server port down", "GPU Xid
79", "NFS timeout"). Operators tend to take the loudest one as the root cause;
IL-0477's port-down event sent them to repair a network that was fine. Each
event is sorted into a category by its name, then judged against the incident:

- on a node that is not a culprit, or outside the incident's time: ``unrelated``;
- a network event on a culprit node: ``supported`` by a link degradation
  (transfer floors rose), ``contradicted`` by a compute/host straggler whose
  anomaly is in compute-only stages while its own collectives are short;
- a compute (GPU) event: supported by a compute straggler or a stall,
  contradicted by a pure link fault; a host event likewise for host stalls;
- a name no category knows: ``unrelated`` (not used as evidence), said so.

Example::

    >>> category("server port down"), category("GPU Xid 79 fallen off the bus"), category("cron")
    ('network', 'compute', None)
    >>> verdict("network", "compute_straggler", on_culprit=True)[0]
    'contradicted'
"""

from __future__ import annotations

import re

CATEGORIES: dict[str, tuple[str, ...]] = {
    "network": ("port", "link", "nic", "network", "infiniband", "ib ", "rdma", "roce", "switch",
                "packet", "cable", "transceiver", "flap", "mellanox", "hca", "ethernet", "bgp", "lldp"),
    "compute": ("gpu", "xid", "ecc", "thermal", "throttl", "clock", "power", "hbm", "sm ", "nvlink",
                "dcgm", "temperature", "fan", "pcie"),
    "host": ("cpu", "disk", "nfs", "storage", "filesystem", "i/o", "io ", "dataloader", "memory",
             "oom", "swap", "lustre", "kernel"),
}

#: Which event category each incident class explains.
EXPLAINS: dict[str, set[str]] = {
    "compute_straggler": {"compute"},
    "transient_stall": {"compute", "host"},
    "host_stall": {"host"},
    "link_degradation": {"network"},
    "pipeline_imbalance": set(),
    "silent_rank": {"network", "compute", "host"},
}


def category(name: str) -> str | None:
    """The category of an event name (by keywords), or None."""
    text = f" {name.lower()} "
    for cat, words in CATEGORIES.items():
        if any(re.search(re.escape(w), text) for w in words):
            return cat
    return None


def verdict(cat: str | None, incident_class: str, on_culprit: bool) -> tuple[str, str]:
    """``(verdict, reason)`` of one event for one incident."""
    if not on_culprit:
        return "unrelated", "not on a culprit node or outside the incident's time"
    if cat is None:
        return "unrelated", "event type not recognised; not used as evidence"
    if cat in EXPLAINS.get(incident_class, set()):
        return "supported", f"a {cat} event fits a {incident_class.replace('_', ' ')}"
    if cat == "network" and incident_class in ("compute_straggler", "host_stall", "transient_stall"):
        return "contradicted", ("the anomaly is only in compute-only stages and this node's collectives "
                                "are short (it arrived last), not slow: its network is not the cause")
    if cat in ("compute", "host") and incident_class == "link_degradation":
        return "contradicted", "compute stages are normal; only the transfer floors of its groups rose"
    return "contradicted", f"a {cat} event does not explain a {incident_class.replace('_', ' ')}"
