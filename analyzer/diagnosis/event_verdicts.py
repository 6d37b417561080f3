"""Out-of-band events against the evidence: supported, contradicted or unrelated.

Monitors outside the training job report events ("server port down", "GPU Xid
79", "NFS timeout"). Operators tend to take the loudest one as the root cause;
IL-0477's port-down event sent them to repair a network that was fine. Each
event is sorted into a category by its name, then judged against the incident:

- on a host (or node, or rank) that is not a culprit, or outside the incident's time:
  ``unrelated``;
- a network event on a culprit node: ``supported`` by a link degradation
  (transfer floors rose), ``contradicted`` by a compute/host straggler whose
  anomaly is in compute-only stages while its own collectives are short;
- a compute (GPU) event: supported by a compute straggler or a stall,
  contradicted by a pure link fault; a host event likewise for host stalls;
- a name no category knows: ``unrelated`` (not used as evidence), said so.

Example::

    >>> category("server port down"), category("GPU Xid 79 fallen off the bus"), category("cron")
    ('network', 'compute', None)
    >>> category("NVLink error count high"), category("thermal violation reported"), category("NodeNetworkDown")
    ('compute', 'compute', 'network')
    >>> category("HostProbeFailed", text="switch port facing the server down")
    'network'
    >>> verdict("network", IncidentClass.COMPUTE_STRAGGLER, on_culprit=True)[0].value
    'contradicted'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rankscope.hostnames import same_host
from rankscope.incident import IncidentClass, Verdict

#: Keywords of each category, matched at the start of a word (``throttl`` finds "throttled";
#: ``port`` finds "ports" but not "reported"); a word ending in ``$`` must match whole. The
#: categories are tried in this order: a GPU's own interconnect and bus (NVLink, PCIe link)
#: is the GPU, not the network, and an event naming both is about the device.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "compute": ("gpu", "xid", "ecc", "thermal", "throttl", "clock", "power", "hbm", "sm$", "nvlink",
                "dcgm", "temperat", "fan$", "fans$", "pcie", "nvswitch", "sxid", "retired pages",
                "row remap"),
    "host": ("cpu", "disk", "nfs", "storage", "filesystem", "i/o", "io$", "dataloader", "memory",
             "oom", "swap", "lustre", "kernel", "gpfs"),
    "network": ("port", "link", "nic$", "nics$", "network", "infiniband", "ib$", "rdma", "roce", "switch",
                "packet", "cable", "transceiver", "flap", "mellanox", "hca", "ethernet", "bgp", "lldp",
                "net$", "unreachable"),
}

#: Which event category each incident class explains.
EXPLAINS: dict[IncidentClass, set[str]] = {
    IncidentClass.COMPUTE_STRAGGLER: {"compute"},
    IncidentClass.TRANSIENT_STALL: {"compute", "host"},
    IncidentClass.HOST_STALL: {"host"},
    IncidentClass.LINK_DEGRADATION: {"network"},
    IncidentClass.PIPELINE_IMBALANCE: set(),
    IncidentClass.SILENT_RANK: {"network", "compute", "host"},
    IncidentClass.ARRIVAL_STRAGGLER: {"compute", "host"},
}
#: Classes whose anomaly sits in compute-only or host stages, with the culprits' own
#: collectives short (they arrive last): a network event on their node is not the cause.
_NOT_NETWORK = (IncidentClass.COMPUTE_STRAGGLER, IncidentClass.HOST_STALL, IncidentClass.TRANSIENT_STALL,
                IncidentClass.ARRIVAL_STRAGGLER)


@dataclass(frozen=True)
class OutOfBandEvent:
    """An event from a monitor outside the training job, as read from the ``event`` measurement.

    It names a machine by ``host`` (what monitoring speaks in), or by the job's ``node``
    number or ``rank`` (-1: not named); ``status`` is ``firing`` or ``resolved``; ``source``
    who reported it (``alertmanager/<receiver>``, ``grafana/<receiver>``, ``events/<sender>``,
    ``cli/<sender>``: the receiver's route or command first, so a forged one can be traced).
    """

    time_ms: int
    name: str
    node: int = -1
    host: str = ""
    rank: int = -1
    status: str = "firing"
    text: str = ""
    source: str = ""

    @property
    def key(self) -> tuple:
        """What makes two reads of one stored event the same event (a resolved notice of it
        replaces the firing one; the same alert from another source is another event)."""
        return (self.time_ms, self.name, self.node, self.host, self.rank, self.source)

    def names(self, ranks, nodes, hosts) -> bool:
        """Whether the event is about one of these ranks, node ids or host names (a host as
        :func:`~rankscope.hostnames.same_host` compares them: case and domain folded)."""
        return ((bool(self.host) and any(same_host(self.host, h) for h in hosts))
                or (self.node >= 0 and self.node in nodes) or (self.rank >= 0 and self.rank in ranks))

    @classmethod
    def from_row(cls, row: dict) -> OutOfBandEvent:
        """An event from one ``event`` point (missing tags and fields mean "not named")."""
        def integer(key: str) -> int:
            value = row.get(key)
            try:
                return int(value) if value is not None and value == value and value != "" else -1
            except (TypeError, ValueError):
                return -1

        def string(key: str) -> str:
            value = row.get(key)
            return value if isinstance(value, str) else ""

        return cls(time_ms=int(row["time"]), name=str(row.get("name") or "event"), node=integer("node"),
                   host=string("host"), rank=integer("rank"), status=string("status") or "firing",
                   text=string("text"), source=string("source"))


def _pattern(word: str) -> str:
    whole = word.endswith("$")
    word = word.rstrip("$")
    return r"\b" + re.escape(word) + (r"\b" if whole else "")


_PATTERNS = {cat: re.compile("|".join(_pattern(w) for w in words)) for cat, words in CATEGORIES.items()}


def _words(text: str) -> str:
    """Lower-case text with camelCase split (``NodeNetworkDown`` -> ``node network down``)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text).replace("_", " ").lower()


