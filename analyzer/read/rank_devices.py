"""Which GPU each rank runs on, as its points say: the ``gpu`` tag (the device index the collector
knows) and the ``gpu_uuid`` field, kept from every chunk the reader reads, so an incident can name
its culprit GPUs (host, index, UUID) without another read of ``stage_latency``.

Example::

    >>> import pandas as pd
    >>> from rankscope.topology import Topology
    >>> d = RankDevices()
    >>> d.update(pd.DataFrame({"rank": [0, 1], "gpu": [0, 1], "gpu_uuid": ["GPU-a", None]}))
    >>> d.gpus_of([1], Topology(dp=2, gpus_per_node=2, host_pattern="n{node}"))
    [{'rank': 1, 'host': 'n0', 'gpu': 1, 'uuid': None}]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.topology import Topology


class RankDevices:
    """Each rank's last known device index (-1: unknown) and UUID ("": unknown)."""

    def __init__(self) -> None:
        self.gpu = np.full(0, -1, dtype=np.int64)
        self.uuid = np.full(0, "", dtype=object)

    def _grow(self, world: int) -> None:
        if world > len(self.gpu):
            self.gpu = np.concatenate([self.gpu, np.full(world - len(self.gpu), -1, dtype=np.int64)])
            self.uuid = np.concatenate([self.uuid, np.full(world - len(self.uuid), "", dtype=object)])

    def update(self, frame: pd.DataFrame) -> None:
        """Take the device tags of a chunk of ``stage_latency`` rows (the last row of a rank wins)."""
        if not len(frame) or "rank" not in frame.columns or not {"gpu", schema.GPU_UUID_FIELD} & set(frame.columns):
            return
        last = frame.drop_duplicates("rank", keep="last")
        ranks = pd.to_numeric(last["rank"], errors="coerce").to_numpy()
        ok = np.isfinite(ranks) & (ranks >= 0) & (ranks < 10_000_000)
        ranks = ranks[ok].astype(np.int64)
        if not len(ranks):
            return
        self._grow(int(ranks.max()) + 1)
        if "gpu" in last.columns:
            gpu = pd.to_numeric(last["gpu"], errors="coerce").to_numpy()[ok]
            known = np.isfinite(gpu) & (gpu >= 0)
            self.gpu[ranks[known]] = gpu[known].astype(np.int64)
        if schema.GPU_UUID_FIELD in last.columns:
            col = last[schema.GPU_UUID_FIELD]
            known = (col.notna() & (col.astype(str) != "")).to_numpy()[ok]
            self.uuid[ranks[known]] = col.astype(str).to_numpy(dtype=object)[ok][known]

    def gpus_of(self, ranks, topo: Topology) -> list[dict]:
        """``{"rank", "host", "gpu", "uuid"}`` of each rank (None where not known; the host the
        topology places it on, ``node N`` where no host name is known)."""
        r = np.asarray(ranks, dtype=np.int64).reshape(-1)
        r = r[(r >= 0) & (r < topo.world)]
        self._grow(topo.world)
        hosts = topo.host_names(topo.node_index[r])
        return [{"rank": int(k), "host": h, "gpu": int(self.gpu[k]) if self.gpu[k] >= 0 else None,
                 "uuid": self.uuid[k] or None} for k, h in zip(r.tolist(), hosts, strict=True)]


#: An incident naming more ranks lists no GPUs (a pipeline stage is no machine to check).
MAX_GPUS = 64


def name_gpus(incidents, topo: Topology, devices: RankDevices | None) -> None:
    """Set each incident's ``gpus`` from its culprit ranks (where it has at most :data:`MAX_GPUS`)."""
    devices = devices or RankDevices()
    for inc in incidents:
        if 0 < len(inc.ranks) <= MAX_GPUS:
            inc.gpus = devices.gpus_of(inc.ranks, topo)
