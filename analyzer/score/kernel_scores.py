"""L3: which ranks run a kernel slower than their parallel group, from one window's ``kernel_stats``.

Each point of the window is one rank's kernels as modes (``<id>_m<j>_n``, ``_p50``, ``_p99``:
:mod:`collector.kernel_channel`). Per kernel id, the modes of every rank (``[R, M]``, NaN where a
rank has none) go to :func:`analyzer.score.kernel_distance.kernel_distances` against the rank's
own group of ``group_kind`` (data parallel by default: its members run the same kernels on the
same shapes). The pooled ``other`` kernel is not scored (its mix differs from rank to rank).

A finding names the rank, the kernel (id, name, compute or comm), the rank's host, its group, and
how far: W1 and the mean shift to the group's reference (us), and ``ratio`` = (reference median +
shift) / reference median.

Example::

    >>> import numpy as np, pandas as pd
    >>> from rankscope.topology import Topology
    >>> rows = [{"rank": r, "kabc_m0_n": 100, "kabc_m0_p50": 150.0 if r == 5 else 100.0,
    ...          "kabc_m0_p99": 165.0 if r == 5 else 110.0} for r in range(8)]
    >>> f = kernel_findings(pd.DataFrame(rows), {"kabc": ("aten::mm", "compute")}, Topology(dp=8))
    >>> f[["rank", "name", "kind", "group_type"]].to_dict("records"), round(float(f["ratio"].iloc[0]), 1)
    ([{'rank': 5, 'name': 'aten::mm', 'kind': 'compute', 'group_type': 'dp'}], 1.5)
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analyzer.detect.fast_median import nanmedian
from analyzer.score.kernel_distance import CHUNK_KERNELS, kernel_distances
from analyzer.score.kernel_step_totals import step_outliers
from rankscope.kernel_names import MODE_FIELD, OTHER, mode_field, step_field
from rankscope.topology import Topology


def kernel_columns(columns) -> dict[str, int]:
    """Kernel id -> modes, from a ``kernel_stats`` frame's columns."""
    out: dict[str, int] = {}
    for c in columns:
        m = MODE_FIELD.match(str(c))
        if m and m.group(1) != OTHER:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(2)) + 1)
    return out


def _modes(frame: pd.DataFrame, kernels: dict[str, int], rows: np.ndarray, world: int) -> tuple[np.ndarray, ...]:
    """``count``, ``p50``, ``p99`` ``[K, world, M]`` (float32) of the kernels; a mode that is
    absent, or has no events or a duration that is not a positive finite number (bad input), is
    NaN in ``count``: no mode."""
    out = [np.full((len(kernels), world, max(kernels.values())), np.nan, dtype=np.float32) for _ in range(3)]
    missing = pd.Series(np.nan, index=frame.index)
    for i, (kid, modes) in enumerate(kernels.items()):
        for j in range(modes):
            n, p50, p99 = (pd.to_numeric(frame.get(mode_field(kid, j, part), missing), errors="coerce")
                           .to_numpy(float) for part in ("n", "p50", "p99"))
            ok = (n > 0) & (p50 > 0) & (p99 > 0) & np.isfinite(n + p50 + p99)
            out[0][i, rows, j] = np.where(ok, n, np.nan)
            out[1][i, rows, j], out[2][i, rows, j] = p50, p99
    return tuple(out)


def _step_times(frame: pd.DataFrame, ids: np.ndarray, rows: np.ndarray, world: int) -> np.ndarray:
    """Each kernel's time per step ``[K, world]`` (``<id>_step_us``; NaN where not written)."""
    out = np.full((len(ids), world), np.nan)
    for i, kid in enumerate(ids):
        col = step_field(str(kid))
        if col in frame.columns:
            out[i, rows] = pd.to_numeric(frame[col], errors="coerce").to_numpy(float)
    return out


