"""A cluster simulator in which slowness travels the way it does on a real hybrid-parallel job.

Every iteration is computed at once for all ranks with numpy (no loop over ranks
or groups). The causal chain, per rank ``r`` at pipeline stage ``s`` of EP
chunk ``u`` (the ``ep`` consecutive dp indices that form its EP groups):

1. **Compute**: per-occurrence ``attention`` and ``mlp`` (one layer, one
   microbatch, forward + backward), ``optimizer`` and ``dataloader``: a healthy
   median x a persistent per-GPU speed x per-iteration lognormal noise x the
   factors of the active faults. With ``tp > 1`` each layer's attention and MLP end with TP
   all-reduces: every member leaves them when the TP group's slowest is done (plus the
   transfers); its ``tp_comm`` is its wait for that member (the slow one waits least).
2. **EP all-to-all** (per layer): a collective finishes when its LAST member
   arrives plus its transfer time; each member measures ``finish - own arrival``.
   Forward runs attention -> dispatch -> mlp -> combine, backward combine -> mlp
   -> dispatch -> attention, so both all-to-alls carry waits for slow attention
   AND slow mlp (weighted by the forward/backward shares). The group's layer step
   is the same for all its members: ``max(attention) + max(mlp) + 4 transfers``.
3. **Pipeline (1F1B)**: a stage's per-microbatch work ``U`` is its layer steps
   plus its p2p transfer times; the EP groups of a chunk lock its pipelines
   together, so the chunk runs as one pipeline with stage times ``U_s`` (max over
   the chunk's ranks at that stage). Its makespan is ``(M-1) max_s U_s + sum_s U_s``.
   A stage's idle time (``makespan - M U_s``) is bubble: the fill/drain part
   and, downstream of the slowest stage, the steady-state starvation are
   ``pp_recv`` waits; upstream of the slowest stage the back-pressure is
   ``pp_send`` waits.
4. **DP** (per stage): every rank enters ``reduce_scatter`` (the dense gradients)
   when its chunk's pipeline has drained; it finishes when the last rank of the DP
   group arrives plus the ring's transfer time; then ``expert_reduce`` (the expert
   gradients) over its expert-data-parallel group (the ranks holding the same
   experts, one per EP group), then ``optimizer`` and ``all_gather`` over the DP
   group, which waits for the DP group's slowest expert reduce. The rank's
   ``iteration_ms`` is when its DP group's all-gather finishes.

Transfer times are per group: the slowest link among its members (a degraded
NIC slows every all-to-all, p2p hop and ring it takes part in). Invariant: for
every rank ``iteration_ms == sum(value[stage] * occurrences[stage])``.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from rankscope.schema import DEFAULT_STAGES, TP_COMM, SchemaError, StageSet
from rankscope.stage_rows import LOCAL_GPU, stage_rows
from rankscope.topology import Topology
from simulator.faults import Fault
from simulator.model_params import ModelParams
from simulator.scenario import Scenario
from simulator.swaps import placement_at, swapped_ranks

#: Rows of the per-iteration fault-factor matrix.
_ATTENTION, _MLP, _OPTIMIZER, _DATALOADER, _LINK = range(5)
_ROW_OF_STAGE = {"attention": _ATTENTION, "mlp": _MLP, "optimizer": _OPTIMIZER, "dataloader": _DATALOADER}
#: Stages a compute fault without a ``stage`` slows: all compute, or a layer's compute.
_ALL_COMPUTE = (_ATTENTION, _MLP, _OPTIMIZER)
_LAYER_COMPUTE = (_ATTENTION, _MLP)


@dataclass
class IterationResult:
    """One simulated iteration of every rank.

    ``values[r, k]`` is stage ``k`` (in the simulator's stage order) of rank ``r``
    in ms per occurrence (see :attr:`ClusterSimulator.occurrences`);
    ``iteration_ms[r]`` the rank's whole iteration; ``reporting[r]`` False for a
    silent rank (no point is written); ``time_ms`` the iteration's timestamp
    (its end on the simulated clock, epoch ms).
    """

    iteration: int
    time_ms: int
    values: np.ndarray
    iteration_ms: np.ndarray
    reporting: np.ndarray

    @property
    def job_iteration_ms(self) -> float:
        """The job's iteration time: the slowest rank's."""
        return float(self.iteration_ms.max())


def expected_max_z(n: int) -> float:
    """Expected maximum of ``n`` standard normal samples (Blom's approximation)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def model_stages(topo: Topology) -> StageSet:
    """The stages the model times for ``topo``: the default set, and with tp > 1 the TP
    collectives (``tp_comm``) after the MLP."""
    if topo.tp == 1:
        return DEFAULT_STAGES
    names = DEFAULT_STAGES.names
    cut = names.index("mlp") + 1
    return StageSet(DEFAULT_STAGES.stages[:cut] + (TP_COMM,) + DEFAULT_STAGES.stages[cut:])


def check_stages(stages: StageSet, topo: Topology) -> StageSet:
    """The model times exactly its stages for ``topo`` (:func:`model_stages`, in any order);
    refuse anything else."""
    model = model_stages(topo)
    want = {(s.name, s.kind, s.group) for s in model}
    got = {(s.name, s.kind, s.group) for s in stages}
    if got != want:
        missing = sorted(n for n, *_ in want - got)
        extra = sorted(n for n, *_ in got - want)
        raise SchemaError(
            "the simulator models the default MoE stages only ("
            + ", ".join(model.names) + "); "
            + (f"missing or changed: {', '.join(missing)}; " if missing else "")
            + (f"not modelled: {', '.join(extra)}" if extra else "").rstrip("; ")
        )
    return stages


class ClusterSimulator:
    """Steps a scenario one iteration at a time; deterministic for a given seed.

    ``start_ms`` is the epoch-ms start of the simulated clock: iteration ``i``'s
    timestamp is ``start_ms`` + the job iteration times of iterations 0..i.
    """

    def __init__(self, scenario: Scenario, stages: StageSet | None = None,
                 params: ModelParams | None = None, start_ms: int = 0):
        self.scenario = scenario
        self.stages = check_stages(stages or model_stages(scenario.topology), scenario.topology)
        self.params = params or ModelParams.from_dict(scenario.model)
        self.topology = topo = scenario.topology
        self.start_ms = int(start_ms)
        self.iteration = 0
        self._elapsed_ms = 0.0
        p = self.params
        self.world = w = topo.world
        self.pp_index = topo.pp_index
        self.chunk = topo.dp_index // topo.ep
        self.n_chunks = topo.dp // topo.ep
        self.ep_members = topo.members("ep")
        self.ep_gid = topo.group_ids("ep")
        self.dp_members = topo.members("dp")
        self.dp_gid = topo.group_ids("dp")
        self.edp_members = topo.members("edp")
        self.edp_gid = topo.group_ids("edp")
        self.tp_members = topo.members("tp") if topo.tp > 1 else None
        self.tp_gid = topo.group_ids("tp")
        # a block = the ranks of one chunk at one stage (all tp); rows ordered stage-major
        self.block_id = self.pp_index * self.n_chunks + self.chunk
        self.block_members = np.argsort(self.block_id, kind="stable").reshape(
            topo.pp * self.n_chunks, topo.ep * topo.tp)
        self.has_next = self.pp_index < topo.pp - 1
        nxt = np.flatnonzero(self.has_next)
        self.next_of = nxt.copy()
        self.next_rank = topo.rank_of(topo.tp_index[nxt], self.pp_index[nxt] + 1, topo.dp_index[nxt])
        self.c_ep = expected_max_z(topo.ep)
        self.c_tp = expected_max_z(topo.tp)
        self.c_dp = expected_max_z(topo.dp)
        rng = np.random.default_rng([scenario.seed, 0])
        self.gpu_speed = np.exp(np.clip(rng.standard_normal(w), -3, 3) * p.gpu_speed_sigma)
        self._sig = np.array([p.iteration_sigma, p.iteration_sigma, p.iteration_sigma, p.host_sigma])[:, None]
        self._base = np.array([p.attention_ms, p.mlp_ms, p.optimizer_ms, p.dataloader_ms])[:, None]
        self._faults = [(f, self._rows_of(f)) for f in scenario.faults]
        self._column = np.array([self.stages.names.index(n) for n in model_stages(topo).names])
        self.occurrences = self._occurrences()

    @property
    def elapsed_ms(self) -> float:
        """Simulated time of the iterations stepped so far (sum of job iteration times)."""
        return self._elapsed_ms

    # ----------------------------------------------------------- structure
    def _occurrences(self) -> dict[str, int]:
        lm = self.params.layers_per_stage * self.params.microbatches
        per_layer = {"attention": lm, "mlp": lm, "tp_comm": lm, "dispatch": lm, "combine": lm}
        per_mb = {"pp_send": self.params.microbatches, "pp_recv": self.params.microbatches}
        return {n: per_layer.get(n, per_mb.get(n, 1)) for n in self.stages.names}

    @property
    def occurrence_counts(self) -> np.ndarray:
        """Occurrences per iteration of each stage, in stage order (``values @ counts == iteration_ms``)."""
        return np.array([self.occurrences[n] for n in self.stages.names], dtype=float)

    @property
    def absent_stages(self) -> list[str]:
        """Stages that never happen in this topology: p2p with a single pipeline stage; the expert
        reduce without expert parallelism (ep = 1: expert gradients are reduced with the dense
        ones, over the same DP group) or when every expert has one copy (dp = ep)."""
        topo = self.topology
        absent = ["pp_send", "pp_recv"] if topo.pp == 1 else []
        return absent + (["expert_reduce"] if topo.ep == 1 or topo.group_size("edp") == 1 else [])

    @staticmethod
    def _rows_of(fault: Fault) -> tuple[int, ...]:
        if fault.kind == "silent_rank":
            return ()
        if fault.kind == "link_degradation":
            return (_LINK,)
        if fault.stage is not None:
            return (_ROW_OF_STAGE[fault.stage],)
        return _LAYER_COMPUTE if fault.kind == "stage_imbalance" else _ALL_COMPUTE

    # ----------------------------------------------------------- stepping
    def step(self) -> IterationResult:
        """Simulate the next iteration of every rank."""
        i = self.iteration
        rng = np.random.default_rng([self.scenario.seed, 1, i])
        factor, reporting = self._fault_factors(i)
        link = factor[_LINK] if (factor[_LINK] != 1.0).any() else None   # None: no link slowed
        attn, mlp, opt, load = self._compute(rng.standard_normal((4, self.world)), factor)
        n_ep, n_dp, n_edp = len(self.ep_members), len(self.dp_members), len(self.edp_members)
        tnoise = np.exp(np.clip(rng.standard_normal(n_ep + self.world + 2 * n_dp + n_edp), -3.5, 3.5)
                        * self.params.transfer_sigma)
        a_tp, m_tp, tp_comm = self._tensor_parallel(attn, mlp, i)
        dispatch, combine, work = self._all_to_all(a_tp, m_tp, link, tnoise[:n_ep])
        pp_send, pp_recv, dispatch, arrive = self._pipeline(work, load, dispatch, link,
                                                            tnoise[n_ep:n_ep + self.world])
        iteration_ms, reduce_scatter, expert_reduce, all_gather = self._data_parallel(
            arrive, opt, link, tnoise[n_ep + self.world:])
        cols = (attn, mlp, *(() if self.tp_members is None else (tp_comm,)), dispatch, combine, pp_send, pp_recv, reduce_scatter, expert_reduce, all_gather, opt,
                load)
        values = np.empty((self.world, len(cols)))
        values[:, self._column] = np.column_stack(cols)
        for name in self.absent_stages:
            values[:, self.stages.index(name)] = np.nan
        self._elapsed_ms += float(iteration_ms.max())
        self.iteration += 1
        return IterationResult(i, self.start_ms + int(round(self._elapsed_ms)), values, iteration_ms, reporting)

    def _fault_factors(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Iteration ``i``'s factor per row (attention, mlp, optimizer, dataloader, link) and
        rank, and which ranks report."""
        factor = np.ones((5, self.world))
        reporting = np.ones(self.world, dtype=bool)
        for fault, rows in self._faults:
            if not fault.active(i):
                continue
            if fault.kind == "silent_rank":
                reporting[fault.ranks] = False
            for row in rows:
                factor[row, fault.ranks] *= fault.factor
        moved = swapped_ranks(self.topology, self.scenario.swaps, i)   # on new machines: their faults ended
        factor[:, moved], reporting[moved] = 1.0, True
        self._sporadic(i, factor)
        return factor, reporting

    def _compute(self, z: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """Attention, mlp, optimizer and dataloader of every rank (rows), from the noise ``z``."""
        np.clip(z[:3], -3.5, 3.5, out=z[:3])  # bounded compute noise keeps healthy mlp in its band
        noise = np.exp(z * self._sig)
        base = self._base * noise * factor[:4]
        base[:3] *= self.gpu_speed
        return base

    def _tensor_parallel(self, attn: np.ndarray, mlp: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """TP all-reduces (tp > 1): each layer's attention and MLP end, for every member, when the
        TP group's slowest is done plus the transfers (two all-reduces each, forward and backward).
        Returns when the members leave attention and the MLP (what the EP all-to-alls see) and
        each rank's ``tp_comm`` (its waits for the slowest member and the transfers)."""
        if self.tp_members is None:
            return attn, mlp, np.full(self.world, np.nan)
        p, so = self.params, self.params.occurrence_sigma
        rng = np.random.default_rng([self.scenario.seed, 8, i])
        t = 2 * p.tp_transfer_ms * np.exp(np.clip(rng.standard_normal((2, len(self.tp_members))), -3.5, 3.5)
                                          * p.transfer_sigma)
        out = []
        for k, own in enumerate((attn, mlp)):
            m = own[self.tp_members]
            out.append((m.max(1) + self.c_tp * so * m.mean(1) + t[k])[self.tp_gid])
        return out[0], out[1], (out[0] - attn) + (out[1] - mlp)

    def _all_to_all(self, attn: np.ndarray, mlp: np.ndarray, link: np.ndarray | None,
                    tnoise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """EP all-to-all, per layer and microbatch: dispatch, combine, and each rank's work per
        microbatch (its EP group's layer steps)."""
        p = self.params
        so = p.occurrence_sigma
        a_m = attn[self.ep_members]
        m_m = mlp[self.ep_members]
        a_last = (a_m.max(1) + self.c_ep * so * a_m.mean(1))[self.ep_gid]
        m_last = (m_m.max(1) + self.c_ep * so * m_m.mean(1))[self.ep_gid]
        t_ep = p.ep_transfer_ms * tnoise
        if link is not None:
            t_ep = t_ep * link[self.ep_members].max(1)
        t_ep = t_ep[self.ep_gid]
        fwd = p.forward_share
        wait_a, wait_m = a_last - attn, m_last - mlp
        dispatch = fwd * wait_a + (1 - fwd) * wait_m + 2 * t_ep
        combine = fwd * wait_m + (1 - fwd) * wait_a + 2 * t_ep
        return dispatch, combine, p.layers_per_stage * (a_last + m_last + 4 * t_ep)

    def _pipeline(self, work: np.ndarray, load: np.ndarray, dispatch: np.ndarray, link: np.ndarray | None,
                  tnoise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Pipeline p2p and 1F1B per chunk: pp_send, pp_recv, dispatch with the catching up of the
        first all-to-all added, and when each rank's pipeline has drained."""
        p, topo, w = self.params, self.topology, self.world
        m, layers = p.microbatches, p.layers_per_stage
        # each hop carries one activation forward and one gradient back
        x_out = np.zeros(w)
        hop = 2 * p.pp_transfer_ms * tnoise[:len(self.next_of)]
        if link is not None:
            hop = hop * np.maximum(link[self.next_of], link[self.next_rank])
        x_out[self.next_of] = hop
        x_in = np.zeros(w)
        x_in[self.next_rank] = hop
        unit = work + x_in + x_out
        # the chunk's EP groups lock its pipelines together
        stage_u = unit[self.block_members].max(1).reshape(topo.pp, self.n_chunks)
        period = stage_u.max(0)
        slowest = stage_u.argmax(0)
        makespan = (m - 1) * period + stage_u.sum(0)
        start = load[self.block_members].max(1).reshape(topo.pp, self.n_chunks).max(0)
        u = self.chunk
        my_u = stage_u.reshape(-1)[self.block_id]
        idle = makespan[u] - m * my_u
        steady = (m - 1) * (period[u] - my_u)
        to_send = np.where(self.pp_index < slowest[u], steady, 0.0)
        transfer = (x_in + x_out) / 2
        pp_send = transfer + to_send / m
        pp_recv = transfer + (idle - to_send) / m
        # catching up with the chunk (slower peers, a late data loader) happens in the first all-to-all
        dispatch = dispatch + (my_u - unit) / layers + (start[u] - load) / (layers * m)
        return pp_send, pp_recv, dispatch, start[u] + makespan[u]

    def _data_parallel(self, arrive: np.ndarray, opt: np.ndarray, link: np.ndarray | None,
                       tnoise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """DP reduce-scatter (dense), expert reduce-scatter (EDP), optimizer and all-gather, per
        stage: each rank's iteration_ms, reduce_scatter, expert_reduce and all_gather."""
        p = self.params
        n_dp, n_edp = len(self.dp_members), len(self.edp_members)
        ring = link[self.dp_members].max(1) if link is not None else 1.0
        rs_done = arrive[self.dp_members].max(1) + p.reduce_scatter_ms * ring * tnoise[:n_dp]
        rs_done_r = rs_done[self.dp_gid]
        e_ms = 0.0 if "expert_reduce" in self.absent_stages else p.expert_reduce_ms
        e_ring = link[self.edp_members].max(1) if link is not None else 1.0
        ex_done = rs_done_r[self.edp_members].max(1) + e_ms * e_ring * tnoise[2 * n_dp:2 * n_dp + n_edp]
        ex_done_r = ex_done[self.edp_gid]
        o_m = opt[self.dp_members]
        ag_done = (ex_done_r[self.dp_members].max(1) + o_m.max(1) + self.c_dp * p.occurrence_sigma * o_m.mean(1)
                   + p.all_gather_ms * ring * tnoise[n_dp:2 * n_dp])
        iteration_ms = ag_done[self.dp_gid]
        return iteration_ms, rs_done_r - arrive, ex_done_r - rs_done_r, iteration_ms - ex_done_r - opt

    def run_length_ms(self, iterations: int | None = None) -> float:
        """Simulated duration of the scenario's iterations (a fresh simulator; this one is untouched)."""
        other = ClusterSimulator(self.scenario, self.stages, self.params)
        for _ in range(iterations or self.scenario.iterations):
            other.step()
        return other.elapsed_ms

    def _sporadic(self, i: int, factor: np.ndarray) -> None:
        """Expert load imbalance and sporadic one-rank stalls (own random streams, so a
        scenario without them draws exactly what it drew before they existed)."""
        p = self.params
        if p.expert_load_sigma > 0:
            z = np.random.default_rng([self.scenario.seed, 3, i]).standard_normal(self.world)
            factor[_MLP] *= np.exp(z * p.expert_load_sigma)
        if p.stall_rate > 0:
            rng = np.random.default_rng([self.scenario.seed, 4, i])
            hit = np.flatnonzero(rng.random(self.world) < p.stall_rate)
            factor[_ATTENTION, hit] *= rng.uniform(p.stall_factor_min, p.stall_factor_max, len(hit))

    def frame(self, res: IterationResult, time_ms: int | None = None) -> pd.DataFrame:
        """The ``stage_latency`` frame of the reporting ranks (values rounded to 1 us), with
        the collector shapes of the model: per-rank and per-host clocks, dropped points."""
        p = self.params
        ranks = np.flatnonzero(res.reporting)
        if p.drop_rate > 0:
            keep = np.random.default_rng([self.scenario.seed, 5, res.iteration]).random(len(ranks))
            ranks = ranks[keep >= p.drop_rate]
        values = np.round(res.values[ranks], 3)
        # the model's topology is its placement: one GPU per rank, the rank's local index
        frame = stage_rows(self.scenario.job, ranks, res.iteration,
                           res.time_ms if time_ms is None else int(time_ms),
                           {name: values[:, k] for k, name in enumerate(self.stages.names)},
                           topo=placement_at(self.topology, self.scenario.swaps, res.iteration),
                           iteration_ms=np.round(res.iteration_ms[ranks], 3), gpu=LOCAL_GPU)
        if self.scenario.swaps:   # a swap restarts the job on the new machine (torchrun's restart count)
            frame["attempt"] = sum(res.iteration >= s.at for s in self.scenario.swaps)
        if p.rank_clock_ms > 0 or p.host_clock_ms > 0:
            own = np.random.default_rng([self.scenario.seed, 6, res.iteration]).uniform(
                0, p.rank_clock_ms, len(ranks))
            frame["time"] = frame["time"].to_numpy() + np.round(
                own + self.host_offset_ms[self.topology.node_index[ranks]]).astype(np.int64)
        return frame.drop(columns=self.absent_stages)

    @property
    def host_offset_ms(self) -> np.ndarray:
        """Each host's fixed clock offset (ms, within +-``host_clock_ms``)."""
        if getattr(self, "_host_offset", None) is None:
            rng = np.random.default_rng([self.scenario.seed, 7])
            self._host_offset = rng.uniform(-self.params.host_clock_ms, self.params.host_clock_ms,
                                            self.topology.nodes)
        return self._host_offset
