"""L3 on real torch.profiler traces: one call of a repeated operator slowed on one rank.

A real 4-process gloo job (evaluation/torch_demo.py, CPU) whose rank 2 does the work of one of its
four ``moe.expert_ffn`` calls per step 3x or 4x over (2 or 3 extra passes of that expert) from
step 10; its traces imported as ``rankscope import-trace`` does by default (windows of 10 steps).
Each window after the onset is scored by the kernel level twice, side by side on the same points:
by the distance between the operators' distributions alone, and with each operator's time per
step too (:mod:`analyzer.score.kernel_step_totals`). Found: the window names rank 2 in
``moe.expert_ffn``; other findings: those naming other ranks (single windows: a finding needs two
in a row to be confirmed; 4 processes share 2 cores, so a rank the OS starves stands out now and then).
"""

from __future__ import annotations

import contextlib
import glob
import io
import tempfile

from benchmarks.run import BenchContext

FACTORS = (2, 3)
SEEDS = 5
SLOW_RANK, SLOW_FROM, OPERATOR = 2, 10, "moe.expert_ffn"


def _one(seed: int, factor: int) -> dict[str, tuple[int, int, int]]:
    from analyzer.score.kernel_scores import kernel_findings
    from evaluation.torch_demo import DemoConfig, run_demo
    from rankscope import schema
    from rankscope.cli import main
    from rankscope.store import EmbeddedStore
    from rankscope.topology import Topology

    d = tempfile.mkdtemp(prefix="kernel_traces_")
    run_demo(DemoConfig(world=4, iterations=40, instrument=False, profile_dir=d, slow_rank=SLOW_RANK,
                        slow_from=SLOW_FROM, slow_factor=factor, slow_call=1, seed=seed))
    db = f"{d}/s.db"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(["import-trace", *sorted(glob.glob(f"{d}/rank*.json")), "--job", "k", "--store", db])
    with EmbeddedStore(db) as st:
        stats, names_f = st.read(schema.KERNEL_STATS, "k"), st.read(schema.KERNEL_NAME, "k")
    names = {r.kernel: (r.name, r.kind) for r in names_f.itertuples()}
    topo, out = Topology(dp=4, gpus_per_node=4), {}
    windows = sorted(stats["iteration"].unique())[1:]          # those wholly after the onset
    for mode in ("distribution", "both"):
        hit = other = 0
        for it in windows:
            w = stats[stats["iteration"] == it]
            if mode == "distribution":
                w = w[[c for c in w.columns if not c.endswith("_step_us")]]
            f = kernel_findings(w, names, topo)
            hit += bool(((f["rank"] == SLOW_RANK) & (f["name"] == OPERATOR)).any())
            other += int((f["rank"] != SLOW_RANK).sum())
        out[mode] = (hit, other, len(windows))
    return out


def run(ctx: BenchContext) -> str:
    try:
        import torch  # noqa: F401
    except ImportError:
        return "## Kernels (L3) on real traces\n\nNot run: torch is not installed (`make .venv/.torch`)."
    rows = ["| one call slowed | windows | found: distributions only | found: with time per step | "
            "other findings: distributions only | other findings: with time per step |",
            "|---|---|---|---|---|---|"]
    for factor in FACTORS:
        tot = {"distribution": [0, 0, 0], "both": [0, 0, 0]}
        for seed in range(SEEDS):
            for mode, vals in _one(seed, factor).items():
                tot[mode] = [a + b for a, b in zip(tot[mode], vals, strict=True)]
        d, b = tot["distribution"], tot["both"]
        rows.append(f"| x{factor + 1} (1 of 4 calls a step) | {d[2]} | {d[0]} | {b[0]} | {d[1]} | {b[1]} |")
    return "\n".join(["## Kernels (L3) on real traces", "", __doc__.split("\n", 2)[2].strip(), "",
                      f"{SEEDS} runs per factor.", "", *rows])
