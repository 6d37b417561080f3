"""Rollups: what the NOC walls, the L1 panels and the alert rules read instead of raw points.

A wall over hours cannot read every rank's raw ``stage_latency`` on each refresh (12,960
series x 720 iterations for a 6-hour IL-0477 wall). These compact measurements hold exactly
what the walls draw, one point per iteration:

- ``rollup_host``: per host (node id, pp stage) each stage's mean and max over its ranks, and
  the ranks' iteration time: 1,620 series for IL-0477 instead of 12,960;
- ``rollup_host_5m``: ``rollup_host`` over 5-minute windows (:func:`window_rollup`), what the
  per-node heatmap over hours reads: 10x fewer points again at one iteration per 30 s;
- ``rollup_host_1h``: those windows over hours, what the same heatmap reads once its columns are
  an hour or wider (a 6-hour wall, a day, a week): 12x fewer points again;
- ``rollup_job``: per job the iteration time's median, p99 and max over the ranks, and the
  slowest rank (its node and host);
- ``incident_host``: one point per incident and culprit host, so an alert rule can label its
  alerts with the host (the ``incident`` point holds its hosts as one text field, which no
  query can group by).

Pure functions: a :class:`~rankscope.frames.LatencyCube` in, frames out, vectorised over
ranks and iterations. Every point is keyed by the iteration's time and its tags, so rolling
the same iterations up again writes the same points.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.frames import LatencyCube
from rankscope.incident import Incident, IncidentClass
from rankscope.topology import Topology

#: Percentile of the ranks' iteration time the L1 panels draw beside the median and the max.
P99 = 99.0


@dataclass(frozen=True)
class Placement:
    """Where every rank runs: its node id and pp stage, and the host name of every node."""

    node: np.ndarray
    pp: np.ndarray
    hosts: np.ndarray

    @classmethod
    def of(cls, topo: Topology) -> Placement:
        """The placement a topology describes (host names ``node N`` when it knows none)."""
        return cls(topo.node_index, topo.pp_index, np.asarray(topo.host_names(np.arange(topo.nodes)),
                                                              dtype=object))


def _groups(placement: Placement) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ranks sorted by (node, pp); where each group starts; each group's node and pp."""
    pp_size = int(placement.pp.max()) + 1
    key = placement.node.astype(np.int64) * pp_size + placement.pp
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    first = sorted_key[starts]
    return order, starts, first // pp_size, first % pp_size


