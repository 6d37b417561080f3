"""What a job's ``stage_latency`` rows say about the job: its topology, placement and stages.

The rows' tags (``rank``, ``tp``, ``pp``, ``dp``, ``ep_group``, ``node``, ``host``) describe the
parallel layout and where each rank runs; their stage fields say which stages the collectors
time. :class:`~analyzer.read.iteration_reader.IterationReader` applies these to the rows it
reads: the layout of a job's first iterations, a placement that moved (a replaced node), the
layout of each chunk a backfill reads.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.schema import StageSet
from rankscope.topology import Topology, TopologyError
from rankscope.topology_inference import infer_topology

log = logging.getLogger(__name__)


def topology_of(frame: pd.DataFrame) -> Topology:
    """The topology (and, from ``host`` tags, the placement) that the rows' tags describe."""
    hosts = frame["host"] if "host" in frame.columns else None
    return infer_topology(frame["rank"], frame["tp"], frame["pp"], frame["dp"], frame["ep_group"],
                          frame["node"], host=hosts)


def chunk_topology(frame: pd.DataFrame, previous: Topology | None) -> Topology:
    """The topology a chunk's rank tags describe (each rank's latest row); the previous
    chunk's when this one misses ranks and does not describe one."""
    try:
        return topology_of(frame.drop_duplicates("rank", keep="last"))
    except TopologyError:
        if previous is None:
            raise
        return previous


def stages_of(columns) -> StageSet:
    """The known stages present in the data (``schema.KNOWN_STAGES``: the default set's, the TP
    collectives and the model-agnostic trace set's, what ``import-trace`` writes); unknown columns
    are ignored with a warning."""
    cols = set(schema.stage_fields(columns))
    known = [s for s in schema.KNOWN_STAGES if s.name in cols]
    unknown = cols - {s.name for s in known}
    if unknown:
        log.warning("ignoring stage field(s) the analyzer has no declaration for: %s "
                    "(declare them in the [stages] table of --config)", ", ".join(sorted(unknown)))
    if not known:
        raise ValueError("no known stage field in stage_latency; declare the stages in --config")
    return StageSet(tuple(known))


def described_placement(job: str, frame: pd.DataFrame, topo: Topology, restart: bool = False) -> Topology | None:
    """The topology the rows' host tags describe when it is not ``topo``: another parallel
    layout (``!=``: tp, pp, dp, ep, gpus_per_node or order differ) or the same layout with
    the ranks on other nodes or the host names now complete. None when the rows say nothing
    new: no host tags, not every rank in them, or tags that describe no placement.

    ``restart``: the rows are a restart's first; there a job may come back smaller (its
    tags' sizes say so), and fewer ranks than ``topo`` describe that smaller layout. Anywhere
    else fewer ranks are ranks gone silent, not a job that shrank."""
    if "host" not in frame.columns or not len(frame):
        return None
    # each rank's newest row: dropped points leave hardly any iteration with every rank
    last = frame.drop_duplicates("rank", keep="last")
    if len(last) < topo.world and not restart:
        return None   # not every rank seen: that does not describe the placement
    try:
        seen = topology_of(last)
    except TopologyError as exc:
        log.warning("job %s: host tags do not describe a placement (%s); keeping the old one", job, exc)
        return None
    if seen != topo:
        return seen
    if len(last) < topo.world:
        return None   # the same layout, some ranks' points not in yet
    if topo.same_placement(seen):
        return None
    moved = np.flatnonzero(topo.node_index != seen.node_index)
    if len(moved):
        log.warning("job %s: rank placement changed (%d rank(s) on other nodes; hosts now %s...)",
                    job, len(moved), ", ".join((seen.hosts or ())[:3]))
    else:   # same nodes, their names now complete (the first iteration lacked some ranks)
        log.info("job %s: host names of the placement updated (no rank moved; hosts now %s...)",
                 job, ", ".join((seen.hosts or ())[:3]))
    return seen
