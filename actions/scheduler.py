"""What the actor asks of a cluster's scheduler, whichever it is (Slurm, Kubernetes).

A scheduler finds the node a host name stands for (read-only, in a dry-run too, so that a plan
names real nodes), says what state a node is in and whether rankscope marked it (the incident id
in Slurm's drain reason, in the node's ``rankscope.io/incident`` annotation), drains it and
resumes it. Two errors: :class:`NodeRefused` (the request itself is wrong: an unknown node, a
name with shell or scheduler metacharacters, a node map that names nothing; trying again cannot
help) and :class:`SchedulerError` (the scheduler failed or did not answer in time: tried again
later, with backoff).

Names from the store are untrusted (a collector reports its host name): only
:data:`NAME` passes, so no shell, glob, Slurm hostlist (``gpu-[1-4]``) or option text ever
reaches a command line, even as one argument.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from rankscope.incident import Incident

#: A host or node name that may be handed to a scheduler: DNS-like labels, at most 253 characters.
NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")
#: An incident id (``cs-30-r10352``) as it may appear in a reason or an annotation.
INCIDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class NodeRefused(ValueError):
    """The request cannot be made (trying again will not help): the reason says why."""


class SchedulerError(RuntimeError):
    """The scheduler failed or did not answer in time (tried again with backoff)."""


def checked_name(name: str, what: str = "host") -> str:
    """``name`` if a scheduler may be given it, else :class:`NodeRefused` saying why."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        raise NodeRefused(f"{what} name {name!r} refused: only letters, digits, '.', '-' and '_' "
                          f"(no spaces, shell or scheduler metacharacters such as ; | & $ ` [ ] , =)")
    return name


def checked_incident_id(incident_id: str) -> str:
    if not isinstance(incident_id, str) or not INCIDENT_ID.fullmatch(incident_id):
        raise NodeRefused(f"incident id {incident_id!r} refused: only letters, digits, '.', '-' and '_'")
    return incident_id


def short_name(host: str) -> str:
    """The first label of a host name (``gpu-node-01294`` of ``gpu-node-01294.dc1.example.com``)."""
    return host.split(".", 1)[0]


@dataclass(frozen=True)
class NodeState:
    """A node as the scheduler sees it. ``drained``: out of service (drained, draining, down,
    cordoned); ``marker``: the incident id rankscope marked it with ("" when none); ``reason``:
    the scheduler's own words (Slurm's reason, the taints)."""

    name: str
    drained: bool
    marker: str = ""
    reason: str = ""
    state: str = ""


class Scheduler(Protocol):
    """A cluster's scheduler as the actor uses it (:mod:`actions.slurm`, :mod:`actions.kubernetes_nodes`)."""

    name: str

    def begin_pass(self) -> None:
        """A new pass of the actor: forget what was read in the last (node lists)."""

    def resolve(self, host: str, node_map: dict[str, str]) -> str:
        """The node ``host`` stands for: as reported, else its short name, else ``node_map``'s."""

    def state(self, node: str) -> NodeState: ...

    def describe(self, node: str, incident: Incident) -> str:
        """What :meth:`drain` would do, in the scheduler's own terms (a dry-run's plan)."""

    def drain(self, node: str, incident: Incident) -> None: ...

    def resume(self, node: str, incident_id: str) -> None:
        """Undo exactly what :meth:`drain` did for ``incident_id``."""

    def describe_resume(self, node: str, incident_id: str) -> str: ...


def drain_reason(incident: Incident) -> str:
    """``rankscope <id>: <class> ...``: what the node is marked with (the id first, so that the
    mark is found again)."""
    checked_incident_id(incident.id)
    words = [f"rankscope {incident.id}: {incident.cls.value}"]
    if incident.stage and re.fullmatch(r"\w{1,40}", incident.stage):
        words.append(incident.stage)
    if incident.ratio and incident.ratio == incident.ratio:
        words.append(f"{incident.ratio:.1f}x")
    words.append(f"job {incident.job}" if NAME.fullmatch(incident.job) else "")
    return " ".join(w for w in words if w)


def marker_of(reason: str) -> str:
    """The incident id of a ``rankscope <id>: ...`` reason ("" for any other reason)."""
    m = re.match(r"rankscope (" + INCIDENT_ID.pattern + r"):", reason or "")
    return m.group(1) if m else ""
