"""The HTTP receiver: Alertmanager, Grafana and rankscope's own events into the store.

Endpoints: ``POST /alertmanager``, ``POST /grafana``, ``POST /events`` and ``GET /healthz``.
Standard library ``http.server`` (one thread per connection): webhooks arrive a few per
minute, so a framework would add a dependency and nothing measurable.

Answers (JSON bodies):

- 200 ``{"written": n, "received": n, "refused": []}``: every alert was written;
- 400: the payload, or some of its alerts, could not be used. The usable alerts of the
  same payload ARE written; ``refused`` names each other one by index and reason and
  ``written`` counts the rest. Alertmanager does not retry a 4xx, so a bad alert is not
  re-sent forever (and a re-sent good one rewrites the same point);
- 401 without the bearer token (when one is configured), 404, 405, 411 (no
  Content-Length), 413 (body over the limit);
- 503 when the store refused the write: nothing of the payload was written, and
  Alertmanager retries a 5xx (writes are idempotent: same time and tags, same point).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from events.payloads import (
    DEFAULT_HOST_LABELS,
    Translation,
    from_alertmanager,
    from_grafana,
    from_rankscope,
)
from events.rows import events_frame
from rankscope import schema
from rankscope.lineprotocol import LineProtocolError, check_key
from rankscope.store import Store

log = logging.getLogger(__name__)

#: Environment variable holding the bearer token senders must present (none: no token asked).
TOKEN_ENV = "RANKSCOPE_EVENTS_TOKEN"
DEFAULT_MAX_BODY = 1 << 20
#: Refusals shown in one log line (the HTTP answer lists them all).
LOGGED_REFUSALS = 5


@dataclass(frozen=True)
class ReceiverConfig:
    """How the receiver reads payloads: the host labels, the job it tags events with (None:
    cluster events, matched to jobs by host), the bearer token (kept out of ``repr``) and
    the largest body it reads."""

    host_labels: tuple[str, ...] = DEFAULT_HOST_LABELS
    job: str | None = None
    token: str | None = field(default=None, repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY

    def __post_init__(self) -> None:
        if not self.host_labels or not all(isinstance(h, str) and h for h in self.host_labels):
            raise ValueError("host labels must be a non-empty list of label names")
        if self.job is not None:
            if not self.job:
                raise ValueError("the job name is empty")
            try:
                check_key(self.job, "job")
            except LineProtocolError as exc:
                raise ValueError(str(exc)) from None
        if self.max_body_bytes < 1:
            raise ValueError("the body limit must be positive")


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: status and JSON body."""

    status: int
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()


