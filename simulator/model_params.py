"""Calibration constants of the cluster model (a scenario's optional ``[model]`` table).

The defaults are calibrated on the IL-0477 job (TP=1, PP=9, DP=1440, EP=32):
a healthy iteration takes about 30 s, of which ``mlp`` is about 13 s on the
critical path (54 microbatches x 6 MoE layers per stage x ~40 ms), so an
``mlp`` slowdown of 5.7x on one node pushes the job past 90 s per iteration.
See docs/simulator.md for what each number means.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelParams:
    """Durations are healthy medians in ms; sigmas are lognormal shape parameters."""

    #: Microbatches per iteration per pipeline (the 1F1B schedule's M).
    microbatches: int = 54
    #: Transformer/MoE layers per pipeline stage.
    layers_per_stage: int = 6
    #: Attention compute of one layer for one microbatch, forward + backward.
    attention_ms: float = 14.0
    #: Expert MLP compute of one layer for one microbatch, forward + backward.
    mlp_ms: float = 40.0
    #: Optimizer step, once per iteration.
    optimizer_ms: float = 220.0
    #: Host-side batch loading, once per iteration.
    dataloader_ms: float = 120.0
    #: Pure transfer time of one EP all-to-all (one direction of dispatch or combine).
    ep_transfer_ms: float = 2.5
    #: Pure transfer time of one TP all-reduce (NVLink; tp > 1): a layer runs four, after attention
    #: and after the MLP, forward and backward.
    tp_transfer_ms: float = 0.3
    #: Pure transfer time of one pipeline p2p message (an activation or a gradient).
    pp_transfer_ms: float = 6.0
    #: Pure transfer time of the DP reduce-scatter of the dense (non-expert) gradients.
    reduce_scatter_ms: float = 250.0
    #: Pure transfer time of the expert gradients' reduce-scatter over the expert-data-parallel
    #: group (the ranks holding the same experts), after the dense one.
    expert_reduce_ms: float = 150.0
    #: Pure transfer time of the DP parameter all-gather (once per iteration).
    all_gather_ms: float = 300.0
    #: Share of a layer's compute that runs in the forward pass (the rest is backward).
    forward_share: float = 1.0 / 3.0
    #: Persistent per-GPU speed spread (lognormal sigma, clipped to +-3 sigma).
    gpu_speed_sigma: float = 0.02
    #: Per-rank, per-iteration compute noise (lognormal sigma, clipped to +-3.5 sigma).
    iteration_sigma: float = 0.03
    #: Jitter between the occurrences inside one iteration (sets the expected wait
    #: for the slowest member of a collective even when all means are equal).
    occurrence_sigma: float = 0.03
    #: Per-group, per-iteration transfer noise.
    transfer_sigma: float = 0.06
    #: Per-rank, per-iteration dataloader noise (not clipped: host time has a long tail).
    host_sigma: float = 0.08
    #: Per-rank, per-iteration expert load imbalance of MoE routing (lognormal sigma on mlp,
    #: not clipped): some experts get more tokens than others each iteration.
    expert_load_sigma: float = 0.0
    #: Sporadic one-iteration stalls (GC, page faults, OS jitter): the fraction of
    #: rank-iterations whose attention is slowed by a factor drawn from
    #: [stall_factor_min, stall_factor_max] for that iteration only.
    stall_rate: float = 0.0
    stall_factor_min: float = 1.5
    stall_factor_max: float = 3.0
    # What real collectors write (the points, not the model): each rank stamps its own clock,
    # up to ``rank_clock_ms`` after the iteration's time; each host's clock is off by a fixed
    # amount within +-``host_clock_ms``; a fraction ``drop_rate`` of points is dropped.
    rank_clock_ms: float = 0.0
    host_clock_ms: float = 0.0
    drop_rate: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"model.{f.name} must be a positive integer, got {value!r}")
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"model.{f.name} must be a number >= 0, got {value!r}")
        if self.stall_factor_max < self.stall_factor_min:
            raise ValueError("model.stall_factor_max must be at least model.stall_factor_min")
        for name in ("stall_rate", "drop_rate"):
            if getattr(self, name) >= 1:
                raise ValueError(f"model.{name} must be below 1, got {getattr(self, name)!r}")
        if not 0 < self.forward_share < 1:
            raise ValueError(f"model.forward_share must be between 0 and 1, got {self.forward_share!r}")

    @classmethod
    def keys(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelParams:
        unknown = set(data) - cls.keys()
        if unknown:
            raise ValueError(f"unknown model key(s) {', '.join(sorted(unknown))}")
        return cls(**{k: (float(v) if isinstance(v, int) and not isinstance(v, bool)
                          and cls.__dataclass_fields__[k].type in ("float", float) else v)
                      for k, v in data.items()})
