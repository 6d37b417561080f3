"""Collective timings recorded without code changes -> ``stage_latency`` points.

Two sources write, for every collective a rank runs, how long it took; neither needs a change
to the training script, only environment variables.

**NCCL Inspector** (NVIDIA/nccl ``ext-profiler/inspector``; :mod:`collector.nccl_import.inspector`
says what it writes and cites its sources): NCCL's profiler plugin, enabled by environment
variables, appends one JSON line per completed collective per communicator to one log per process.

**PyTorch Flight Recorder** (pytorch ``FlightRecorder.hpp``; :mod:`collector.nccl_import.flight_recorder`
says what it writes and cites its sources): the ring buffer of recent collectives a process
group keeps (NCCL and gloo alike), dumped per rank; with ``TORCH_NCCL_ENABLE_TIMING=1``
completed entries carry their duration. Without it (PyTorch's default) every entry still
carries its rank's arrival, and :mod:`collector.nccl_import.arrivals` times each collective
by who arrives last: each rank's wait for the last member (across hosts, only beyond the
bound on their clocks' skew).

Both are read into one record table (:data:`RECORD_COLUMNS`): per record the global rank,
communicator, its members, the operation, sequence number, duration and a timestamp. A
directory import keeps what is good (:func:`read_files`): files still being written are
skipped with a warning, a file that cannot be read is refused by name, the rest imported.

**Global ranks and communicators.** A Flight Recorder dump names its rank and every process
group's global members. An Inspector file is one process: its global rank is its rank in the
job-wide communicator, and a communicator's members are the processes whose files report it.

**Kind of a communicator and stage of a collective** (:func:`comm_kinds`, :func:`stage_of`):
a communicator whose member set is a group of the job's layout (``--tp/--pp/--dp/--ep``) has
that kind (``tp``, ``dp``, ``ep``, ``edp``, ``pipeline``), tried in that order; one of two
members that only sends and receives is ``pipeline``; one spanning the whole job is ``world``.
Then:

========================================= =============================== =================
operation, communicator kind              stage                           group
========================================= =============================== =================
all-to-all (or SendRecv) on ``ep``        ``dispatch``, ``combine``       ep
                                          (alternating in an iteration)
send / recv on ``pipeline``               ``pp_send`` / ``pp_recv``       pipeline
reduce-scatter, all-reduce on ``dp``      ``reduce_scatter``              dp
all-gather on ``dp``                      ``all_gather``                  dp
reduce-scatter, all-reduce on ``edp``     ``expert_reduce``               edp
anything else (tp, world, broadcast, ...) ``comm_other``                  dp
========================================= =============================== =================

(An all-reduce is a reduce-scatter plus an all-gather; as the stage timer's DDP hook does, it
is the DP gradient sync ``reduce_scatter``.) A stage's time in an iteration is the sum of its
records' durations (ms).

**Iterations.** The *anchor* communicator (default: the one with the most members, ties to
the lowest id; ``anchor=``) runs ``per_iteration`` collectives per iteration (default 1, e.g.
one gradient all-reduce): its record of sequence number ``sn`` ends iteration
``(sn - first_sn) // per_iteration`` when ``sn`` is the last of that block. Every other record
of a rank belongs to the iteration of the first anchor record of the same rank at or after it
in that rank's own order (Flight Recorder: ``record_id``; Inspector: its end timestamp, then
its line). Records after a rank's last anchor record belong to an iteration not finished yet
and are not written. An iteration is written for the ranks whose anchor record closing it was
recorded.

**Time.** A point's time is its rank's own end of the iteration's anchor collective: Flight
Recorder ``time_discovered_completed_ns`` (else ``time_created_ns + duration_ms``, else
``time_created_ns`` plus the wait); Inspector
the last ``kernel_stop_ts`` when verbose, else ``dump_timestamp_us`` (later by at most one dump
interval). ``iteration_ms`` is the time between a rank's consecutive anchor ends (the first
iteration: from its first record). Times are kept strictly increasing per rank (1 ms apart at
least).

The steps, one module each: :mod:`~collector.nccl_import.parse` (with ``inspector``,
``flight_recorder``, ``arrivals`` and ``records``) reads the files into the record table;
:mod:`~collector.nccl_import.stages` names the communicators' kinds and the collectives' stages;
:mod:`~collector.nccl_import.iterations` summarises them per rank per iteration;
:mod:`~collector.nccl_import.rows` makes the ``stage_latency`` rows (:func:`stage_frame` runs
the steps). The Inspector's Prometheus output (``NCCL_INSPECTOR_PROM_DUMP=1``: ``.prom``
textfiles, :mod:`~collector.nccl_import.prom_text`, or a Prometheus that scraped them,
:mod:`~collector.nccl_import.prom_api`) holds one collective per communicator per dump: its
samples become records (:mod:`~collector.nccl_import.prom_records`) and each dump one row per rank
(:mod:`~collector.nccl_import.snapshots`, through the same stages, summary and rows). The package
imports only the core (``rankscope``).
"""

from __future__ import annotations

from collector.nccl_import.arrivals import CLOCK_SKEW_MS, Timing, arrival_waits, timed
from collector.nccl_import.flight_recorder import (
    FR_COLUMNS,
    FR_ENTRY_FIELDS,
    FR_PREFIX,
    flight_recorder_records,
    fr_host,
    read_flight_recorder,
)
from collector.nccl_import.inspector import (
    INSPECTOR_FIELDS,
    INSPECTOR_OPS,
    inspector_records,
    parse_inspector_lines,
    read_inspector,
)
from collector.nccl_import.iterations import choose_anchor
from collector.nccl_import.parse import Loaded, detect_format, expand, load, read_files
from collector.nccl_import.records import RECORD_COLUMNS, Incomplete, NcclError, world_of
from collector.nccl_import.rows import NcclImport, make_rows, stage_frame
from collector.nccl_import.stages import comm_kinds, default_topology, stage_of

__all__ = [
    "CLOCK_SKEW_MS", "FR_COLUMNS", "FR_ENTRY_FIELDS", "FR_PREFIX", "INSPECTOR_FIELDS", "INSPECTOR_OPS",
    "RECORD_COLUMNS", "Incomplete", "Loaded", "NcclError", "NcclImport", "Timing", "arrival_waits",
    "choose_anchor", "comm_kinds", "default_topology", "detect_format", "expand", "flight_recorder_records",
    "fr_host", "inspector_records", "load", "make_rows", "parse_inspector_lines", "read_files",
    "read_flight_recorder", "read_inspector", "stage_frame", "stage_of", "timed", "world_of",
]
