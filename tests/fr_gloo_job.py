"""A real torch.distributed gloo job whose Flight Recorder is dumped by torch itself.

``python -m tests.fr_gloo_job DUMP_DIR --world 4 --hosts 2 --iterations 40 --slow-rank 2``:
``world`` processes (forked after one torch import, on this machine's CPU) on a fake layout of
``hosts`` hosts (ranks in blocks, named ``node-a``, ``node-b``, ...). Each iteration every rank
"computes" (sleeps ``--step-ms``; the slow rank ``--factor`` times longer from
``--slow-from`` on), then all-reduces a gradient. Timing is left off, as PyTorch's default,
so the entries carry no duration. At the end each rank writes its Flight Recorder dump
(torch's ``_dump_fr_trace``, the pickle NCCL's watchdog writes) to ``TORCH_FR_DUMP_TEMP_FILE``
+ rank, that variable set as a job script would set it per host:
``<dir>/$(hostname).nccl_trace_rank_``.
"""

from __future__ import annotations

import argparse
import os
import string
import sys
import time


def host_of(rank: int, world: int, hosts: int) -> str:
    return f"node-{string.ascii_lowercase[rank // (world // hosts)]}"


def worker(rank: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace

    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = f"{args.dump_dir}/{host_of(rank, args.world, args.hosts)}.nccl_trace_rank_"
    dist.init_process_group("gloo", init_method=f"file://{args.dump_dir}/.store", rank=rank, world_size=args.world)
    grad = torch.ones(1 << 12)
    for it in range(args.iterations):
        slow = rank == args.slow_rank and it >= args.slow_from
        time.sleep(args.step_ms / 1000.0 * (args.factor if slow else 1.0))
        dist.all_reduce(grad)
    with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as fh:
        fh.write(_dump_fr_trace(includeStackTraces=False))   # symbolising the stacks takes seconds
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dump_dir")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--slow-rank", type=int, default=2)
    p.add_argument("--slow-from", type=int, default=15)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--factor", type=float, default=4.0)
    args = p.parse_args(argv)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")   # Flight Recorder on (0 keeps it off)
    import torch.multiprocessing as mp  # imported once, then forked: one torch import in all

    ctx = mp.start_processes(worker, args=(args,), nprocs=args.world, start_method="fork", join=False)
    while not ctx.join():
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
