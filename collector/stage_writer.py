"""Writes a simulator's iterations and events to a store, as fast as the store takes them.

On InfluxDB the tag part of every rank's line (``stage_latency,job=..,rank=..``)
never changes, so it is encoded once (:func:`rankscope.lineprotocol.encode_prefixes`)
and each iteration only encodes its fields and timestamp
(:func:`~rankscope.lineprotocol.encode_lines`) before posting the lines. Other
stores get the iteration as a frame through ``write_stage_latency``. Values are
rounded to 1 us on both paths, so both stores hold the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from collector.scenario import EventSpec
from rankscope import schema
from rankscope.lineprotocol import encode_lines, encode_prefixes
from rankscope.store import InfluxStore, Store

if TYPE_CHECKING:  # the simulator uses this writer; the writer only needs its types
    from collector.simulator import ClusterSimulator, IterationResult


class StageLatencyWriter:
    """Writes one simulator's iterations to one store."""

    def __init__(self, store: Store, sim: ClusterSimulator):
        self.store = store
        self.sim = sim
        self.fast = isinstance(store, InfluxStore)
        self._columns = [(k, name) for k, name in enumerate(sim.stages.names)
                         if name not in sim.absent_stages]
        if self.fast:
            topo = sim.topology
            tags = pd.DataFrame({
                "job": sim.scenario.job, "rank": topo.ranks, "pp": topo.pp_index, "dp": topo.dp_index,
                "tp": topo.tp_index, "ep_group": topo.group_ids("ep"), "node": topo.node_index,
            })
            self.prefixes = encode_prefixes(schema.STAGE_LATENCY, tags)

    def lines(self, res: IterationResult, time_ms: int) -> list[str]:
        """Line protocol of the reporting ranks of one iteration (InfluxDB path)."""
        rep = res.reporting
        everyone = bool(rep.all())
        values = res.values if everyone else res.values[rep]
        it_ms = res.iteration_ms if everyone else res.iteration_ms[rep]
        if not (np.isfinite(it_ms).all() and (it_ms >= 0).all()):
            raise ValueError(f"iteration {res.iteration}: the model produced an invalid iteration time")
        n = len(it_ms)
        fields: dict[str, np.ndarray] = {
            schema.ITERATION_FIELD: np.full(n, res.iteration, dtype=np.int64),
            schema.ITERATION_MS_FIELD: np.round(it_ms, 3),
        }
        for k, name in self._columns:
            col = np.round(values[:, k], 3)
            fields[name] = col
        prefixes = self.prefixes if everyone else self.prefixes[rep]
        return encode_lines(prefixes, fields, int(time_ms))

    def encode(self, res: IterationResult, time_ms: int) -> list[str] | pd.DataFrame | None:
        """What :meth:`post` sends for one iteration: lines (InfluxDB), a frame, or None (nobody reports)."""
        if not res.reporting.any():
            return None
        return self.lines(res, time_ms) if self.fast else self.sim.frame(res, time_ms)

    def post(self, payload: list[str] | pd.DataFrame | None) -> int:
        """Send an encoded iteration; returns the number of points written."""
        if payload is None:
            return 0
        if isinstance(payload, list):
            self.store.write_lines(payload)  # type: ignore[attr-defined]
            return len(payload)
        return self.store.write_stage_latency(payload).written

    def write(self, res: IterationResult, time_ms: int) -> int:
        """Encode and write one iteration; returns the number of points written."""
        return self.post(self.encode(res, time_ms))

    def write_events(self, events: Sequence[EventSpec], time_ms: int) -> int:
        """Write out-of-band events to the ``event`` measurement at ``time_ms``."""
        if not events:
            return 0
        frame = pd.DataFrame({
            "time": np.full(len(events), int(time_ms), dtype=np.int64),
            "job": self.sim.scenario.job,
            "name": [e.name for e in events],
            "node": [str(-1 if e.node is None else e.node) for e in events],
            "severity": [e.severity for e in events],
            "source": [e.source for e in events],
            "rank": np.array([-1 if e.rank is None else e.rank for e in events], dtype=np.int64),
            "text": [e.text or e.name for e in events],
            "value": np.ones(len(events), dtype=np.int64),
        })
        return self.store.write_measurement(schema.EVENT, frame).written
