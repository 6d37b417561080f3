"""Import traces: parse, summarise and make rows of every file, then write them to a store."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from collector.kineto.kernels import kernel_points, trace_windows
from collector.kineto.parse import TraceError, load_trace, parse_events
from collector.kineto.rows import TraceSummary, trace_rows
from collector.kineto.stages import StagePatterns
from collector.kineto.summarise import summarise_trace
from collector.untrusted.bounded_read import DEFAULT_LIMIT, FileLimit
from rankscope import schema
from rankscope.topology import Topology, TopologyError


@dataclass
class ImportReport:
    """What an import wrote."""

    files: int
    ranks: list[int]
    iterations: int
    points: int
    stages: list[str]
    hosts: list[str] = field(default_factory=list)
    #: Events refused for a field that failed its check (every file), and the first of them.
    refused: int = 0
    first_refused: str = ""
    #: ``kernel_stats`` points written (``--kernels``), and the ranks whose traces had no kernel event.
    kernel_points: int = 0
    no_kernels: list[int] = field(default_factory=list)


def host_placement(topology: Topology, hosts: Mapping[int, str]) -> Topology | None:
    """``topology`` with its ranks placed on the nodes their hosts say (node ids in order of
    each host's lowest rank, as the analyzer numbers them); None when the hosts do not
    cover every rank or hold other than ``gpus_per_node`` ranks each."""
    if len(hosts) != topology.world or set(hosts) != set(range(topology.world)):
        return None
    ranks = np.arange(topology.world)
    names = np.array([hosts[int(r)] for r in ranks], dtype=object)
    uniq, first, inverse = np.unique(names.astype(str), return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    node_of_host = np.empty(len(uniq), dtype=np.int64)
    node_of_host[order] = np.arange(len(uniq))
    try:
        return topology.with_placement(node_of_host[inverse], tuple(uniq[order].tolist()))
    except TopologyError:
        return None


def import_traces(paths: Iterable[str | Path], store: Any, job: str, topology: Topology | None = None,
                  patterns: StagePatterns | None = None, iteration_offset: int = 0,
                  rank: int | None = None, progress: Callable[[str], Any] | None = None,
                  hosts: Mapping[int, str] | None = None, limit: FileLimit = DEFAULT_LIMIT,
                  kernel_steps: int = 0) -> ImportReport:
    """Summarise every trace and write its ``stage_latency`` points to ``store``.

    ``topology`` defaults to a pure data-parallel job of the traces' world size, with
    as many ranks per node as each host holds when every rank's host is known.
    ``hosts`` (rank -> host name, e.g. from :func:`read_host_map`) wins over the
    host a trace records. Where the hosts fit the topology, the ``node`` tags follow
    them; else they are the topology's block placement. Each file is read within ``limit``;
    events whose fields fail their checks are refused and counted in the report. With
    ``kernel_steps`` > 0, every ``kernel_steps`` ProfilerSteps of each trace are also a
    ``kernel_stats`` window (:mod:`collector.kineto.kernels`).
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise TraceError("no trace files given")
    summaries = summarise_files(paths, patterns or StagePatterns.default(), rank, hosts, progress, limit,
                                kernel_steps)
    seen: dict[int, str] = {}
    for s in summaries:
        if s.rank in seen:
            raise TraceError(f"{s.path} and {seen[s.rank]} are both rank {s.rank}")
        seen[s.rank] = s.path
    host_of = {s.rank: s.host for s in summaries if s.host}
    topology = _placed_topology(topology, summaries, host_of, progress)
    df = trace_rows([s for s in summaries if s.iterations], topology, job, iteration_offset)
    if not len(df):
        raise TraceError("the traces hold no complete ProfilerStep")
    store.write_stage_latency(df)
    stages = schema.stage_fields(df.columns)
    refused = [s for s in summaries if s.refused]
    report = ImportReport(len(paths), sorted(seen), int(df[schema.ITERATION_FIELD].nunique()), len(df), stages,
                          sorted(set(host_of.values())), sum(s.refused for s in refused),
                          refused[0].first_refused if refused else "")
    if kernel_steps:
        report.no_kernels = sorted(s.rank for s in summaries if not any(w[2] for w in s.kernels))
        stats, names = kernel_points({s.rank: s.kernels for s in summaries if s.kernels}, df, iteration_offset)
        if len(stats):
            store.write_measurement(schema.KERNEL_NAME, names)
            store.write_measurement(schema.KERNEL_STATS, stats)
        report.kernel_points = len(stats)
    return report


def summarise_files(paths: list[Path], patterns: StagePatterns, rank: int | None = None,
                    hosts: Mapping[int, str] | None = None,
                    progress: Callable[[str], Any] | None = None,
                    limit: FileLimit = DEFAULT_LIMIT, kernel_steps: int = 0) -> list[TraceSummary]:
    """The summary of every trace file (read within ``limit``), its host from ``hosts`` where
    that names its rank; with ``kernel_steps``, its kernel windows too."""
    summaries = []
    for i, p in enumerate(paths):
        data = load_trace(p, limit)
        s = summarise_trace(data, patterns, p, rank)
        if kernel_steps:
            s.kernels = trace_windows(parse_events(data, p), s.end_ms, kernel_steps)
        if hosts and s.rank in hosts:
            s.host = hosts[s.rank]
        summaries.append(s)
        if progress is not None:
            where = ", ".join(x for x in (f"host {s.host}" if s.host else "",
                                          f"gpu {s.gpu}" if s.gpu is not None else "") if x)
            progress(f"[{i + 1}/{len(paths)}] {p}: rank {s.rank}{', ' + where if where else ''}, "
                     f"{len(s.iterations)} iteration(s)" + (
                         f"; refused {s.refused} event(s) with bad values (first: {s.first_refused})"
                         if s.refused else ""))
    return summaries


def _placed_topology(topology: Topology | None, summaries: list[TraceSummary], host_of: dict[int, str],
                     progress: Callable[[str], Any] | None) -> Topology:
    """The job's topology (default: pure DP over the traces' world), placed by the hosts when
    they fit it."""
    if topology is None:
        world = max([s.world or 0 for s in summaries] + [max(s.rank for s in summaries) + 1])
        per_host = Counter(host_of.values())
        if len(host_of) == world and len(set(per_host.values())) == 1:
            gpus = world // len(per_host)
        else:
            gpus = min(8, world) if world % min(8, world) == 0 else 1
        topology = Topology(dp=world, gpus_per_node=gpus)
    placed = host_placement(topology, host_of) if host_of else None
    if placed is not None:
        return placed
    if host_of and len(host_of) == topology.world and progress is not None:
        progress(f"the traces' hosts do not hold {topology.gpus_per_node} rank(s) each; node tags follow "
                 f"the topology's block placement, host tags what the traces say")
    return topology