#: A launch gap (the device idle between kernels) is a host stall from this long (us), and this
#: many times its group's median gap.
MIN_GAP_US = 50_000.0
GAP_FACTOR = 10.0
#: A collective is slow in itself only if its group's fastest member takes at least this share of
#: the group's median (a member that arrived last, the others waiting for it, is far faster).
LINK_FLOOR = 0.5
#: ... and only if at least this share of its group has data of it (a late arriver's collective may
#: be missing: it waited least, and fell out of its rank's top kernels).
LINK_SEEN = 0.75
COLUMNS = ["rank", "kernel", "name", "kind", "cause", "host", "w1_us", "shift_us", "ref_median_us", "ratio",
           "step_ratio", "group_type", "group_id"]


def kernel_findings(frame: pd.DataFrame, names: dict[str, tuple[str, ...]], topo: Topology,
                    group_kind: str = "dp", fence: float = 5.0, min_shift: float = 0.1,
                    min_cost_us: float = 1000.0) -> pd.DataFrame:
    """The outlier ranks of every kernel in one window's points (one row per rank; a rank
    outside the topology is left out). ``names``: kernel id -> (name, kind[, collective group
    kind]). A rank must also lose ``min_cost_us`` in the window to it (shift x its events): a
    tiny operator that the OS scheduler doubles now and then is no finding. Kernels that fewer
    than three ranks ran are not scored (nothing to compare). ``cause``: see :func:`causes`; and
    the ranks of long launch gaps (:func:`launch_gaps`)."""
    ranks = pd.to_numeric(frame["rank"], errors="coerce").to_numpy()
    keep = np.isfinite(ranks) & (ranks >= 0) & (ranks < topo.world)
    if not keep.all():   # (a copy of a 12,960 x 1,200 frame is not free: only when needed)
        frame = frame[keep]
    rows = ranks[keep].astype(np.int64)
    gaps = launch_gaps(frame, rows, topo, group_kind)
    found = _kernel_rows(frame, rows, names, topo, group_kind, fence, min_shift, min_cost_us)
    return pd.concat([f for f in (found, gaps) if len(f)] or [found], ignore_index=True)


