"""The store's own ``gpu_health`` points (the collector's NVML sampler, the simulator): the job's
GPUs on the hosts asked about, one query, thinned to at most ``max_points`` windows a series
(:meth:`rankscope.store.base.Store.read_sampled`). A store that fails is :class:`SourceUnavailable`.
"""

from __future__ import annotations

import math

import pandas as pd

from analyzer.read.gpu_samples import SourceUnavailable, clean, empty
from rankscope import gpu_health as gh
from rankscope import schema
from rankscope.store import Store
from rankscope.store.base import StoreError

#: ``gpu_health`` fields read, each its own signal.
FIELDS = (gh.REASONS, gh.SM_CLOCK, gh.TEMPERATURE, gh.POWER, gh.XID, gh.ECC_DBE, gh.REMAPPED_ROWS,
          gh.ROW_REMAP_FAILURE, gh.PCIE_REPLAYS)


class GpuHealthStore:
    """``gpu_health`` of a job's hosts from the analyzer's own store."""

    name = "gpu_health"

    def __init__(self, store: Store, max_points: int = 240):
        self.store, self.max_points = store, int(max_points)
        self.note = ""

    def __repr__(self) -> str:
        return f"GpuHealthStore({self.store!r})"

    def samples(self, job: str, hosts: list[str], start_ms: int, end_ms: int, *, onset_ms: int | None = None,
                baseline_hosts: frozenset[str] | None = None,
                signals: frozenset[str] | None = None) -> pd.DataFrame:
        """Every sample of ``hosts`` in ``start_ms`` .. ``end_ms`` (one query at one step: ``onset_ms``,
        ``baseline_hosts`` and ``signals`` are not used; see :class:`~analyzer.read.gpu_samples.TelemetrySource`)."""
        self.note = f"gpu_health of job {job}"   # the incident's hosts are its own record's (not the query's)
        if not hosts or end_ms <= start_ms:
            return empty()
        every = max(1000, math.ceil((end_ms - start_ms) / self.max_points))
        try:
            wide = self.store.read_sampled(schema.GPU_HEALTH, job, int(start_ms), int(end_ms), every,
                                           where={"host": list(hosts)})
        except (StoreError, OSError) as exc:
            raise SourceUnavailable(f"store {self.store!r}: gpu_health read failed: {exc}") from None
        fields = [f for f in FIELDS if f in wide.columns]
        if not len(wide) or not fields or "host" not in wide.columns:
            return empty()
        wide = wide.assign(gpu=wide["gpu"] if "gpu" in wide.columns else -1,
                           uuid=wide[gh.UUID_FIELD] if gh.UUID_FIELD in wide.columns else "")
        long = wide.melt(id_vars=["time", "host", "gpu", "uuid"], value_vars=fields, var_name="signal",
                         value_name="value")
        return clean(long)
