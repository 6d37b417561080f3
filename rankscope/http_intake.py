"""The HTTP side of the endpoints that take posts (the events receiver, the analyzer's stream of
points): a threading server with a deep listen backlog, and the request
checks done before a body is read (path, credentials, content type, length).

Standard library ``http.server``, one thread per connection. What made it drop posts under
load was not the library but two settings: the listen backlog (``request_queue_size``, 5 by
default: a burst of 20 clients overflowed it, and Linux answers an overflow with a dropped
SYN, retried after 1 s, or a reset) and one store write per post, in turn. The server here
listens with a backlog of :data:`LISTEN_BACKLOG`, and the writes are batched
(:mod:`events.write_batcher`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from rankscope.http_credentials import Credentials

log = logging.getLogger(__name__)

#: Connections the kernel queues before the server accepts them (capped by net.core.somaxconn).
LISTEN_BACKLOG = 1024
#: Connections served at once (a thread each); more wait in the listen backlog, so a flood of
#: connections cannot start unbounded threads.
MAX_HANDLERS = 256
#: Media types a POST may carry (parameters such as ``charset`` are allowed).
JSON_TYPES = ("application/json",)


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: status and JSON body."""

    status: int
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()


class Backend(Protocol):
    """What the handler serves: the POST paths, who may post, the body limit, and the
    handling of one body (the events receiver)."""

    @property
    def paths(self) -> Sequence[str]: ...

    @property
    def credentials(self) -> Credentials: ...

    @property
    def max_body_bytes(self) -> int: ...

    #: Media types a POST may carry (None: any; the events receiver takes JSON only).
    media_types: tuple[str, ...] | None

    def handle(self, path: str, body: bytes, peer: str = "-", principal: str = "-", query: str = "") -> Reply: ...


class IntakeHTTPServer(ThreadingHTTPServer):
    """One daemon thread per connection, at most :data:`MAX_HANDLERS` at once, a listen
    backlog of :data:`LISTEN_BACKLOG`."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]):
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()    # all busy: the accept loop waits, new connections queue
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def make_server(address: tuple[str, int], backend: Backend) -> IntakeHTTPServer:
    """A server bound to ``address`` whose requests ``backend`` answers."""
    handler = type("Handler", (RequestHandler,), {"backend": backend})
    return IntakeHTTPServer(address, handler)


def not_found(path: str, paths: Sequence[str]) -> Reply:
    return Reply(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {path}; POST to {', '.join(paths)}"})


class RequestHandler(BaseHTTPRequestHandler):
    """Checks a request's method, path, credentials, content type and length, then hands the
    body to ``backend.handle``. :func:`make_server` binds a backend."""

    backend: Backend
    server_version = "rankscope"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a silent connection may hold a thread

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(Reply(HTTPStatus.OK, {"status": "ok"}))
        elif path in self.backend.paths:
            self._send(Reply(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{path} takes POST"},
                             (("Allow", "POST"),)))
        else:
            self._send(Reply(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {path}"}))

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path not in self.backend.paths:
            self._refuse(not_found(path, self.backend.paths))
            return
        principal = self.backend.credentials.principal(self.headers.get("Authorization"))
        refusal = self._unauthorized(path) if principal is None else self._refusal(path)
        if refusal is not None:
            self._refuse(refusal)
            return
        body = self.rfile.read(int(self.headers["Content-Length"]))
        query = self.path.split("?", 1)[1] if "?" in self.path else ""
        self._send(self.backend.handle(path, body, self.client_address[0], principal or "-", query))

    def _unauthorized(self, path: str) -> Reply:
        creds = self.backend.credentials
        schemes = " or ".join(creds.schemes)
        log.warning("%s from %s: refused, missing or wrong credentials (%s asked)",
                    path.lstrip("/"), self.client_address[0], schemes)
        return Reply(HTTPStatus.UNAUTHORIZED,
                     {"error": f"missing or wrong credentials: send Authorization: {schemes}"},
                     creds.challenge())

    def _refusal(self, path: str) -> Reply | None:
        """Why an authorized POST is answered without reading its body (None: it is read):
        not JSON, no or a bad Content-Length, a body over the limit."""
        ctype = self.headers.get("Content-Type") or ""
        types = getattr(self.backend, "media_types", JSON_TYPES)
        if types is not None and ctype.split(";", 1)[0].strip().lower() not in types:
            return Reply(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                         {"error": f"Content-Type must be {' or '.join(types)}, got {ctype[:100]!r}"})
        length = self.headers.get("Content-Length")
        if length is None or "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return Reply(HTTPStatus.LENGTH_REQUIRED, {"error": "a Content-Length is required"})
        try:
            size = int(length)
            if size < 0:
                raise ValueError
        except ValueError:
            return Reply(HTTPStatus.BAD_REQUEST, {"error": f"bad Content-Length {length[:40]!r}"})
        limit = self.backend.max_body_bytes
        if size > limit:
            log.warning("%s from %s: refused, body of %d bytes is over the limit of %d",
                        path.lstrip("/"), self.client_address[0], size, limit)
            return Reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         {"error": f"body of {size} bytes is over the limit of {limit} bytes"})
        return None

    def _refuse(self, reply: Reply) -> None:
        """Answer without reading the body, then close (the unread body cannot be skipped)."""
        self.close_connection = True
        self._send(reply, close=True)

    def _send(self, reply: Reply, close: bool = False) -> None:
        data = b"" if reply.status == HTTPStatus.NO_CONTENT else json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in reply.headers:
            self.send_header(key, value)
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        # the request line (never a header, so never a credential), below the payload line
        log.debug("%s %s", self.client_address[0], format % args)
