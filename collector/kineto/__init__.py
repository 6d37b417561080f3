"""Import PyTorch profiler (Kineto) traces as ``stage_latency`` points.

A trace written by ``torch.profiler`` (``export_chrome_trace`` or
``tensorboard_trace_handler``; ``.json`` or ``.json.gz``) holds, per rank,
``ProfilerStep#N`` annotations (the iterations: record with a profiler
``schedule`` and call ``prof.step()`` every iteration), operator events
(``cpu_op``: ``aten::addmm``, ``c10d::allreduce_``, autograd backward functions),
annotations (``user_annotation``: ``nccl:all_reduce``, ``Optimizer.step#SGD.step``;
``record_function`` regions), module events (``python_function``:
``nn.Module: MoEMLP_0`` with ``with_stack=True``) and on GPU the device events
(``kernel``, ``gpu_memcpy``, ``gpu_memset``; ``args.device`` is the GPU).

Named stages have name patterns (regular expressions, searched in event names;
:data:`DEFAULT_PATTERNS`, or a ``[trace.patterns]`` config table). A stage's
time in iteration ``N`` is the union of the intervals of

- events whose name matches one of its patterns;
- backward operators linked (the trace's ``fwdbwd`` flows) to a forward
  operator that ran inside such an event, so a module's backward counts too;
- on GPU, device events whose own name matches, else whose collective (the
  ``Collective name`` PyTorch records on NCCL kernels, matched as
  ``nccl:<collective>``) matches, else that were launched (``args.correlation``)
  from inside such an event. A communication kernel never counts for a compute
  or host stage (a tensor-parallel all-reduce launched inside an MLP module is
  communication). A stage that has device events anywhere in the trace is
  measured by them only (device time, not host launch time).

Every device event no named stage claims goes to a model-agnostic stage of
:data:`rankscope.schema.TRACE_STAGES`, classed as HolisticTraceAnalysis' temporal
breakdown classes kernels: ``comm_other`` (the name says NCCL), ``memcpy``
(copies and memsets) or ``compute_other`` (the rest); and ``host_idle`` is the
part of the iteration's window in which the rank's GPU runs nothing. So every GPU
trace yields compute and communication stages whatever its module names.

EP all-to-all: an unmarked trace cannot tell a dispatch from a combine (the
backward reverses their directions; token-count exchanges add more), so every
all-to-all (``nccl:all_to_all``, ``c10d::alltoall_base_``, and the NCCL
``SendRecv`` kernels they launch) counts for ``dispatch``; ``combine`` takes only
``record_function("rankscope:combine")`` regions or a user pattern. Both are
EP-group comm stages, so the analyzer reads them the same way. A ``SendRecv``
kernel is a pipeline ``pp_send``/``pp_recv`` only where its collective or its
launching annotation says send or recv.

Device events belong to the iteration that launched them, host intervals to the
one whose window contains their start (clipped to it); ``host_idle`` looks at
the window itself.

Where the rank ran: ``host`` from the trace's ``hostname``/``host`` metadata
entry or its ``host_name`` (recent Kineto records it), else the
``<host>_<pid>.<time>.pt.trace.json`` name ``tensorboard_trace_handler`` gives;
``gpu`` from the device events' ``device``. A ``hostname`` added with
``prof.add_metadata`` wins over Kineto's ``host_name``, a host map
(:func:`read_host_map`) over both.

The package follows the data: :mod:`~collector.kineto.parse` reads a trace and sorts its
events, :mod:`~collector.kineto.stages` names their stages,
:mod:`~collector.kineto.summarise` times every stage per iteration,
:mod:`~collector.kineto.rows` makes the ``stage_latency`` rows and
:mod:`~collector.kineto.importer` runs the four over many files into a store.
"""

from collector.kineto.importer import ImportReport, host_placement, import_traces, summarise_files
from collector.kineto.parse import (
    DEVICE_CATS,
    GPU_ANNOTATION_CAT,
    HOST_KEYS,
    LAUNCH_CATS,
    MEMORY_CATS,
    ParsedTrace,
    TraceError,
    load_trace,
    parse_events,
    read_host_map,
    trace_host,
    trace_rank,
)
from collector.kineto.rows import TraceSummary, trace_rows
from collector.kineto.stages import (
    COMM_KERNEL,
    DEFAULT_PATTERNS,
    MEMORY_KERNEL,
    StagePatterns,
    device_stages,
    host_stages,
    kernel_class,
)
from collector.kineto.summarise import grouped_union_length, summarise_trace

__all__ = [
    "COMM_KERNEL", "DEFAULT_PATTERNS", "DEVICE_CATS", "GPU_ANNOTATION_CAT", "HOST_KEYS", "LAUNCH_CATS",
    "MEMORY_CATS", "MEMORY_KERNEL", "ImportReport", "ParsedTrace", "StagePatterns", "TraceError",
    "TraceSummary", "device_stages", "grouped_union_length", "host_placement", "host_stages",
    "import_traces", "kernel_class", "load_trace", "parse_events", "read_host_map", "summarise_files",
    "summarise_trace", "trace_host", "trace_rank", "trace_rows",
]