def category(name: str, text: str = "") -> str | None:
    """The category of an event by the words of its name (else of its text), or None."""
    for source in (name, text):
        words = _words(source or "")
        for cat, pattern in _PATTERNS.items():
            if pattern.search(words):
                return cat
    return None


def verdict(cat: str | None, incident_class: IncidentClass, on_culprit: bool,
            evidence: dict | None = None) -> tuple[Verdict, str]:
    """``(verdict, reason)`` of one event for one incident, from what its evidence shows
    (the kind of the slow stage, whether the culprits' own collectives were short)."""
    cls = IncidentClass(incident_class)
    ev = evidence or {}
    if not on_culprit:
        return Verdict.UNRELATED, "not on a culprit host or outside the incident's time"
    if cat is None:
        return Verdict.UNRELATED, "event type not recognised; not used as evidence"
    if cat in EXPLAINS[cls]:
        return Verdict.SUPPORTED, f"a {cat} event fits a {cls.label}"
    if cat == "network" and cls == IncidentClass.ARRIVAL_STRAGGLER:
        return Verdict.CONTRADICTED, ("this host's own collectives are the shortest of its groups (it arrives "
                                      "last and its group-mates wait for it), not slow: its network is not the cause")
    if cat == "network" and cls in _NOT_NETWORK:
        kind = ev.get("stage_kind") or ("host" if cls == IncidentClass.HOST_STALL else "compute")
        where = ("compute-only" if kind == "compute" else "host-side (data loading)")
        reason = (f"the slow stage ({ev.get('stage') or '?'}) is {where}, which no network fault slows")
        if ev.get("arrived_last"):
            reason += ("; and this host's own collectives are short (it arrived last), not slow: "
                       "its network is not the cause")
        return Verdict.CONTRADICTED, reason
    if cat in ("compute", "host") and cls == IncidentClass.LINK_DEGRADATION:
        return Verdict.CONTRADICTED, "compute stages are normal; only the transfer floors of its groups rose"
    return Verdict.CONTRADICTED, f"a {cat} event does not explain a {cls.label}"
