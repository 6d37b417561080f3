"""The parts of :class:`collector.stage_timer.StageTimer`, one concern per module.

- :mod:`~collector.stage_timing.timing`: the :class:`~collector.stage_timing.timing.Timing`
  interface (where marks come from, how a finished iteration's marks become milliseconds) and
  the :class:`~collector.stage_timing.timing.Iteration` it resolves;
- :mod:`~collector.stage_timing.cpu`: CPU timing (a monotonic clock, resolved at once);
- :mod:`~collector.stage_timing.cuda`: CUDA timing (events, resolved later without waiting);
- :mod:`~collector.stage_timing.regions`: the current iteration's intervals and the regions
  (context managers) that add to them;
- :mod:`~collector.stage_timing.hooks`: torch module hooks and the DDP communication hook;
- :mod:`~collector.stage_timing.megatron`: the stand-in for Megatron-LM's ``Timers``.

Owns the timing of stages in a training process; imports only the core (``rankscope``) and,
where a module needs it, torch.
"""