class EventReceiver:
    """Translates posted payloads into ``event`` points and writes them through ``store``.

    ``handle`` is the whole behaviour (path + body -> :class:`Reply`); :meth:`serve_forever`
    or :meth:`start` put it behind an HTTP server bound to ``address``.
    """

    def __init__(self, store: Store, address: tuple[str, int] = ("127.0.0.1", 9095),
                 config: ReceiverConfig | None = None):
        self.store = store
        self.config = config or ReceiverConfig()
        self._write_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._routes: dict[str, Callable[[object], Translation]] = {
            "/alertmanager": lambda p: from_alertmanager(p, self.config.host_labels),
            "/grafana": lambda p: from_grafana(p, self.config.host_labels),
            "/events": lambda p: from_rankscope(p, int(time.time() * 1000)),
        }
        self.server = ThreadingHTTPServer(address, _handler_for(self))
        self.server.daemon_threads = True

    def __repr__(self) -> str:
        return (f"EventReceiver({self.url}, job={self.config.job!r}, "
                f"token={'required' if self.config.token else 'none'}, store={self.store!r})")

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    @property
    def paths(self) -> Sequence[str]:
        return tuple(self._routes)

    # ------------------------------------------------------------- serving
    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (from another thread) or an interrupt."""
        try:
            self.server.serve_forever(poll_interval=0.5)
        finally:
            self.server.server_close()

    def start(self) -> EventReceiver:
        """Serve in a background thread (tests, embedding); returns self."""
        self._thread = threading.Thread(target=self.server.serve_forever, name="rankscope-events",
                                        daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.server.server_close()

    # ------------------------------------------------------------ handling
    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries the configured bearer token (always,
        when none is configured). Compared in constant time."""
        if not self.config.token:
            return True
        scheme, _, credentials = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode(), self.config.token.encode())

    def handle(self, path: str, body: bytes, peer: str = "-") -> Reply:
        """Translate and write one posted payload; log one line about it."""
        endpoint = path.lstrip("/")
        translate = self._routes.get(path)
        if translate is None:
            return Reply(HTTPStatus.NOT_FOUND,
                         {"error": f"no endpoint {path}; POST to {', '.join(self.paths)}"})
        try:
            payload = json.loads(body)
        except ValueError as exc:  # not JSON, or not UTF-8
            tr = Translation.unusable(f"body is not JSON: {exc}")
        except RecursionError:     # nested deeper than any alert payload
            tr = Translation.unusable("body is nested too deeply to be an alert payload")
        else:
            tr = translate(payload)
        written = 0
        if tr.rows:
            frame = events_frame(tr.rows, self.config.job)
            try:
                with self._write_lock:
                    written = self.store.write_measurement(schema.EVENT, frame).written
            except Exception as exc:  # the store's own errors name no secret
                log.error("%s from %s: %d event(s) NOT written, the store failed: %s",
                          endpoint, peer, len(tr.rows), exc)
                return Reply(HTTPStatus.SERVICE_UNAVAILABLE,
                             {"error": f"the store refused the write: {exc}",
                              "received": tr.received, "written": 0,
                              "refused": [r.to_json() for r in tr.refused]})
        self._log(endpoint, peer, tr, written)
        body_out: dict[str, Any] = {"received": tr.received, "written": written,
                                    "refused": [r.to_json() for r in tr.refused]}
        if tr.truncated:
            body_out["truncated"] = tr.truncated
        if tr.ok:
            return Reply(HTTPStatus.OK, body_out)
        whole = [r for r in tr.refused if r.index is None]
        body_out["error"] = (whole[0].reason if whole else
                             f"{len(tr.refused)} of {tr.received} {_noun(endpoint)} refused; "
                             f"the other {written} written")
        return Reply(HTTPStatus.BAD_REQUEST, body_out)

    def _log(self, endpoint: str, peer: str, tr: Translation, written: int) -> None:
        job = f"job {self.config.job}" if self.config.job else "cluster events"
        line = f"{endpoint} from {peer}: {tr.received} {_noun(endpoint)}, {written} written ({job})"
        if tr.truncated:
            line += f", {tr.truncated} truncated by the sender"
        if tr.refused:
            shown = "; ".join(str(r) for r in tr.refused[:LOGGED_REFUSALS])
            extra = len(tr.refused) - LOGGED_REFUSALS
            more = f" (and {extra} more)" if extra > 0 else ""
            log.warning("%s, %d refused: %s%s", line, len(tr.refused), shown, more)
        else:
            log.info("%s", line)


def _noun(endpoint: str) -> str:
    return "event(s)" if endpoint == "events" else "alert(s)"


class _Handler(BaseHTTPRequestHandler):
    """The HTTP side of an :class:`EventReceiver`: checks a request's method, path, token and
    length, then hands the body to ``receiver.handle``. :func:`_handler_for` binds a receiver."""

    receiver: EventReceiver
    server_version = "rankscope-events"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a silent connection may hold a thread

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(Reply(HTTPStatus.OK, {"status": "ok"}))
        elif path in self.receiver.paths:
            self._send(Reply(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{path} takes POST"},
                             (("Allow", "POST"),)))
        else:
            self._send(Reply(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {path}"}))

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        refusal = self._refusal(path)
        if refusal is not None:
            self._refuse(refusal)
            return
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._send(self.receiver.handle(path, body, self.client_address[0]))

    def _refusal(self, path: str) -> Reply | None:
        """Why a POST to ``path`` is answered without reading its body (None: it is read):
        no such endpoint, no token, no or a bad Content-Length, a body over the limit."""
        if path not in self.receiver.paths:
            return Reply(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {path}; POST to "
                                                         f"{', '.join(self.receiver.paths)}"})
        if not self.receiver.authorized(self.headers.get("Authorization")):
            log.warning("%s from %s: refused, missing or wrong bearer token", path.lstrip("/"),
                        self.client_address[0])
            return Reply(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"},
                         (("WWW-Authenticate", 'Bearer realm="rankscope-events"'),))
        length = self.headers.get("Content-Length")
        if length is None or "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return Reply(HTTPStatus.LENGTH_REQUIRED, {"error": "a Content-Length is required"})
        try:
            size = int(length)
            if size < 0:
                raise ValueError
        except ValueError:
            return Reply(HTTPStatus.BAD_REQUEST, {"error": f"bad Content-Length {length!r}"})
        limit = self.receiver.config.max_body_bytes
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
        data = json.dumps(reply.body).encode()
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
        # the request line (never a header, so never the token), below the payload line
        log.debug("%s %s", self.client_address[0], format % args)


def _handler_for(receiver: EventReceiver) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to ``receiver`` (http.server instantiates it per request)."""
    return type("Handler", (_Handler,), {"receiver": receiver})
