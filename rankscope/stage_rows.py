"""The one builder of ``stage_latency`` rows: arrays in, a frame with every tag out.

Every collector, importer and the simulator turns its per-rank, per-iteration stage
times into rows here, so the tags a point carries are decided in one place:

- ``pp, dp, tp, ep_group, node`` from the :class:`~rankscope.topology.Topology`
  (``topo``), or given as they are (``coords``, a collector that knows only its own);
- ``host``: the host each row's source reported (``host=``); without one, the
  topology's host name of the rank's node when the topology names hosts;
- ``gpu``: see :func:`stage_rows` (one rule: the device the source knows, never
  a guess).

Columns come in one order: ``time, job, rank, pp, dp, tp, ep_group, node, host,
gpu, iteration, iteration_ms``, the stages, then any extra fields (``gpu_uuid``).

    >>> from rankscope.topology import Topology
    >>> t = Topology(dp=4, gpus_per_node=2, host_pattern="n{node}")
    >>> df = stage_rows("demo", [0, 3], 7, 1_000, {"mlp": [1.5, 2.0]}, topo=t,
    ...                 iteration_ms=[10.0, 11.0], gpu=LOCAL_GPU)
    >>> print(df.drop(columns=["time", "job", "pp", "tp", "ep_group"]).to_string(index=False))
     rank  dp  node host  gpu  iteration  iteration_ms  mlp
        0   0     0   n0    0          7          10.0  1.5
        3   3     1   n1    1          7          11.0  2.0
    >>> "gpu" in stage_rows("demo", 3, 7, 1_000, {"mlp": 2.0}, topo=t, gpu=None).columns
    False
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.topology import Topology

#: ``gpu=LOCAL_GPU``: every rank is one GPU placed as the topology says, so its device is
#: its local index on its node (what torchrun's ``LOCAL_RANK`` numbers).
LOCAL_GPU: Final = "local"

#: The parallel-coordinate tags, in column order.
COORD_TAGS: Final = ("pp", "dp", "tp", "ep_group", "node")


def stage_rows(job: str, ranks: Any, iteration: Any, time_ms: Any, stages: Mapping[str, Any], *,
               topo: Topology | None = None, coords: Mapping[str, Any] | None = None,
               iteration_ms: Any = None, host: Any = None, gpu: Any = None,
               fields: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """``stage_latency`` rows, one per element of ``ranks`` (vectorised).

    ``ranks`` is a rank or an array of them; ``iteration``, ``time_ms`` (epoch ms),
    ``iteration_ms``, every ``stages[name]`` (ms) and every ``fields[name]`` are a scalar
    for all rows or an array with one value per row. ``topo`` gives the parallel tags;
    a collector without the job's topology gives them in ``coords`` instead
    (``{"pp": .., "dp": .., "tp": .., "ep_group": .., "node": ..}``). ``iteration_ms=None``
    writes no ``iteration_ms`` field.

    ``host``: a name, or one per row (``None``/``""``/NaN where unknown: those rows
    carry no host); ``None``: the topology's host of each rank's node when it names
    hosts, else no ``host`` tag.

    ``gpu``, the one rule: the row's tag is the device its source knows, never a guess.

    - a device index, or one per row: what the collector reported (the trace's
      ``device``, ``LOCAL_RANK``, an importer's layout). Rows where it is
      ``None``/NaN/negative carry no ``gpu`` tag (the column is then text, ``""``);
    - :data:`LOCAL_GPU`: the source's topology *is* the placement, one GPU per rank
      (the simulator): the rank's local index on its node (``topo.local_index``);
    - ``None``: nothing known, no ``gpu`` tag.

    The topology is not used to fill in a device the collector did not report: a rank
    without one may run on a CPU, or under a placement the topology does not know.
    """
    r = np.atleast_1d(np.asarray(ranks, dtype=np.int64))
    n = len(r)
    data: dict[str, Any] = {"time": _ints(time_ms, n), "job": job, "rank": r}
    data.update(_coords(r, topo, coords))
    hosts = _hosts(r, topo if coords is None else None, host)
    if hosts is not None:
        data["host"] = hosts
    gpus = _gpus(r, topo, gpu)
    if gpus is not None:
        data["gpu"] = gpus
    data[schema.ITERATION_FIELD] = _ints(iteration, n)
    if iteration_ms is not None:
        data[schema.ITERATION_MS_FIELD] = _floats(iteration_ms, n)
    for name, values in stages.items():
        data[name] = _floats(values, n)
    for name, values in (fields or {}).items():
        data[name] = _column(np.asarray(values), n) if np.ndim(values) else values
    out = pd.DataFrame(data)
    if gpus is not None and gpus.dtype == object:
        out["gpu"] = out["gpu"].astype(object)   # device indices as text, "" where unknown
    return out


def _ints(values: Any, n: int) -> np.ndarray:
    return _column(np.asarray(values, dtype=np.int64), n)


def _floats(values: Any, n: int) -> np.ndarray:
    return _column(np.asarray(values, dtype=float), n)


def _column(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` as one value per row: a scalar repeated, an array of ``n`` as it is."""
    if a.ndim == 0:
        return np.full(n, a, dtype=a.dtype)
    if a.shape != (n,):
        raise ValueError(f"{a.shape[0] if a.ndim == 1 else a.shape} values for {n} row(s)")
    return a


def _coords(r: np.ndarray, topo: Topology | None, coords: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    if coords is not None:
        missing = [t for t in COORD_TAGS if t not in coords]
        if missing:
            raise ValueError(f"coords lack {', '.join(missing)}")
        return {t: _ints(coords[t], len(r)) for t in COORD_TAGS}
    if topo is None:
        raise ValueError("stage_rows needs the topology (topo=) or the ranks' coordinates (coords=)")
    r = topo.check_ranks(r)
    return {"pp": topo.pp_index[r], "dp": topo.dp_index[r], "tp": topo.tp_index[r],
            "ep_group": topo.group_ids("ep")[r], "node": topo.node_index[r]}


def _hosts(r: np.ndarray, topo: Topology | None, host: Any) -> np.ndarray | str | None:
    if host is None:
        if topo is None or topo.hosts is None:
            return None
        return np.asarray(topo.hosts, dtype=object)[topo.node_index[r]]
    if isinstance(host, str):
        return host if host else None
    names = np.array([h if isinstance(h, str) else "" for h in np.asarray(host, dtype=object).reshape(-1)],
                     dtype=object)
    names = np.broadcast_to(names, (len(r),)).copy()
    return names if (names != "").any() else None


def _gpus(r: np.ndarray, topo: Topology | None, gpu: Any) -> np.ndarray | None:
    if gpu is None:
        return None
    if isinstance(gpu, str):
        if gpu != LOCAL_GPU:
            raise ValueError(f"gpu={gpu!r}: give device indices, LOCAL_GPU or None")
        if topo is None:
            raise ValueError("gpu=LOCAL_GPU needs the topology (topo=)")
        return topo.local_index[r]
    raw = np.broadcast_to(np.asarray(gpu, dtype=object), (len(r),))
    num = pd.to_numeric(pd.Series(raw), errors="coerce").to_numpy(dtype=float)
    known = np.isfinite(num) & (num >= 0)
    if not known.any():
        return None
    if known.all():
        return num.astype(np.int64)
    return np.array([str(int(v)) if k else "" for v, k in zip(num, known, strict=True)], dtype=object)
