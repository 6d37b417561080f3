"""Writing: the analysis and the rollups back to the store.

Last hop of the analyzer's flow (read -> detect -> score -> diagnosis -> **write**). Owns the
rollups the dashboards read (:mod:`~analyzer.write.rollups`: pure, a cube in, frames out); the
``rollup_host_5m`` windows and ``rollup_host_1h`` hours made in memory from the iterations a
job's cycles processed, never read back by a cycle (a restart reads the stored windows once:
:mod:`~analyzer.write.window_rollups`); what a cycle writes and when, kept until stored
(:mod:`~analyzer.write.outputs`: the rollups in batches, change points, L2 points, job health,
incidents); and ``rankscope rollup``'s backfill from the stored points
(:mod:`~analyzer.write.rollup_backfill`, which reads ``stage_latency`` through ``read/``).

May import: the core (``rankscope``: the store, schema, frames, topology, the incident model),
``analyzer.read`` (the backfill's reader) and itself; not ``detect/``, ``score/``,
``diagnosis/``, ``job_analyzer`` (results come in as values), nor ``service/``.
"""
