"""The actor put together from the ``[actions]`` policy: its scheduler, its lease, its alerts."""

from __future__ import annotations

import time
from collections.abc import Callable

from actions.actor import Actor, identity
from actions.lease import StoreLease
from actions.policy import ActionPolicy
from actions.scheduler import Scheduler
from actions.slurm import SlurmScheduler
from rankscope.store import Store


def make_scheduler(policy: ActionPolicy, scheduler: str | None = None) -> Scheduler:
    """The scheduler ``scheduler`` (default the policy's): Slurm through ``scontrol`` (``SLURM_CONF``
    from the environment), or Kubernetes through its API (kubeconfig or in-cluster)."""
    which = scheduler or policy.scheduler
    if which == "slurm":
        return SlurmScheduler(policy.scontrol, policy.timeout_s)
    if which == "kubernetes":
        from actions.kubernetes_nodes import KubernetesScheduler

        return KubernetesScheduler.from_config(policy.kubeconfig or None, policy.kube_context or None,
                                               timeout_s=policy.timeout_s)
    raise ValueError(f"scheduler {which!r}: must be slurm or kubernetes")


def make_actor(store: Store, policy: ActionPolicy, enforce: bool, leased: bool, scheduler: Scheduler | None = None,
               clock: Callable[[], float] = time.time, name: str | None = None) -> Actor:
    """An actor on ``store``; ``leased``: it acts only while it holds the store's lease."""
    name = name or identity()
    lease = StoreLease(store, name, policy.lease_s, policy.settle_s, clock=clock) if leased else None
    return Actor(store, policy, scheduler or make_scheduler(policy), enforce=enforce, clock=clock, name=name,
                 lease=lease)
