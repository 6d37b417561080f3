"""A fake of the Kubernetes core/v1 nodes API, as the real API server answers the calls the actor
makes: ``GET /api/v1/nodes`` (with an equality ``labelSelector``), ``GET`` and ``PATCH
/api/v1/nodes/{name}``. No API server can run here; this one keeps what the real one would:

- every write bumps ``metadata.resourceVersion``; a patch that carries an older one is refused
  with 409 Conflict and the real server's Status (a merge patch may carry it as a precondition,
  and a JSON patch that sets it to a stale value is refused the same way);
- ``application/merge-patch+json`` is RFC 7386 (objects merged, ``null`` deletes, a list replaced
  whole: ``spec.taints`` too); ``application/json-patch+json`` is RFC 6902 (add, remove, replace,
  test; a failed test is 422); any other patch type is 415 (the actor sends neither);
- 404 with a Status for a node it does not have, 401 without the bearer token it was given;
- ``delay_s`` makes every answer slow (a hung server), ``on_patch`` runs before a patch is applied
  (another writer changing the node in between).

``requests`` records (verb, path, content type) of every call: what the RBAC role must allow.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.influx_server import free_port


def node(name: str, hostname: str | None = None, taints: list[dict] | None = None,
         unschedulable: bool = False) -> dict:
    n = {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": hostname or name},
                      "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
         "spec": {"podCIDR": "10.244.0.0/24"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    if taints:
        n["spec"]["taints"] = taints
    if unschedulable:
        n["spec"]["unschedulable"] = True
    return n


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class PatchError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason = code, reason


def _pointer(doc: Any, path: str) -> tuple[Any, str]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc, parts[-1]


def json_patch(doc: Any, ops: list[dict]) -> Any:
    """RFC 6902 (add, remove, replace, test)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        try:
            parent, last = _pointer(doc, op["path"])
            if op["op"] == "test":
                value = parent[int(last)] if isinstance(parent, list) else parent.get(last)
                if value != op["value"]:
                    raise PatchError(422, "Invalid", f"the server rejected our request due to an error in our "
                                                     f"request: testing value {op['path']} failed")
            elif op["op"] in ("add", "replace"):
                if isinstance(parent, list) and op["op"] == "add":
                    parent.insert(len(parent) if last == "-" else int(last), op["value"])
                elif isinstance(parent, list):
                    parent[int(last)] = op["value"]
                else:
                    parent[last] = op["value"]
            elif op["op"] == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            else:
                raise PatchError(422, "Invalid", f"unknown op {op['op']!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise PatchError(422, "Invalid", f"jsonpatch {op.get('op')} operation does not apply: {exc}") from None
    return doc


def status(code: int, reason: str, message: str, name: str = "") -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": {"name": name, "kind": "nodes"}, "code": code}


class FakeKubeAPI:
    """The fake, on a free loopback port (``url``), holding ``nodes`` by name."""

    def __init__(self, nodes: list[dict], token: str = "fake-token") -> None:
        self.token = token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.version = 100
        self.nodes: dict[str, dict] = {}
        for n in nodes:
            self.put(n)
        self.requests: list[tuple[str, str, str]] = []
        self.delay_s = 0.0
        self.on_patch: Callable[[str], None] | None = None      # before a patch is applied
        self.after_patch: Callable[[str], None] | None = None   # after, before it is answered
        self.server: ThreadingHTTPServer | None = None

    def put(self, n: dict) -> None:
        """Store ``n`` as a write would (a new resourceVersion)."""
        with self.lock:
            self.version += 1
            n = copy.deepcopy(n)
            n["metadata"]["resourceVersion"] = str(self.version)
            self.nodes[n["metadata"]["name"]] = n

    def get(self, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def kubeconfig(self, path) -> str:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "actor", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "actor"}}]}))
        return str(path)

    def patch(self, name: str, content_type: str, body: Any) -> tuple[int, dict]:
        if self.on_patch is not None:
            self.on_patch(name)
        with self.lock:
            current = self.nodes.get(name)
            if current is None:
                return 404, status(404, "NotFound", f'nodes "{name}" not found', name)
            try:
                if content_type == "application/merge-patch+json":
                    new = merge_patch(current, body)
                elif content_type == "application/json-patch+json":
                    new = json_patch(current, body)
                else:
                    return 415, status(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                                                                    "format - accepted media types include: "
                                                                    "application/json-patch+json, "
                                                                    "application/merge-patch+json", name)
            except PatchError as exc:
                return exc.code, status(exc.code, exc.reason, str(exc), name)
            sent = (new.get("metadata") or {}).get("resourceVersion")
            if sent is not None and sent != current["metadata"]["resourceVersion"]:
                return 409, status(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object '
                                                    f'has been modified; please apply your changes to the latest '
                                                    f'version and try again', name)
            self.version += 1
            new["metadata"]["resourceVersion"] = str(self.version)
            new["metadata"]["name"] = name
            self.nodes[name] = new
            return 200, copy.deepcopy(new)

    def listing(self, query: dict[str, list[str]]) -> dict:
        selector = (query.get("labelSelector") or [""])[0]
        wanted = dict(p.replace("==", "=").split("=", 1) for p in selector.split(",") if p)
        with self.lock:
            items = [copy.deepcopy(n) for n in self.nodes.values()
                     if all(n["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
        return {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.version)},
                "items": items}

    def start(self) -> FakeKubeAPI:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _handler(api: FakeKubeAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _route(self, verb: str) -> tuple[str, dict] | None:
            url = urllib.parse.urlsplit(self.path)
            api.requests.append((verb, url.path, self.headers.get("Content-Type", "")))
            time.sleep(api.delay_s)
            if self.headers.get("Authorization") != f"Bearer {api.token}":
                self._answer(401, status(401, "Unauthorized", "Unauthorized"))
                return None
            return url.path, urllib.parse.parse_qs(url.query)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            routed = self._route("GET")
            if routed is None:
                return
            path, query = routed
            if path == "/api/v1/nodes":
                return self._answer(200, api.listing(query))
            name = path.removeprefix("/api/v1/nodes/")
            with api.lock:
                n = copy.deepcopy(api.nodes.get(name))
            if path.startswith("/api/v1/nodes/") and n is not None:
                return self._answer(200, n)
            self._answer(404, status(404, "NotFound", f'nodes "{name}" not found', name))

        def do_PATCH(self) -> None:  # noqa: N802
            routed = self._route("PATCH")
            if routed is None:
                return
            path, _ = routed
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
            name = path.removeprefix("/api/v1/nodes/")
            code, answer = api.patch(name, self.headers.get("Content-Type", ""), body)
            if api.after_patch is not None:
                api.after_patch(name)
            self._answer(code, answer)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
