"""The HTTP receiver: Alertmanager, Grafana and rankscope's own events into the store.

Endpoints: ``POST /alertmanager``, ``POST /grafana``, ``POST /events`` and ``GET /healthz``,
served by :mod:`rankscope.http_intake` (standard library, a thread per connection, a deep listen
backlog); the rows of concurrent posts are written together (:mod:`events.write_batcher`).

Answers (JSON bodies):

- 200 ``{"written": n, "received": n, "refused": []}``: every alert was written;
- 400: the payload, or some of its alerts, could not be used. The usable alerts of the
  same payload ARE written; ``refused`` names each other one by index and reason and
  ``written`` counts the rest. Alertmanager does not retry a 4xx, so a bad alert is not
  re-sent forever (and a re-sent good one rewrites the same point);
- 401 without the credentials (when some are configured: :mod:`rankscope.http_credentials`), 404, 405,
  411 (no Content-Length), 413 (body over the limit), 415 (not ``application/json``);
- 503 when the store refused the write or too much is waiting to be written: nothing of the
  payload was written, and Alertmanager retries a 5xx (writes are idempotent: same time and
  tags, same point).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from events.payloads import (
    DEFAULT_HOST_LABELS,
    Translation,
    from_alertmanager,
    from_grafana,
    from_rankscope,
)
from events.rows import EventRow, events_frame
from events.write_batcher import Busy, WriteBatcher
from rankscope import schema
from rankscope.http_credentials import ANONYMOUS, Credentials, check_exposure
from rankscope.http_intake import Reply, make_server, not_found
from rankscope.lineprotocol import LineProtocolError, check_key
from rankscope.store import Store

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 1 << 20
#: Refusals shown in one log line (the HTTP answer lists them all).
LOGGED_REFUSALS = 5
#: Most seconds a post waits for the store to take its rows before it is answered 503.
WRITE_WAIT_S = 60.0


@dataclass(frozen=True)
class ReceiverConfig:
    """How the receiver reads payloads: the host labels, the job it tags events with (None:
    cluster events, matched to jobs by host), who may post (a bearer ``token``, a basic-auth
    ``user`` and ``password``: kept out of ``repr``), whether a non-loopback address may go
    without them (``insecure``) and the largest body it reads."""

    host_labels: tuple[str, ...] = DEFAULT_HOST_LABELS
    job: str | None = None
    token: str | None = field(default=None, repr=False)
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    insecure: bool = False
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
        self.credentials   # noqa: B018 - refuses a user without a password now, not per request

    @property
    def credentials(self) -> Credentials:
        return Credentials(token=self.token, user=self.user, password=self.password)


class EventReceiver:
    """Translates posted payloads into ``event`` points and writes them through ``store``.

    ``handle`` is the whole behaviour (path + body -> :class:`Reply`); :meth:`serve_forever`
    or :meth:`start` put it behind an HTTP server bound to ``address``, which must be a loopback
    one unless credentials are configured or ``config.insecure`` says otherwise.
    """

    def __init__(self, store: Store, address: tuple[str, int] = ("127.0.0.1", 9095),
                 config: ReceiverConfig | None = None):
        self.store = store
        self.config = config or ReceiverConfig()
        self.credentials = self.config.credentials
        check_exposure(address[0], self.credentials, self.config.insecure)
        self._thread: threading.Thread | None = None
        self._routes: dict[str, Callable[[object], Translation]] = {
            "/alertmanager": lambda p: from_alertmanager(p, self.config.host_labels),
            "/grafana": lambda p: from_grafana(p, self.config.host_labels),
            "/events": lambda p: from_rankscope(p, int(time.time() * 1000)),
        }
        self.batcher = WriteBatcher(self._write)
        self.server = make_server(address, self)

    def __repr__(self) -> str:
        return (f"EventReceiver({self.url}, job={self.config.job!r}, {self.credentials!r}, "
                f"store={self.store!r})")

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

    @property
    def max_body_bytes(self) -> int:
        return self.config.max_body_bytes

    # ------------------------------------------------------------- serving
    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (from another thread) or an interrupt."""
        try:
            self.server.serve_forever(poll_interval=0.5)
        finally:
            self.server.server_close()
            self.batcher.close()

    def start(self) -> EventReceiver:
        """Serve in a background thread (tests, embedding); returns self."""
        self._thread = threading.Thread(target=self.server.serve_forever, name="rankscope-events",
                                        daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving, write what is waiting and release the port."""
        self.server.shutdown()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.server.server_close()
        self.batcher.close()

    # ------------------------------------------------------------ handling
    def _write(self, rows: Sequence[EventRow]) -> None:
        """The batcher's write: one frame of every waiting post's rows."""
        self.store.write_measurement(schema.EVENT, events_frame(rows, self.config.job))

    media_types = ("application/json",)

    def handle(self, path: str, body: bytes, peer: str = "-", principal: str = ANONYMOUS, query: str = "") -> Reply:
        """Translate and write one posted payload (from ``peer``, who proved to be
        ``principal``; the URL's ``query`` is not used); log one line about it."""
        endpoint = path.lstrip("/")
        translate = self._routes.get(path)
        if translate is None:
            return not_found(path, self.paths)
        try:
            payload = json.loads(body)
        except ValueError as exc:  # not JSON, or not UTF-8
            tr = Translation.unusable(f"body is not JSON: {exc}")
        except RecursionError:     # nested deeper than any alert payload
            tr = Translation.unusable("body is nested too deeply to be an alert payload")
        else:
            tr = translate(payload)
        who = f"{endpoint} from {peer} ({principal})"
        written = 0
        if tr.rows:
            try:
                written = self.batcher.submit(tr.rows).result(WRITE_WAIT_S)
            except Exception as exc:  # noqa: BLE001 - the store's own errors name no secret
                return self._unavailable(who, tr, exc)
        self._log(who, endpoint, tr, written)
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

    def _unavailable(self, who: str, tr: Translation, exc: Exception) -> Reply:
        """503: the store refused the rows, did not answer in time, or too many wait."""
        if isinstance(exc, Busy):
            why = f"the receiver is busy: {exc}"
        elif isinstance(exc, FutureTimeout):
            why = f"the store did not take the write within {WRITE_WAIT_S:g} s"
        else:
            why = f"the store refused the write: {exc}"
        log.error("%s: %d event(s) NOT written, %s", who, len(tr.rows), why)
        return Reply(HTTPStatus.SERVICE_UNAVAILABLE,
                     {"error": why, "received": tr.received, "written": 0,
                      "refused": [r.to_json() for r in tr.refused]},
                     (("Retry-After", "5"),))

    def _log(self, who: str, endpoint: str, tr: Translation, written: int) -> None:
        job = f"job {self.config.job}" if self.config.job else "cluster events"
        line = f"{who}: {tr.received} {_noun(endpoint)}, {written} written ({job})"
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
