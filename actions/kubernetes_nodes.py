"""Kubernetes: the culprit node cordoned, tainted and annotated through the API, with the official
``kubernetes`` client (kubeconfig, or the pod's service account in a cluster).

A drain sets three things and its undo removes exactly those three: ``spec.unschedulable``
(cordon), the taint ``rankscope.io/fail-slow=<class>:NoSchedule`` and the annotation
``rankscope.io/incident=<id>`` (rankscope's mark: a node cordoned without it is someone else's).
A JSON merge patch replaces ``spec.taints`` whole, so the node is read, its taints modified
(every other taint kept) and written back with the ``resourceVersion`` it was read at: the API
server refuses a stale one (409) and the whole read-modify-write is done again. Only ``get``,
``list`` and ``patch`` on nodes are used (deploy/kubernetes/actor-rbac.yaml grants no more). The
node is found by its name, then by the label ``kubernetes.io/hostname``, then by the short name,
then through ``[actions.node_map]``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from actions.scheduler import (
    NodeRefused,
    NodeState,
    SchedulerError,
    checked_incident_id,
    checked_name,
    short_name,
)
from rankscope.incident import Incident

TAINT_KEY = "rankscope.io/fail-slow"
ANNOTATION = "rankscope.io/incident"
HOSTNAME_LABEL = "kubernetes.io/hostname"
MERGE_PATCH = "application/merge-patch+json"
#: Read-modify-write rounds before a node that keeps changing is given up (tried again later).
CONFLICT_ROUNDS = 5
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


class KubernetesScheduler:
    """Nodes of the cluster ``api`` (a ``kubernetes.client.CoreV1Api``) reaches."""

    name = "kubernetes"

    def __init__(self, api: Any, timeout_s: float = 20.0):
        self.api, self.timeout_s = api, timeout_s

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None,
                    timeout_s: float = 20.0) -> KubernetesScheduler:
        """From ``kubeconfig`` (or ``KUBECONFIG``, ``~/.kube/config``); in a pod (no kubeconfig given,
        ``KUBERNETES_SERVICE_HOST`` set) from its service account."""
        try:
            from kubernetes import client, config
        except ImportError as exc:
            raise SchedulerError("the kubernetes scheduler needs the official client: pip install "
                                 "'rankscope[kubernetes]'") from exc
        cfg = client.Configuration()
        try:
            if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(client_configuration=cfg)
            else:
                config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        except (config.ConfigException, OSError, ValueError, TypeError) as exc:
            raise SchedulerError(f"cannot load the Kubernetes configuration: {exc}") from exc
        cfg.retries = 0   # one try per request, bounded by timeout_s; the actor retries with backoff
        return cls(client.CoreV1Api(client.ApiClient(cfg)), timeout_s)

    def begin_pass(self) -> None:
        """A new actor pass (every request reads the node afresh: nothing to forget)."""

    # ---------------------------------------------------------------- requests
    def _call(self, what: str, fn, *args, **kwargs) -> dict | None:
        """One API request's JSON; None on 404; SchedulerError on any other failure."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout_s, **kwargs)
            return json.loads(resp.data or b"{}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise _Conflict(what) from None
            message = _status_message(exc.body) or exc.reason
            raise SchedulerError(f"Kubernetes API: {what} answered {exc.status} {message}") from None
        except Exception as exc:  # noqa: BLE001 - urllib3's timeouts and connection errors
            raise SchedulerError(f"Kubernetes API: {what} failed: {type(exc).__name__}: {exc}") from None

    def _node(self, name: str) -> dict | None:
        return self._call(f"get node {name}", self.api.read_node, name)

    def _by_label(self, host: str) -> list[str]:
        if not _LABEL_VALUE.fullmatch(host):
            return []
        found = self._call(f"list nodes {HOSTNAME_LABEL}={host}", self.api.list_node,
                           label_selector=f"{HOSTNAME_LABEL}={host}") or {}
        return [n["metadata"]["name"] for n in found.get("items", [])]

    # ---------------------------------------------------------------- the protocol
    def resolve(self, host: str, node_map: dict[str, str]) -> str:
        checked_name(host)
        for name in dict.fromkeys([host, short_name(host)]):
            if self._node(name) is not None:
                return name
            labelled = self._by_label(name)
            if len(labelled) == 1:
                return labelled[0]
        mapped = node_map.get(host, node_map.get(short_name(host)))
        if mapped is not None:
            checked_name(mapped, "node map's node")
            if self._node(mapped) is None:
                raise NodeRefused(f"[actions.node_map] maps {host} to {mapped!r}, which the cluster does not "
                                  f"have (the node map names nothing)")
            return mapped
        raise NodeRefused(f"no Kubernetes node for host {host!r}: no node of that name or short name, none "
                          f"labelled {HOSTNAME_LABEL}={host}, and not in [actions.node_map]")

    def state(self, node: str) -> NodeState:
        n = self._node(checked_name(node, "node"))
        if n is None:
            raise NodeRefused(f"the cluster has no node {node!r}")
        cordoned = bool(n.get("spec", {}).get("unschedulable"))
        mark = (n.get("metadata", {}).get("annotations") or {}).get(ANNOTATION, "")
        taints = [f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in n.get("spec", {}).get("taints") or []]
        return NodeState(node, cordoned, mark if cordoned else "", f"taints [{', '.join(taints)}]"
                         + (f", annotation {ANNOTATION}={mark}" if mark else ""),
                         "cordoned" if cordoned else "schedulable")

    def describe(self, node: str, incident: Incident) -> str:
        return (f"cordon {node} (spec.unschedulable=true), taint {TAINT_KEY}={incident.cls.value}:NoSchedule, "
                f"annotate {ANNOTATION}={incident.id}")

    def describe_resume(self, node: str, incident_id: str) -> str:
        return f"uncordon {node}, remove the taint {TAINT_KEY} and the annotation {ANNOTATION}={incident_id}"

    def drain(self, node: str, incident: Incident) -> None:
        checked_incident_id(incident.id)
        taint = {"key": TAINT_KEY, "value": incident.cls.value, "effect": "NoSchedule"}
        self._rewrite(node, lambda taints: [*taints, taint], {ANNOTATION: incident.id}, True)

    def resume(self, node: str, incident_id: str) -> None:
        current = self._node(checked_name(node, "node")) or {}
        if (current.get("metadata", {}).get("annotations") or {}).get(ANNOTATION) != incident_id:
            raise NodeRefused(f"node {node} does not carry {ANNOTATION}={incident_id}: not rankscope's to undo")
        self._rewrite(node, lambda taints: taints, {ANNOTATION: None}, None)

    def _rewrite(self, node: str, taints_of, annotations: dict, unschedulable: bool | None) -> None:
        """Read the node, change its taints (ours taken out first) and write it back at the
        ``resourceVersion`` read, again on a conflict."""
        checked_name(node, "node")
        for _ in range(CONFLICT_ROUNDS):
            current = self._node(node)
            if current is None:
                raise NodeRefused(f"the cluster has no node {node!r}")
            others = [t for t in current.get("spec", {}).get("taints") or [] if t.get("key") != TAINT_KEY]
            taints = taints_of(others)
            body = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"],
                                 "annotations": annotations},
                    "spec": {"unschedulable": unschedulable, "taints": taints or None}}
            try:
                self._call(f"patch node {node}", self.api.patch_node, node, body, _content_type=MERGE_PATCH)
                return
            except _Conflict:
                continue
        raise SchedulerError(f"node {node} changed under every one of {CONFLICT_ROUNDS} read-modify-writes "
                             f"(409 Conflict each time)")


class _Conflict(Exception):
    """The node changed since it was read (409): read and write it again."""


def _status_message(body: Any) -> str:
    try:
        return str(json.loads(body).get("message", ""))[:300]
    except (TypeError, ValueError, AttributeError):
        return ""
