"""``rankscope act``: act on the verdicts in the store, under the ``[actions]`` policy.

Without ``--enforce`` it plans (asking the scheduler read-only which node each culprit host is)
and changes nothing; with it, it drains (Slurm: ``scontrol update ... State=DRAIN``; Kubernetes:
cordon, taint, annotate), holding the store's lease so that no other actor acts meanwhile.
``--undo INCIDENT_ID`` resumes what it drained for that incident.
"""

from __future__ import annotations

import argparse
import json
import sys

from actions.factory import make_actor
from actions.policy import SCHEDULERS, ActionPolicy
from rankscope.cli import add_store_options
from rankscope.config_file import config_table
from rankscope.store import open_store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "act", help="drain the culprit nodes of confirmed incidents (dry-run unless --enforce)",
        description=__doc__.replace("``", "`"), formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The policy comes from the [actions] table of --config (docs/actions.md): the classes acted "
               "on, the hourly budget (2 drains cluster-wide, 1 node per job by default), the node map, "
               "Alertmanager. Every step is written to the store's action measurement.")
    add_store_options(p)
    p.add_argument("--config", metavar="TOML", help="the settings file; its [actions] table is the policy")
    p.add_argument("--scheduler", choices=SCHEDULERS, default=None,
                   help="the cluster's scheduler (default: [actions] scheduler, else slurm); Slurm through "
                        "scontrol and SLURM_CONF, Kubernetes through kubeconfig or in-cluster")
    p.add_argument("--enforce", action="store_true", help="really drain (default: plan only, change nothing)")
    p.add_argument("--undo", metavar="INCIDENT_ID", help="resume the nodes drained for this incident")
    p.add_argument("--job", action="append", help="only this job's incidents (repeatable; with --undo: the "
                                                  "incident's job, when its id is in several)")
    p.add_argument("--json", action="store_true",
                   help='print {"actions": [{"incident", "job", "node", "action", "state", "reason", "at"}]}')
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    policy = ActionPolicy.from_table(config_table(args.config, "actions"))
    store = open_store(args.store, args.bucket, create=False)
    try:
        actor = make_actor(store, policy, args.enforce, leased=args.enforce,
                           scheduler=None if args.scheduler is None else _scheduler(policy, args.scheduler))
        if args.undo:
            result = actor.undo(args.undo, args.job[0] if args.job and len(args.job) == 1 else None)
        else:
            result = actor.run(args.job)
        if actor.lease is not None and result.held:
            actor.lease.release()
    finally:
        store.close()
    if not result.held:
        print(f"rankscope act: another actor holds the lease ({result.holder}): nothing done; try again "
              f"once it has released it (at most {policy.lease_s:g} s)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    for r in result.actions:
        print(f"[{r.state}] {r.action} {r.node} ({r.job} {r.incident}): {r.reason}")
    if not result.actions:
        print("nothing to act on: no open incident of the classes the policy names "
              f"({', '.join(policy.classes)})")
    if not args.enforce:
        print("(dry-run: nothing was changed; --enforce to act)")
    return 0


def _scheduler(policy: ActionPolicy, name: str):
    from actions.factory import make_scheduler

    return make_scheduler(policy, name)
