"""``rankscope demo``: IL-0477 at full scale, simulated, analyzed and explained in about a minute.

On the embedded store by default (``.rankscope/demo.db``, made afresh), or on
InfluxDB when ``--store``/``RANKSCOPE_STORE`` is a URL: simulates the incident
(12,960 ranks, the mlp of one node 5.7x slower from iteration 30, a misleading
"server port down" event), runs one analyzer cycle over it, prints what L1 saw,
what L2 localised, the verdict and why the port-down event is not the cause,
what the culprit GPUs' own telemetry says (the ``gpu_health`` the simulator writes; also DCGM in the
Prometheus of ``RANKSCOPE_PROMETHEUS_URL`` where set), and writes the incident report. Then it plans,
as a dry-run, what rankscope would do (drain the culprit node: the scontrol command), swaps that node
for a spare, simulates on, and prints the recovery: the incident's timeline, time to detect, time to
recover and how it recovered.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from analyzer.service.analyzer_service import AnalyzerService
from analyzer.service.hardware_config import hardware_settings
from analyzer.service.hardware_evidence import hardware_evidence
from evaluation.demo_actions import act_then_swap, describe_recovery
from rankscope.config import store_settings
from rankscope.store import open_store
from rankscope.topology import format_ranks

DEMO_STORE = ".rankscope/demo.db"
#: Iterations simulated after the scenario's end, the culprit node swapped for a spare.
AFTER_SWAP = 30


def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    p = sub.add_parser("demo", help="simulate IL-0477 at 12,960 ranks, analyze it, print the verdict",
                       description=__doc__.replace("``", "`"),
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=f"Without --store (and RANKSCOPE_STORE) the demo writes to {DEMO_STORE}, made "
                              f"afresh; explore it afterwards with --store {DEMO_STORE}.")
    add_store_options(p, default_store=DEMO_STORE)
    p.add_argument("--scenario", default="il-0477", help="built-in scenario or TOML file (default il-0477)")
    p.add_argument("--report", default="out/report", metavar="DIR",
                   help="where to write the incident report (default out/report)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simulator.scenario import load_scenario
    from simulator.simulate import Pause, simulate

    explicit = args.store or os.environ.get("RANKSCOPE_STORE")
    settings = store_settings(args.store or DEMO_STORE, args.bucket)
    if not settings.is_influx and not explicit:
        for suffix in ("", "-wal", "-shm"):
            Path(DEMO_STORE + suffix).unlink(missing_ok=True)
    scenario = load_scenario(args.scenario)
    store = open_store(settings=settings)
    topo = scenario.topology
    print(f"rankscope demo: {scenario.job}: {topo.world:,} ranks (tp={topo.tp} pp={topo.pp} dp={topo.dp} "
          f"ep={topo.ep}, {topo.gpus_per_node} GPUs/node), {scenario.iterations} iterations -> {store!r}")
    t0 = time.perf_counter()
    evidence = hardware_evidence(store, hardware_settings({}, os.environ), os.environ)
    svc = AnalyzerService(store, progress=True, jobs=[scenario.job], evidence=[evidence])
    hosts = list(topo.hosts or [])
    verdict = act_then_swap(svc, store, scenario.job, hosts, lambda incs: summary(svc.analyzers.get(scenario.job), incs))
    last = scenario.iterations - 1                 # the scenario as written, then AFTER_SWAP iterations more
    simulate(scenario.with_overrides(iterations=scenario.iterations + AFTER_SWAP), store, progress=True,
             pause=Pause(last, verdict))
    t1 = time.perf_counter()
    svc.cycle(final=True)
    t2 = time.perf_counter()
    incidents = svc.incidents(scenario.job)
    print(f"\nsimulated and analyzed in {t1 - t0:.0f} s, the rest analyzed in {t2 - t1:.0f} s\n")
    if incidents:
        from dashboards.report import write_report

        path = write_report(store, scenario.job, Path(args.report))
        print(f"\nIncident report: {path}")
    if not settings.is_influx:
        print(f"Explore it: rankscope analyze --once --store {settings.location}; "
              f"rankscope report --latest --store {settings.location} --out out/report")
    print("\n" + (describe_recovery(incidents) if incidents else "No incident: nothing to recover from."))
    store.close()
    return 0


def summary(ja, incidents) -> str:
    """What L1 saw, what L2 localised, the verdict, and the events' verdicts, in words."""
    lines = []
    steps = ja.l1.open_steps if ja is not None else []
    l1 = next((i.evidence.get("l1") for i in incidents if i.evidence.get("l1")), None)
    if l1:
        lines.append(f"L1 (iteration time): a step at iteration {l1['iteration']}: "
                     f"{l1['before_ms'] / 1000:.1f} s -> {l1['after_ms'] / 1000:.1f} s "
                     f"({l1['after_ms'] / l1['before_ms']:.1f}x). Every rank slowed: collectives everywhere "
                     f"look slow, which is why it looks like the network.")
    elif not steps:
        lines.append("L1 (iteration time): no step.")
    if not incidents:
        lines.append("No incident: the job is healthy.")
        return "\n".join(lines)
    for inc in incidents:
        ev = inc.evidence
        g = ev.get("group", {})
        lines.append(f"L2 (inside parallel groups): {ev.get('summary', inc.title)}")
        lines.append(f"Verdict: {inc.cls.label} on {inc.where} (ranks {format_ranks(inc.ranks)}, "
                     f"node {format_ranks(inc.nodes)}), stage {inc.stage}, {inc.ratio:.1f}x, localised by "
                     f"{(g.get('type') or '?').upper()} group {g.get('ranks', '')} [{inc.status}].")
        if inc.cost:
            lines.append(inc.cost)
        if inc.hardware.get("verdict"):
            lines.append(f"Hardware ({inc.hardware['verdict']}): {inc.hardware.get('summary', '')}")
        lines.append(f"Title: {inc.title}")
        lines.append(f"Action: {inc.action}")
        lines += [e.sentence for e in inc.events]
    return "\n".join(lines)
