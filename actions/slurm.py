"""Slurm: nodes read with ``scontrol show node -o``, drained and resumed with ``scontrol update``.

``scontrol`` runs as a subprocess with an argument list, never through a shell, with the
environment it was given (``SLURM_CONF`` selects the cluster, as for every Slurm client) and a
timeout: a controller that does not answer is a :class:`~actions.scheduler.SchedulerError`, not
a hang. A drain is ``scontrol update NodeName=<node> State=DRAIN Reason="rankscope <id>: <class>
..."``; the reason is rankscope's mark on the node, so its undo (``State=RESUME``) is only ever
done on a node that still carries that incident's mark.

Example of the one line per node that ``scontrol show node -o`` prints, as parsed::

    >>> parse_nodes("NodeName=n1 NodeHostName=gpu-a State=IDLE+DRAIN Partitions=gpu "
    ...             "Reason=rankscope cs-30-r5: compute_straggler [root@2026-12-07T10:41:32]")[0]["Reason"]
    'rankscope cs-30-r5: compute_straggler [root@2026-12-07T10:41:32]'
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping

from actions.scheduler import (
    NodeRefused,
    NodeState,
    SchedulerError,
    checked_name,
    drain_reason,
    marker_of,
    short_name,
)
from rankscope.incident import Incident

#: Node states in which Slurm runs no new job on it.
OUT_OF_SERVICE = ("DRAIN", "DOWN", "FAIL", "MAINT", "REBOOT", "POWER_DOWN", "POWERED_DOWN", "FUTURE")
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*)=")


def parse_nodes(text: str) -> list[dict[str, str]]:
    """Each line of ``scontrol show node -o`` as its ``Key=value`` pairs (``Reason`` is the last
    and may hold spaces, as ``OS`` may)."""
    nodes = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("NodeName="):
            continue
        reason = ""
        if " Reason=" in line:
            line, reason = line.split(" Reason=", 1)
        keys = list(_KEY.finditer(line))
        node = {m.group(1): line[m.end():keys[i + 1].start() if i + 1 < len(keys) else len(line)].strip()
                for i, m in enumerate(keys)}
        node["Reason"] = reason.strip()
        nodes.append(node)
    return nodes


class SlurmScheduler:
    """The cluster ``scontrol`` reaches (``SLURM_CONF`` of ``env``, default this process's)."""

    name = "slurm"

    def __init__(self, scontrol: str = "scontrol", timeout_s: float = 20.0, env: Mapping[str, str] | None = None):
        self.scontrol = scontrol
        self.timeout_s = timeout_s
        self.env = dict(os.environ if env is None else env)
        self._nodes: list[dict[str, str]] | None = None

    def _run(self, *args: str) -> str:
        argv = [self.scontrol, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=self.timeout_s,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            raise SchedulerError(f"scontrol {' '.join(args[:2])} did not answer within {self.timeout_s:g} s "
                                 f"(slurmctld hung or unreachable)") from None
        except OSError as exc:
            raise SchedulerError(f"cannot run {self.scontrol}: {exc}") from None
        if done.returncode != 0:
            err = (done.stderr or done.stdout).strip().replace("\n", "; ")[:300]
            raise SchedulerError(f"scontrol {' '.join(args[:2])} failed (exit {done.returncode}): {err}")
        return done.stdout

    def begin_pass(self) -> None:
        """A new actor pass: the node list is read again."""
        self._nodes = None

    def nodes(self, fresh: bool = False) -> list[dict[str, str]]:
        """Every node the controller knows (read once per actor pass unless ``fresh``)."""
        if self._nodes is None or fresh:
            self._nodes = parse_nodes(self._run("show", "node", "-o"))
        return self._nodes

    def resolve(self, host: str, node_map: dict[str, str]) -> str:
        checked_name(host)
        nodes = self.nodes()
        names = {n.get("NodeName", "") for n in nodes}
        if host in names:
            return host
        by_hostname = [n["NodeName"] for n in nodes if n.get("NodeHostName") == host]
        if len(by_hostname) == 1:
            return by_hostname[0]
        if short_name(host) in names:
            return short_name(host)
        mapped = node_map.get(host, node_map.get(short_name(host)))
        if mapped is not None:
            checked_name(mapped, "node map's node")
            if mapped not in names:
                raise NodeRefused(f"[actions.node_map] maps {host} to {mapped!r}, which Slurm does not know "
                                  f"(the node map names nothing; {len(names)} node(s) in the cluster)")
            return mapped
        raise NodeRefused(f"no Slurm node for host {host!r}: not a NodeName, a NodeHostName or its short "
                          f"name, and not in [actions.node_map]")

    def state(self, node: str) -> NodeState:
        checked_name(node, "node")
        found = [n for n in parse_nodes(self._run("show", "node", "-o", node)) if n.get("NodeName") == node]
        if not found:
            raise NodeRefused(f"Slurm does not know node {node!r}")
        n = found[0]
        flags = set(re.split(r"[+*]", n.get("State", "").upper()))
        out = bool(flags & set(OUT_OF_SERVICE))
        reason = n.get("Reason", "")
        return NodeState(node, out, marker_of(reason) if out else "", reason, n.get("State", ""))

    def _argv(self, node: str, incident: Incident) -> list[str]:
        return ["update", f"NodeName={checked_name(node, 'node')}", "State=DRAIN", f"Reason={drain_reason(incident)}"]

    def describe(self, node: str, incident: Incident) -> str:
        nodename, state, reason = self._argv(node, incident)[1:]
        key, _, text = reason.partition("=")
        return f"scontrol update {nodename} {state} {key}=\"{text}\""

    def drain(self, node: str, incident: Incident) -> None:
        self._run(*self._argv(node, incident))

    def resume(self, node: str, incident_id: str) -> None:
        self._run("update", f"NodeName={checked_name(node, 'node')}", "State=RESUME")

    def describe_resume(self, node: str, incident_id: str) -> str:
        return f"scontrol update NodeName={node} State=RESUME"