def launch_gaps(frame: pd.DataFrame, rows: np.ndarray, topo: Topology, group_kind: str = "dp") -> pd.DataFrame:
    """Ranks whose device idled far longer than their group's between two kernels in the window
    (``gap_max_us``): the host stopped launching (a JIT compile, GC, a data loader). A finding
    of kind and cause ``host``, never confirmed by itself: it explains a stall the stage times
    saw, rather than blaming the GPU."""
    if "gap_max_us" not in frame.columns:
        return pd.DataFrame(columns=COLUMNS)
    gap = np.full(topo.world, np.nan)
    gap[rows] = pd.to_numeric(frame["gap_max_us"], errors="coerce").to_numpy(float)
    gap[~(gap >= 0)] = np.nan
    gids = topo.group_ids(group_kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = nanmedian(gap[topo.members(group_kind)], axis=1)[gids]
    hit = np.flatnonzero((gap >= MIN_GAP_US) & (gap >= GAP_FACTOR * np.fmax(ref, 1.0)))
    return _findings(hit, topo, group_kind, kernel="launch_gap", kind="host", cause="host",
                     name="launch gap (no kernel running: the host did not launch)", w1_us=gap[hit],
                     shift_us=gap[hit] - ref[hit], ref_median_us=ref[hit], ratio=gap[hit] / np.fmax(ref[hit], 1.0))


def _findings(hit: np.ndarray, topo: Topology, group_kind: str, **columns) -> pd.DataFrame:
    """Findings of the ranks ``hit`` in the columns of :data:`COLUMNS`: ``columns`` and, from the
    topology, each rank's host and group."""
    return pd.DataFrame({"rank": hit, **columns, "host": np.asarray(topo.host_names(topo.node_index[hit]), dtype=object),
                         "group_type": group_kind, "group_id": topo.group_ids(group_kind)[hit].astype(np.int64)},
                        columns=COLUMNS)


def _kernel_rows(frame: pd.DataFrame, rows: np.ndarray, names: dict[str, tuple[str, ...]], topo: Topology,
                 group_kind: str, fence: float, min_shift: float, min_cost_us: float) -> pd.DataFrame:
    """The kernel findings of :func:`kernel_findings`, a few kernels at a time (their arrays
    stay in the caches, and nothing of the size of the whole window is allocated)."""
    kernels = list(kernel_columns(frame.columns).items())
    gids, members = topo.group_ids(group_kind), topo.members(group_kind)
    steps = np.ones(topo.world)
    if "steps" in frame.columns:
        steps[rows] = np.clip(np.nan_to_num(pd.to_numeric(frame["steps"], errors="coerce").to_numpy(float), nan=1.0), 1, None)
    found = []
    for i in range(0, len(kernels), CHUNK_KERNELS):
        chunk = dict(kernels[i:i + CHUNK_KERNELS])
        count, p50, p99 = _modes(frame, chunk, rows, topo.world)
        present = np.isfinite(count).any(axis=2)                 # [K, R]: the rank ran the kernel
        ran = present.sum(axis=1) >= 3
        if not ran.any():
            continue
        count, p50, p99, present, ids = count[ran], p50[ran], p99[ran], present[ran], np.array(list(chunk))[ran]
        d = kernel_distances(count, p50, p99, members, gids, fence=fence, min_shift=min_shift)
        st = step_outliers(_step_times(frame, ids, rows, topo.world), members, gids, fence=fence,
                           min_shift=min_shift)
        hits = ((d.outlier & (d.shift_us * np.nansum(count, axis=2) >= min_cost_us))
                | (st.outlier & ((st.ratio - 1.0) * st.ref_us * steps >= min_cost_us)))
        ki, hit = np.nonzero(hits)
        if not hit.size:
            continue
        info = [tuple(names.get(str(kid), (str(kid), "unknown"))) + ("",) for kid in ids[ki]]
        ref = d.ref_median_us[ki, hit]
        found.append(_findings(
            hit, topo, group_kind, kernel=ids[ki], name=[x[0] for x in info], kind=[x[1] for x in info],
            cause=causes(hits, present, d.ref_median_us + d.shift_us, ki, hit, [x[1] for x in info],
                         [x[2] or group_kind for x in info], topo),
            w1_us=d.w1_us[ki, hit], shift_us=d.shift_us[ki, hit], ref_median_us=ref,
            ratio=np.fmax((ref + d.shift_us[ki, hit]) / ref, st.ratio[ki, hit]), step_ratio=st.ratio[ki, hit]))
    if not found:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(found, ignore_index=True).sort_values("w1_us", ascending=False, ignore_index=True)


def causes(hits: np.ndarray, present: np.ndarray, level: np.ndarray, ki: np.ndarray, hit: np.ndarray,
           kinds: list[str], collective: list[str], topo: Topology) -> list[str]:
    """Whether each finding's slowness is the kernel's own: ``own`` for compute; for a collective,
    the arrival rule: its members all end together, and the last to arrive waits least. So the
    collective itself is slow (``link``) only when every member of its group that ran it stands
    out and evenly, its fastest member (``level``: each rank's mean duration, ``[K, R]``) at
    least ``LINK_FLOOR`` of the group's median: no one waited. Otherwise the slow members waited
    for the late ones (``wait``: victims, not culprits; a straggler that also waits somewhat is
    the group's fastest). ``unknown`` for a kernel whose name (and so kind) has not come.

    A collective whose group kind is not known (the live channel cannot tell it from a kernel's
    name) is taken as data parallel, the group the ranks are scored in, where at most half of the
    group can stand out: such a finding is always ``wait``, never confirmed. The simulator and a
    trace that names its collectives' groups can tell a ``link``."""
    groups: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    out = []
    for k, r, kind, coll in zip(ki, hit, kinds, collective, strict=True):
        if kind != "comm":
            out.append("own" if kind == "compute" else "unknown")
            continue
        if coll not in groups:
            try:
                groups[coll] = topo.members(coll), topo.group_ids(coll)
            except ValueError:   # a group kind the topology does not know: the data-parallel one
                groups[coll] = topo.members("dp"), topo.group_ids("dp")
        members, gids = groups[coll]
        group = members[gids[r]]
        mine = group[present[k, group]]
        seen = len(mine) > 1 and len(mine) >= LINK_SEEN * len(group)   # members with no data may be the late ones
        even = seen and np.nanmin(level[k, mine]) >= LINK_FLOOR * np.nanmedian(level[k, mine])
        out.append("link" if even and hits[k, mine].all() else "wait")
    return out
