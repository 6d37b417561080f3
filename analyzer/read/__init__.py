"""Reading: whole iterations out of a job's ``stage_latency`` points.

First hop of the analyzer's flow (**read** -> detect -> score -> diagnosis -> write). Owns the
only reader of ``stage_latency`` in the analyzer,
:class:`~analyzer.read.iteration_reader.IterationReader`: the cursor and its late margin,
where a first read starts (everything, or a restarted analyzer's replay) and its cut, the
probe and the reads, and the events read once a cycle; the
:class:`~analyzer.read.iteration_assembler.IterationAssembler` that hands on whole iterations;
how many iterations a read asks for (:mod:`~analyzer.read.read_size`); and what the rows say
about the job: its topology, placement and stages (:mod:`~analyzer.read.row_layout`), its
restarts and the steps that number its iterations across them (:mod:`~analyzer.read.attempts`);
and the culprit hosts' record across jobs (:mod:`~analyzer.read.host_history`,
:mod:`~analyzer.read.host_record`). Reads only, never writes; the cycle (``service/``) and the backfill (``write/``) read through it.

May import: the core (``rankscope``: the store, schema, topology) and itself; no later hop
(``detect/``, ``score/``, ``diagnosis/``, ``write/``), nor ``service/``.
"""
