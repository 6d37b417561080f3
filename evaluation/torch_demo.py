"""A real, small ``torch.distributed`` training job, instrumented with the stage timer.

``world`` processes (default 8) on CPU with the gloo backend train a small
MoE-like transformer block (an ``attention`` block and a dense mixture of
experts ``mlp`` block) with DistributedDataParallel, so the gradients really
are all-reduced across the ranks every iteration. Each rank times its stages
with :class:`~collector.stage_timer.StageTimer` and sends one ``stage_latency``
point per iteration to the store through a
:class:`~collector.writer.BackgroundWriter`:

- ``dataloader`` (host): making the batch;
- ``attention``, ``mlp`` (compute): module forward + backward hooks;
- ``reduce_scatter`` (comm, dp): DDP's gradient all-reduce, timed by a DDP
  communication hook from its launch to its completion (an all-reduce is a
  reduce-scatter followed by an all-gather; the schema's DP gradient-sync stage
  is used so the analyzer knows it as a DP collective);
- ``optimizer`` (compute): the SGD step.

From iteration ``slow_from`` on, rank ``slow_rank`` does ``slow_factor`` extra
passes of real expert compute inside its ``mlp`` forward (a degraded device,
not a sleep), spread over the experts' calls, or all in expert ``slow_call``'s call
(one call of a repeated operator slowed): its ``mlp`` stage grows, and the healthy ranks' all-reduce grows
by the time they wait for it.

Every point carries the rank's real machine identity: the ``host`` tag is this
machine's host name (``RANKSCOPE_HOST`` overrides it), the same for all ranks since
they all run here, so by default the topology puts them on one node of ``world``
ranks, which is what the analyzer infers from the host tags too. There is no GPU:
no ``gpu`` tag. ``gpus_per_node`` below ``world`` emulates smaller nodes in the
``node`` tags only (the host tag stays the truth, and the analyzer follows it).

``rankscope torch-demo`` runs it from the command line (``make torch-demo``).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from collector.coordinates import host_name
from rankscope.topology import Topology

#: Stages the demo reports (all from the default stage set).
DEMO_STAGES = ("dataloader", "attention", "mlp", "reduce_scatter", "optimizer")


@dataclass
class DemoConfig:
    """What to run; ``store``/``bucket`` as for every command (URL of InfluxDB or a path)."""

    job: str = "torch-demo"
    store: str | None = None
    bucket: str | None = None
    world: int = 8
    gpus_per_node: int | None = None  # None: all ranks on one node, this machine
    iterations: int = 40
    slow_rank: int | None = 5
    slow_from: int = 15
    slow_factor: int = 600
    slow_call: int | None = None  # an expert's index: all the extra passes in its call alone
    warmup: int = 3
    instrument: bool = True
    profile_dir: str | None = None
    d_model: int = 64
    seq: int = 32
    batch: int = 8
    experts: int = 4
    seed: int = 0
    progress: bool = False  # rank 0 reports its iterations on stderr
    ab_block: int = 0  # > 0: the timer is paused in every other block of this many iterations
    kernel_every: int = 0  # > 0: the kernel channel profiles kernel_active steps of every this many
    kernel_active: int = 2

    def __post_init__(self) -> None:
        if self.world < 1 or self.iterations < 1:
            raise ValueError(f"world ({self.world}) and iterations ({self.iterations}) must be >= 1")
        if self.slow_rank is not None and not 0 <= self.slow_rank < self.world:
            raise ValueError(f"slow rank {self.slow_rank} is outside 0..{self.world - 1}")
        if self.slow_call is not None and not 0 <= self.slow_call < self.experts:
            raise ValueError(f"slow call {self.slow_call} is outside the experts 0..{self.experts - 1}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.world % self.ranks_per_node:
            raise ValueError(f"world {self.world} is not a multiple of gpus_per_node {self.gpus_per_node}")
        if self.kernel_every and (self.profile_dir or not self.instrument):
            raise ValueError("the kernel channel (kernel_every) needs the timer's store and no profile_dir: "
                             "torch.profiler runs once per process")

    @property
    def ranks_per_node(self) -> int:
        """Ranks per node of the topology (the whole world unless emulating smaller nodes)."""
        return self.world if self.gpus_per_node is None else min(self.gpus_per_node, self.world)

    @property
    def topology(self) -> Topology:
        """Pure DP over the world; when it is one node, that node is this machine by name."""
        one_node = self.ranks_per_node == self.world
        return Topology(dp=self.world, gpus_per_node=self.ranks_per_node,
                        hosts=(host_name(),) if one_node else None)


@dataclass
class RankResult:
    """What one rank reports back: its wall step times and its writer's counters."""

    rank: int
    step_s: list[float]
    writer: dict[str, Any] = field(default_factory=dict)
    trace: str | None = None
    instrumented: list[bool] = field(default_factory=list)


