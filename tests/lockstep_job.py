"""Stage latencies of a job timed the way a region timer around a tensor-parallel layer times it:
a timing model of its own (not the simulator's).

Per layer every GPU computes its share, then the TP group all-reduces: the region timer of
``attention`` and ``mlp`` holds the all-reduce, so every member's compute reads as the TP group's
slowest (lockstep), and a nested timer of the all-reduce (``tp_comm``) holds each member's wait
for that slowest. After the layers the DP group reduce-scatters (each member waits for the DP
group's last), then the optimizer and the data loader. One GPU slowed from ``onset``: from
outside its whole TP group looks slow, in compute and at the DP collective alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankscope.frames import LatencyCube
from rankscope.schema import DEFAULT_STAGES, TP_COMM, Stage, StageSet
from rankscope.topology import Topology

STAGES = StageSet((DEFAULT_STAGES["attention"], DEFAULT_STAGES["mlp"], TP_COMM,
                   Stage("reduce_scatter", "comm", "dp"), DEFAULT_STAGES["optimizer"], DEFAULT_STAGES["dataloader"]))


@dataclass(frozen=True)
class LockstepJob:
    tp: int = 4
    dp: int = 8
    gpus_per_node: int = 8
    layers: int = 8
    noise: float = 0.03
    slow: tuple[int, ...] = (5,)
    factor: float = 2.0
    onset: int = 20
    iterations: int = 40
    seed: int = 0

    @property
    def topology(self) -> Topology:
        return Topology(tp=self.tp, dp=self.dp, gpus_per_node=self.gpus_per_node)


def cube(job: LockstepJob, faulty: bool = True) -> LatencyCube:
    """Every iteration of the job (ms; stage values are totals per iteration)."""
    topo, rng = job.topology, np.random.default_rng(job.seed)
    n = topo.world
    tp_m, tp_g = topo.members("tp"), topo.group_ids("tp")
    dp_m, dp_g = topo.members("dp"), topo.group_ids("dp")
    speed = np.exp(0.02 * rng.standard_normal(n))
    out = np.zeros((job.iterations, n, len(STAGES)))
    it_ms = np.zeros((job.iterations, n))
    for i in range(job.iterations):
        f = np.ones(n)
        if faulty and i >= job.onset:
            f[list(job.slow)] = job.factor
        work = np.zeros((2, n))
        wait = np.zeros(n)
        for _ in range(job.layers):
            for k, ms in enumerate((4.0, 9.0)):                      # attention, mlp
                own = ms * speed * f * np.exp(job.noise * rng.standard_normal(n))
                done = own[tp_m].max(axis=1)[tp_g] + 0.15            # the all-reduce ends at the last + transfer
                work[k] += done                                      # the region holds the all-reduce
                wait += done - own
        arrive = work.sum(axis=0) + 30.0 * np.exp(0.1 * rng.standard_normal(n))   # + the data loader
        rs_end = arrive[dp_m].max(axis=1)[dp_g] + 12.0
        opt = 6.0 * speed * f * np.exp(job.noise * rng.standard_normal(n))
        it_ms[i] = (rs_end + opt[dp_m].max(axis=1)[dp_g])
        out[i] = np.column_stack([work[0], work[1], wait, rs_end - arrive, opt, arrive - work.sum(axis=0)])
    return LatencyCube(np.arange(job.iterations), 1_765_000_000_000 + np.arange(job.iterations) * 1000,
                       STAGES.names, out, it_ms)
