"""Make rows: a summarised trace's iterations as ``stage_latency`` rows.

Every row is built by :func:`rankscope.stage_rows.stage_rows`, with the ``host`` and
``gpu`` the trace records (a rank without them carries no such tag).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rankscope.stage_rows import stage_rows
from rankscope.topology import Topology


@dataclass
class TraceSummary:
    """Per-iteration stage times (ms) of one rank's trace, and where the rank ran."""

    path: str
    rank: int
    world: int | None
    base_ms: float
    host: str | None = None
    gpu: int | None = None
    iterations: list[int] = field(default_factory=list)
    end_ms: list[float] = field(default_factory=list)
    iteration_ms: list[float] = field(default_factory=list)
    stage_ms: list[dict[str, float]] = field(default_factory=list)
    #: Events refused for a field that failed its check, and the first (file, event, field).
    refused: int = 0
    first_refused: str = ""
    #: Kernel windows (``import-trace --kernels``): (last step, end epoch ms, [(name, us)]).
    kernels: list = field(default_factory=list)

    @property
    def stages(self) -> list[str]:
        """Every stage this trace has a time for, in first-seen order."""
        return list(dict.fromkeys(s for st in self.stage_ms for s in st))

    def times(self) -> list[int]:
        """The rows' times: each iteration's end (epoch ms), strictly increasing."""
        out: list[int] = []
        last = 0
        for end in self.end_ms:
            last = max(int(round(end)), last + 1)
            out.append(last)
        return out

    def frame(self, topology: Topology, job: str, iteration_offset: int = 0) -> pd.DataFrame:
        """The ``stage_latency`` rows of this rank (one per ``ProfilerStep``), with its
        ``host`` and ``gpu`` tags where known."""
        return trace_rows([self], topology, job, iteration_offset)


def trace_rows(summaries: Sequence[TraceSummary], topology: Topology, job: str,
               iteration_offset: int = 0) -> pd.DataFrame:
    """The ``stage_latency`` rows of every summary, ranks placed by ``topology``."""
    count = [len(s.iterations) for s in summaries]
    names = list(dict.fromkeys(n for s in summaries for n in s.stages))
    stage_ms = [st for s in summaries for st in s.stage_ms]
    return stage_rows(
        job, np.repeat([s.rank for s in summaries], count).astype(np.int64),
        np.array([it for s in summaries for it in s.iterations], dtype=np.int64) + iteration_offset,
        np.array([t for s in summaries for t in s.times()], dtype=np.int64),
        {n: np.array([st.get(n, np.nan) for st in stage_ms], dtype=float) for n in names},
        topo=topology, iteration_ms=np.array([v for s in summaries for v in s.iteration_ms], dtype=float),
        host=np.repeat(np.array([s.host or "" for s in summaries], dtype=object), count),
        gpu=np.repeat(np.array([s.gpu for s in summaries], dtype=object), count))