@dataclass
class DemoResult:
    config: DemoConfig
    ranks: list[RankResult]
    wall_s: float

    def median_step_s(self, rank: int = 0, skip: int = 3) -> float:
        return statistics.median(self.ranks[rank].step_s[skip:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(cfg: DemoConfig) -> Any:
    """The MoE-like block: token-mixing attention, then a softly routed mixture of experts."""
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, d: int):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v
            return x + self.out(a)

    class MoEMLP(nn.Module):
        def __init__(self, d: int, experts: int):
            super().__init__()
            self.router = nn.Linear(d, experts)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(experts))
            self.degraded_passes = 0  # > 0 emulates a slow device: real extra compute
            self.degraded_call: int | None = None  # one call of the repeated operator takes them all

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gates = torch.softmax(self.router(x), dim=-1)
            out = x
            for e, expert in enumerate(self.experts):
                # the slow device's extra passes, spread over the experts (degraded_passes in all)
                extra = self.degraded_passes // len(self.experts) + (e < self.degraded_passes % len(self.experts))
                if self.degraded_call is not None:
                    extra = self.degraded_passes if e == self.degraded_call else 0
                # one operator as a profiler sees it (a fused expert kernel): the degraded
                # device's extra work falls inside it
                with torch.profiler.record_function("moe.expert_ffn"):
                    out = out + gates[..., e:e + 1] * expert(x)
                    if extra:
                        with torch.no_grad():
                            for _ in range(extra):
                                expert(x)
            return out

    class Block(nn.Module):
        def __init__(self, d: int, experts: int):
            super().__init__()
            # an input projection first, so the timed blocks' inputs need gradients and
            # their full backward hooks see the end of their backward
            self.embed = nn.Linear(d, d)
            self.attention = Attention(d)
            self.mlp = MoEMLP(d, experts)
            self.head = nn.Linear(d, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.mlp(self.attention(self.embed(x)))).mean()

    return Block(cfg.d_model, cfg.experts)


