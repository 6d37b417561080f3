"""The collector: what runs beside a training job, or reads what the job already wrote.

Owns the first hop of the data, ``stage_latency`` in: the stage timer (torch, DDP and
Megatron adapters; CPU and CUDA timing), the rank's identity (rank, coordinates, host,
GPU), the non-blocking writer, and the importers of existing traces (PyTorch profiler /
Kineto, per-operation traces, NCCL Inspector logs and Flight Recorder dumps). Every row it
writes is built by :func:`rankscope.stage_rows.stage_rows`.

May import: the core (``rankscope``) only, and itself; no other component.
"""
