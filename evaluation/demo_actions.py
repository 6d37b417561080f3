"""The demo's last act: what rankscope would do about the verdict (a dry-run plan for the culprit
node), then the simulator swaps that node out and the analyzer measures the recovery.

No slurmctld runs for the demo: :class:`SimulatedSlurm` answers the actor's read-only questions
(which nodes exist, whether one is already drained) from the simulated cluster's host names, so
the plan is the very ``scontrol`` command an enforce run would send; it cannot drain anything.
"""

from __future__ import annotations

from collections.abc import Callable

from actions.actor import Actor
from actions.policy import ActionPolicy
from actions.records import ActionRecord
from actions.scheduler import NodeRefused, NodeState, SchedulerError, checked_name
from actions.slurm import SlurmScheduler
from analyzer.service.analyzer_service import AnalyzerService
from rankscope.incident import Incident
from rankscope.store import Store
from rankscope.times import format_time
from simulator.swaps import SPARE_PATTERN, NodeSwap


class SimulatedSlurm(SlurmScheduler):
    """The simulated cluster's nodes, as ``scontrol show node`` would list them (all in service)."""

    def __init__(self, hosts: list[str]):
        super().__init__()
        self.hosts = set(hosts)

    def nodes(self, fresh: bool = False) -> list[dict[str, str]]:
        return [{"NodeName": h, "NodeHostName": h, "State": "ALLOCATED"} for h in sorted(self.hosts)]

    def state(self, node: str) -> NodeState:
        if checked_name(node, "node") not in self.hosts:
            raise NodeRefused(f"Slurm does not know node {node!r}")
        return NodeState(node, False, "", "", "ALLOCATED")

    def drain(self, node: str, incident: Incident) -> None:
        raise SchedulerError("the demo's cluster is simulated: it drains nothing")


def plan(store: Store, hosts: list[str], job: str, now_ms: int) -> list[ActionRecord]:
    """One dry-run pass of the actor on ``job`` under the default policy at ``now_ms`` (the
    simulated clock: the demo's data was made in a few seconds): the plan, stored as ``action``
    points as the service's dry-run would store it."""
    actor = Actor(store, ActionPolicy.from_table({"mode": "dry-run", "settle_s": 0.0}), SimulatedSlurm(hosts),
                  enforce=False, name="rankscope demo", clock=lambda: now_ms / 1000.0)
    return actor.run([job]).actions


def culprit_swaps(incidents: list[Incident], records: list[ActionRecord]) -> list[NodeSwap]:
    """The nodes the plan would drain, each swapped for a spare machine (what an operator does
    once the node is drained)."""
    planned = {r.host for r in records if r.state == "planned"}
    nodes = sorted({n for i in incidents for n, h in zip(i.nodes, i.hosts, strict=False) if h in planned})
    return [NodeSwap(n, 0, SPARE_PATTERN.format(node=n)) for n in nodes]


def describe_plan(records: list[ActionRecord]) -> str:
    if not records:
        return "Action plan (dry-run): nothing to do (no confirmed verdict of a class that names a node)."
    return "\n".join(f"Action plan (dry-run, {r.scheduler}): {r.action} {r.node} for {r.incident}: {r.state}: "
                     f"{r.reason}" for r in records)


def describe_recovery(incidents: list[Incident]) -> str:
    """Each incident's timeline, times to detect and recover, and how the job recovered."""
    lines = []
    for inc in incidents:
        tl = inc.timeline
        when = ", ".join(f"{k} {format_time(v) if v is not None else '-'}" for k, v in tl.items())
        lines.append(f"Timeline of {inc.id}: {when}")
        rec = inc.recovery
        detect = f"{inc.time_to_detect_s:.0f} s" if inc.time_to_detect_s == inc.time_to_detect_s else "-"
        recover = f"{inc.time_to_recover_s:.0f} s" if inc.time_to_recover_s == inc.time_to_recover_s else "not yet"
        after = rec.get("iteration_s_after")
        lines.append(f"Recovery: time to detect {detect}, time to recover {recover}; how: {rec.get('how', '-')}, "
                     f"iteration time after {after if after is not None else '-'} s "
                     f"({'within' if rec.get('within_what_if') else 'not within'} 10% of the what-if "
                     f"{inc.impact.iteration_s_if_restored:.1f} s)")
    return "\n".join(lines)


def act_then_swap(svc: AnalyzerService, store: Store, job: str, hosts: list[str],
                  verdict: Callable[[list[Incident]], str]) -> Callable[[], list[NodeSwap]]:
    """The simulator's pause callback: analyze what is stored, print the ``verdict``, plan, print
    the plan, swap the culprits."""
    def then() -> list[NodeSwap]:
        svc.cycle()
        incidents = svc.incidents(job)
        print("\n\n" + verdict(incidents), flush=True)
        ja = svc.analyzers.get(job)
        records = plan(store, hosts, job, (ja.last_time_ms if ja is not None else 0) + 1_000)
        print("\n" + describe_plan(records), flush=True)
        swaps = culprit_swaps(incidents, records)
        for s in swaps:
            print(f"The operator drains it and the job restarts with node {s.node} on {s.host}.", flush=True)
        return swaps
    return then