def _worker(rank: int, cfg: DemoConfig, port: int, results: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world)
    try:
        torch.manual_seed(cfg.seed)
        model = build_model(cfg)
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)

        timer = writer = kernels = None
        kernel_writers: list[Any] = []
        if cfg.instrument:
            from collector.coordinates import detect
            from collector.stage_timer import StageTimer
            from collector.writer import open_writer

            # the host tag: this machine's name (RANKSCOPE_HOST overrides it), all ranks alike
            coords, _ = detect(cfg.topology, job=cfg.job)
            for turn in range(cfg.world):
                # one rank after the other: an embedded store's first open switches the
                # SQLite file to WAL, which fails with "database is locked" when raced
                if turn == rank:
                    writer = open_writer(cfg.store, cfg.bucket)
                    kernels, kernel_writers = _kernel_windows(cfg, coords.tags())
                dist.barrier()
            timer = StageTimer(coords, sink=writer.put)
            timer.time_module(model.attention, "attention")
            timer.time_module(model.mlp, "mlp")
            timer.time_ddp_allreduce(ddp, "reduce_scatter")

        def make_batch() -> torch.Tensor:
            return torch.randn(cfg.batch, cfg.seq, cfg.d_model, generator=gen)

        for _ in range(cfg.warmup):  # first iterations allocate and connect: not reported
            ddp(make_batch()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step_s: list[float] = []
        dist.barrier()
        if timer is not None:
            timer.reset()
        prof = trace = None
        if cfg.profile_dir:
            # ProfilerStep#N marks iteration N (step 0 is the profiler's warm-up); with_stack
            # records the "nn.Module: ..." events the trace importer maps to stages.
            from torch.profiler import ProfilerActivity, profile, schedule

            os.makedirs(cfg.profile_dir, exist_ok=True)
            trace = os.path.join(cfg.profile_dir, f"rank{rank}.trace.json")
            prof = profile(activities=[ProfilerActivity.CPU], with_stack=True,
                           schedule=schedule(wait=0, warmup=1, active=max(cfg.iterations - 1, 1)),
                           on_trace_ready=lambda p: p.export_chrome_trace(trace))
            prof.__enter__()
        instrumented: list[bool] = []
        for it in range(cfg.iterations):
            if timer is not None and cfg.ab_block and it and it % cfg.ab_block == 0:
                # A/B blocks: timer detached (hooks removed) in every other block
                (timer.pause if (it // cfg.ab_block) % 2 else timer.resume)()
            t0 = time.perf_counter()
            if rank == cfg.slow_rank and it >= cfg.slow_from:
                model.mlp.degraded_passes = cfg.slow_factor
                model.mlp.degraded_call = cfg.slow_call
            timed = timer is not None and not timer.paused
            if timed:
                with timer.stage("dataloader"):
                    x = make_batch()
            else:
                x = make_batch()
            loss = ddp(x)
            loss.backward()
            if timed:
                with timer.stage("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                timer.step(it)
                if it == 0:
                    # rank 0's first point creates the database and its columns before
                    # the other ranks write (instead of all of them racing to create them)
                    if rank == 0:
                        writer.flush(30)
                    dist.barrier()
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
            if prof is not None:
                prof.step()
            if kernels is not None:
                kernels.step(it)
            step_s.append(time.perf_counter() - t0)
            instrumented.append(timed)
            if cfg.progress and rank == 0 and (it + 1) % 10 == 0:
                print(f"  iteration {it + 1}/{cfg.iterations}: {step_s[-1] * 1000:.0f} ms",
                      file=sys.stderr, flush=True)

        if prof is not None:
            prof.__exit__(None, None, None)
        stats = {}
        if kernels is not None:
            kernels.close()
        for w in kernel_writers:
            w.close()
        if timer is not None and writer is not None:
            timer.close()
            stats = asdict(writer.close())
        results.put(RankResult(rank, step_s, stats, trace, instrumented))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _kernel_windows(cfg: DemoConfig, tags: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The kernel channel of one rank (None when off): torch.profiler windows, their
    ``kernel_stats`` and ``kernel_name`` points through writers of their own (returned too)."""
    if not cfg.kernel_every:
        return None, []
    from collector.kernel_channel import KernelChannel, ProfilerWindows
    from collector.writer import open_writer
    from rankscope import schema

    stats = open_writer(cfg.store, cfg.bucket, measurement=schema.KERNEL_STATS)
    names = open_writer(cfg.store, cfg.bucket, measurement=schema.KERNEL_NAME)
    channel = KernelChannel(tags, sink=stats.put, names_sink=names.put)
    return ProfilerWindows(channel, cfg.kernel_every, cfg.kernel_active, device="cpu"), [stats, names]


def run_demo(cfg: DemoConfig) -> DemoResult:
    """Launch the ``cfg.world`` processes, wait for them, collect their results."""
    import torch.multiprocessing as mp

    # forkserver: torch is imported once by the server, the ranks are forked from it
    # (a fresh interpreter per rank would import torch 8 times on 2 cores).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "pandas", "evaluation.torch_demo"])
    results = ctx.SimpleQueue()
    t0 = time.perf_counter()
    mp.start_processes(_worker, args=(cfg, _free_port(), results), nprocs=cfg.world,
                       join=True, start_method="forkserver")
    out = []
    while not results.empty():
        out.append(results.get())
    if len(out) != cfg.world:
        raise RuntimeError(f"only {len(out)} of {cfg.world} ranks reported back")
    return DemoResult(cfg, sorted(out, key=lambda r: r.rank), time.perf_counter() - t0)


# ----------------------------------------------------------------------- CLI
def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    p = sub.add_parser(
        "torch-demo", help="run a real 8-process torch.distributed (gloo, CPU) job, instrumented",
        description="Train a small MoE-like model with DDP on CPU in WORLD processes (gloo), time "
                    "each rank's stages with the rankscope stage timer and write one stage_latency "
                    "point per rank per iteration to the store. One rank can be made slow in its "
                    "mlp compute from a given iteration (real extra work) to see the diagnosis. "
                    "Needs the torch extra: pip install 'rankscope[torch]'.")
    add_store_options(p)
    p.add_argument("--job", default="torch-demo", help="job name (tag 'job'; default torch-demo)")
    p.add_argument("--world", type=int, default=8, help="number of processes (default 8)")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="ranks per node (default: all, on one node: this machine; fewer emulates "
                        "smaller nodes in the node tags, while the host tag stays this machine's)")
    p.add_argument("--iterations", type=int, default=40, help="training iterations (default 40)")
    p.add_argument("--slow-rank", type=int, default=5, help="rank made slow; -1 for none (default 5)")
    p.add_argument("--slow-from", type=int, default=15, help="first slow iteration (default 15)")
    p.add_argument("--slow-factor", type=int, default=600,
                   help="extra expert passes the slow rank computes in mlp (default 600)")
    p.add_argument("--profile-dir", default=None,
                   help="also record a torch.profiler trace per rank into this folder "
                        "(input for 'rankscope import-trace')")
    p.set_defaults(func=_run_cli)


def _run_cli(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise RuntimeError("torch-demo needs torch: pip install 'rankscope[torch]' "
                           "(or torch==2.13.0 for the CPU build)") from None
    cfg = DemoConfig(job=args.job, store=args.store, bucket=args.bucket, world=args.world,
                     gpus_per_node=args.gpus_per_node, iterations=args.iterations,
                     slow_rank=None if args.slow_rank < 0 else args.slow_rank,
                     slow_from=args.slow_from, slow_factor=args.slow_factor,
                     profile_dir=args.profile_dir, progress=True)
    print(f"torch-demo: {cfg.world} processes x {cfg.iterations} iterations (gloo, CPU)...",
          file=sys.stderr, flush=True)
    res = run_demo(cfg)
    for r in res.ranks:
        w = r.writer
        print(f"rank {r.rank}: median step {statistics.median(r.step_s) * 1000:.1f} ms, "
              f"written {w.get('written', 0)}, dropped {w.get('dropped', 0)}"
              + (f", trace {r.trace}" if r.trace else ""))
    print(f"done in {res.wall_s:.1f} s; job {cfg.job!r}", file=sys.stderr)
    return 0
