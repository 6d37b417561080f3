"""``rankscope simulate`` (run a scenario into the store) and ``rankscope scenarios`` (list built-ins)."""

from __future__ import annotations

import argparse
import json
import sys

from rankscope.store import open_store
from simulator.scenario import builtin_scenarios, load_scenario
from simulator.simulate import default_truth_path, simulate


def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    p = sub.add_parser(
        "simulate", help="simulate a training job and write its per-rank latencies",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Simulate a hybrid-parallel (TP/PP/DP/EP) training job iteration by iteration and write\n"
            "one stage_latency point per rank per iteration (and the scenario's out-of-band events)\n"
            "to the store. Slowness travels as on a real cluster: collectives wait for their last\n"
            "member, a slow pipeline stage leaves bubbles, the DP sync spreads delays to everyone.\n\n"
            "Backfill (default) writes as fast as the store takes it, with timestamps spaced by the\n"
            "simulated iteration times and ending now; --live writes each iteration when its\n"
            "(scaled) time has passed, stamped now. The ground truth (culprit ranks, nodes, kind,\n"
            "onset, end) goes to --truth, by default <job>.truth.json next to an embedded store's\n"
            "file or, for InfluxDB, in the current directory (a job name that is not a plain file\n"
            "name, such as ../x, gets a safe file name in that folder). See docs/simulator.md."),
        epilog="examples:\n  rankscope simulate il-0477 --store http://127.0.0.1:8086\n"
               "  rankscope simulate my-scenario.toml --iterations 20 --truth out/truth.json\n"
               "  rankscope simulate healthy --live --speed 10",
    )
    p.add_argument("scenario", metavar="SCENARIO",
                   help="a built-in scenario name (see `rankscope scenarios`) or the path of a scenario TOML file")
    add_store_options(p)
    p.add_argument("--iterations", type=int, metavar="N", help="number of iterations (default: the scenario's)")
    p.add_argument("--seed", type=int, metavar="S", help="random seed (default: the scenario's)")
    p.add_argument("--job", metavar="NAME", help="job name to write (default: the scenario's)")
    p.add_argument("--live", action="store_true", help="pace writes in real time, timestamps = now")
    p.add_argument("--speed", type=float, default=1.0, metavar="X",
                   help="with --live: run X times faster than the simulated job (default 1)")
    p.add_argument("--truth", metavar="PATH", help="where to write the ground-truth JSON")
    p.add_argument("--start-ms", type=int, metavar="MS",
                   help="backfill: epoch-ms start of the simulated clock (default: end at now)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_simulate)

    s = sub.add_parser("scenarios", help="list the built-in simulation scenarios",
                       description="List the built-in scenarios with their size, faults and description.")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=run_scenarios)


def _check_args(args: argparse.Namespace) -> None:
    if args.iterations is not None and args.iterations < 1:
        raise ValueError(f"--iterations must be >= 1, got {args.iterations}")
    if args.seed is not None and args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if not args.speed > 0:
        raise ValueError(f"--speed must be > 0, got {args.speed}")
    if args.speed != 1.0 and not args.live:
        raise ValueError("--speed only applies with --live")
    if args.live and args.start_ms is not None:
        raise ValueError("--start-ms only applies to backfill (--live stamps points with the current time)")


def run_simulate(args: argparse.Namespace) -> int:
    _check_args(args)
    scenario = load_scenario(args.scenario).with_overrides(
        iterations=args.iterations, seed=args.seed, job=args.job)
    with open_store(args.store, args.bucket) as store:
        truth_path = args.truth or default_truth_path(store, scenario.job)
        mode = f"live x{args.speed:g}" if args.live else "backfill"
        print(f"simulating {scenario.name or args.scenario!r}: job {scenario.job}, "
              f"{scenario.topology.world} ranks, {scenario.iterations} iterations ({mode}) -> {store!r}",
              file=sys.stderr)
        truth = simulate(scenario, store, live=args.live, speed=args.speed, truth_path=truth_path,
                         start_ms=args.start_ms, progress=not args.quiet)
    print(f"wrote {len(truth.times_ms)} iterations of job {truth.job} "
          f"({scenario.topology.world} ranks, {len(truth.faults)} fault(s), {len(truth.events)} event(s)); "
          f"ground truth: {truth_path}")
    return 0


def run_scenarios(args: argparse.Namespace) -> int:
    rows = []
    for name, path in builtin_scenarios().items():
        sc = load_scenario(path)
        rows.append({
            "name": name, "ranks": sc.topology.world, "iterations": sc.iterations,
            "faults": [f"{f.kind}@{f.start}" for f in sc.faults], "description": sc.description,
            "path": str(path),
        })
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    width = max((len(r["name"]) for r in rows), default=4)
    for r in rows:
        faults = ", ".join(r["faults"]) or "no faults"
        print(f"{r['name']:<{width}}  {r['ranks']:>6} ranks  {r['iterations']:>3} it  {faults}")
        if r["description"]:
            print(f"{'':<{width}}  {r['description']}")
    return 0