def _mean_max(values: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and max over each group of axis 1 (NaN ignored), and the finite count."""
    finite = np.isfinite(values)
    sums = np.add.reduceat(np.where(finite, values, 0.0), starts, axis=1)
    counts = np.add.reduceat(finite, starts, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    maxs = np.fmax.reduceat(values, starts, axis=1)
    return means, maxs, counts


def host_rollup(job: str, placement: Placement, cube: LatencyCube) -> pd.DataFrame:
    """``rollup_host`` points: one row per iteration and (node, pp) that reported.

    Fields: ``<stage>`` (mean over the host's ranks, ms), ``<stage>_max``, ``iteration_ms``
    and ``iteration_ms_max`` (the ranks' iteration time), ``ranks`` (how many reported),
    ``iteration``.
    """
    order, starts, node, pp = _groups(placement)
    t, g = len(cube.iterations), len(starts)
    values = cube.values[:, order, :]
    means, maxs, _ = _mean_max(values, starts)
    it_mean, it_max, _ = _mean_max(cube.iteration_ms[:, order][:, :, None], starts)
    reporting = np.add.reduceat(np.isfinite(values).any(axis=2), starts, axis=1)
    data: dict[str, object] = {
        "time": np.repeat(cube.times.astype(np.int64), g),
        "job": job,
        "host": np.tile(placement.hosts[node], t),
        "node": np.tile(node, t),
        "pp": np.tile(pp, t),
        schema.ITERATION_FIELD: np.repeat(cube.iterations.astype(np.int64), g),
        "ranks": reporting.reshape(-1).astype(np.int64),
        schema.ITERATION_MS_FIELD: it_mean.reshape(-1),
        f"{schema.ITERATION_MS_FIELD}_max": it_max.reshape(-1),
    }
    for s, name in enumerate(cube.stages):
        data[name] = means[:, :, s].reshape(-1)
        data[f"{name}_max"] = maxs[:, :, s].reshape(-1)
    if len(data) != 9 + 2 * len(cube.stages):
        raise ValueError(f"a stage name collides with a rollup field: {', '.join(cube.stages)}")
    df = pd.DataFrame(data)
    return df[df["ranks"].to_numpy() > 0].reset_index(drop=True)


#: Columns of a ``rollup_host`` frame that say which host and window a point is, not a value.
_HOST_KEYS = ("job", "host", "node", "pp")


def window_rollup(host: pd.DataFrame, window_ms: int = schema.ROLLUP_WINDOW_MS) -> pd.DataFrame:
    """``rollup_host_5m`` points from ``rollup_host`` points: one row per window and host; and
    ``rollup_host_1h`` points from ``rollup_host_5m`` points the same way.

    Windows are aligned to the epoch (``time // window_ms``), as InfluxQL's ``GROUP BY
    time()`` aligns them, and each point's time is its window's start. Fields: the mean over
    the window's iterations of each mean field (``<stage>``, ``iteration_ms``), the max of
    each ``<field>_max``, the first ``iteration``, how many ``iterations`` and the most
    ``ranks`` that reported. Points that are windows already (they have ``iterations``) count
    as that many iterations, so an hour of 5-minute windows is the mean over the hour's
    iterations, not over its windows (exactly so while every iteration of a window has the
    field; a stage missing from some of a window's iterations is weighted as if it were in
    all). A window's point depends only on the points in it, so writing it again (a later
    cycle, a backfill) writes the same point.

    Example::

        >>> host = pd.DataFrame({"time": [0, 30_000, 300_000], "job": "j", "host": "h1", "node": 1,
        ...                      "pp": 0, "iteration": [0, 1, 10], "ranks": 8,
        ...                      "mlp": [10.0, 30.0, 12.0], "mlp_max": [11.0, 90.0, 13.0]})
        >>> five = window_rollup(host)
        >>> five[["time", "iteration", "iterations", "mlp", "mlp_max"]].to_dict("records")[0]
        {'time': 0, 'iteration': 0, 'iterations': 2, 'mlp': 20.0, 'mlp_max': 90.0}
        >>> hour = window_rollup(five, 3_600_000)    # (2 x 20 + 1 x 12) / 3 iterations
        >>> hour[["time", "iteration", "iterations", "mlp", "mlp_max"]].to_dict("records")[0]
        {'time': 0, 'iteration': 0, 'iterations': 3, 'mlp': 17.333333333333332, 'mlp_max': 90.0}
    """
    if window_ms <= 0:
        raise ValueError(f"window of {window_ms} ms: must be positive")
    if not len(host):
        return pd.DataFrame()
    keys = [k for k in _HOST_KEYS if k in host.columns]
    values = [c for c in host.columns if c not in (*keys, "time", schema.ITERATION_FIELD, "ranks", "iterations")
              and pd.api.types.is_numeric_dtype(host[c])]
    maxes = [c for c in values if c.endswith("_max") and c[:-4] in values]
    means = [c for c in values if c not in maxes]
    weight = (np.nan_to_num(host["iterations"].to_numpy(np.float64), nan=0.0) if "iterations" in host.columns
              else np.ones(len(host)))
    mean_values = host[means].to_numpy(np.float64)
    seen = np.isfinite(mean_values)
    frame = host[[*keys, schema.ITERATION_FIELD, "ranks", *maxes]].assign(
        time=host["time"].to_numpy(np.int64) // window_ms * window_ms, iterations=weight,
        **{f"_w{i}": np.where(seen[:, i], mean_values[:, i] * weight, 0.0) for i in range(len(means))},
        **{f"_n{i}": np.where(seen[:, i], weight, 0.0) for i in range(len(means))})
    grouped = frame.groupby(["time", *keys], sort=True)
    sums = grouped[[f"_w{i}" for i in range(len(means))] + [f"_n{i}" for i in range(len(means))]].sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        weighted = pd.DataFrame({c: np.where(sums[f"_n{i}"] > 0, sums[f"_w{i}"] / sums[f"_n{i}"], np.nan)
                                 for i, c in enumerate(means)}, index=sums.index)
    out = pd.concat([
        grouped[schema.ITERATION_FIELD].min().astype(np.int64),
        grouped["iterations"].sum().round().astype(np.int64),
        grouped["ranks"].max().astype(np.int64),
        weighted,
        grouped[maxes].max(),
    ], axis=1).reset_index()
    return out[["time", *keys, schema.ITERATION_FIELD, "iterations", "ranks", *values]]


def closed_windows(since_ms: int, newest_ms: int, settle_ms: int,
                   window_ms: int = schema.ROLLUP_WINDOW_MS) -> tuple[int, int]:
    """``[start, end)``: the windows from the one holding ``since_ms`` that have closed, i.e. that
    end no later than ``newest_ms - settle_ms`` (late points of an iteration arrive within
    ``settle_ms``). ``start == end`` when none has.

    Example::

        >>> closed_windows(310_000, 1_000_000, 120_000)
        (300000, 600000)
    """
    start = since_ms // window_ms * window_ms
    end = (newest_ms - settle_ms) // window_ms * window_ms
    return start, max(start, end)


def window_span(first_ms: int, last_ms: int, window_ms: int = schema.ROLLUP_WINDOW_MS) -> tuple[int, int]:
    """``[start, end)``: every window that holds a time in ``[first_ms, last_ms]``.

    Example::

        >>> window_span(310_000, 610_000)
        (300000, 900000)
    """
    return first_ms // window_ms * window_ms, (last_ms // window_ms + 1) * window_ms


def job_rollup(job: str, placement: Placement, cube: LatencyCube) -> pd.DataFrame:
    """``rollup_job`` points: one row per iteration that any rank reported.

    Fields: ``median_ms``, ``p99_ms``, ``max_ms`` of the ranks' iteration time, the
    ``slowest_rank`` with its ``slowest_node`` and ``slowest_host``, ``ranks``, ``iteration``.
    """
    it = cube.iteration_ms
    finite = np.isfinite(it)
    keep = finite.any(axis=1)
    it, finite = it[keep], finite[keep]
    slowest = np.argmax(np.where(finite, it, -np.inf), axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        median = np.nanmedian(it, axis=1)
        p99 = np.nanpercentile(it, P99, axis=1)
    node = placement.node[slowest]
    return pd.DataFrame({
        "time": cube.times[keep].astype(np.int64),
        "job": job,
        schema.ITERATION_FIELD: cube.iterations[keep].astype(np.int64),
        "ranks": finite.sum(axis=1).astype(np.int64),
        "median_ms": median,
        "p99_ms": p99,
        "max_ms": np.take_along_axis(it, slowest[:, None], axis=1)[:, 0],
        "slowest_rank": slowest.astype(np.int64),
        "slowest_node": node.astype(np.int64),
        "slowest_host": placement.hosts[node],
    })


def rollup_frames(job: str, topo: Topology, cube: LatencyCube) -> dict[str, pd.DataFrame]:
    """Every per-iteration rollup of ``cube``, by measurement name."""
    if not len(cube.iterations):
        return {}
    placement = Placement.of(topo)
    return {schema.ROLLUP_HOST: host_rollup(job, placement, cube),
            schema.ROLLUP_JOB: job_rollup(job, placement, cube)}


def incident_host_frame(incidents: Iterable[Incident]) -> pd.DataFrame:
    """``incident_host`` points: one row per incident and culprit host (``node N`` when the
    data names no hosts), time = the incident's onset, rewritten in place as it evolves.

    Classes that name no machine to act on (a pipeline imbalance: a whole PP stage, hundreds
    of hosts) get one row with host ``all``, not one alert per host."""
    rows = []
    for inc in incidents:
        hosts = inc.hosts or [f"node {n}" for n in inc.nodes]
        if inc.cls == IncidentClass.PIPELINE_IMBALANCE:
            hosts = ["all"]
        row = {"time": int(inc.onset_ms), "job": inc.job, "id": inc.id, "class": inc.cls.value,
               "status": inc.status.value, "stage": inc.stage or "", "title": inc.title,
               "ratio": float(inc.ratio), "onset_iteration": int(inc.onset_iteration),
               "slowdown": float(inc.impact.slowdown), "gpu_hours_lost": float(inc.impact.gpu_hours_lost)}
        rows += [{**row, "host": h} for h in hosts]
    return pd.DataFrame(rows)
