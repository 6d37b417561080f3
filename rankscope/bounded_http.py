"""One bounded HTTP GET for the servers rankscope asks questions of at run time (Prometheus'
query API, InfluxDB's ``/query`` of another database): a total time limit, a byte limit on the
answer, credentials from the environment that never reach a log or a ``repr``.

Every answer is data from the network: the body is read in chunks and refused past
``max_bytes`` (a ``Content-Length`` over it is refused before reading), and a server that
dribbles is cut once ``timeout_s`` has passed in all, not per chunk. Each failure is an
:class:`HttpFailure` whose ``kind`` says what went wrong (``timeout``, ``status``, ``too_large``,
``unreachable``) and whose text names the server and never a credential.

Credentials: :func:`auth_from_env` reads ``<PREFIX>_TOKEN`` (``Authorization: Bearer``) or
``<PREFIX>_USERNAME`` and ``<PREFIX>_PASSWORD`` (basic auth), e.g. ``RANKSCOPE_PROMETHEUS_TOKEN``.

Example::

    >>> auth_from_env("RANKSCOPE_PROMETHEUS", {"RANKSCOPE_PROMETHEUS_TOKEN": "s3cret"})
    HttpAuth(bearer token)
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_CHUNK = 1 << 16


class HttpFailure(RuntimeError):
    """A GET that gave no usable answer; ``kind``: timeout, status, too_large, unreachable."""

    def __init__(self, message: str, kind: str, status: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass(frozen=True)
class HttpAuth:
    """A bearer token or a basic-auth pair (kept out of ``repr``)."""

    token: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def headers(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.user is not None:
            pair = f"{self.user}:{self.password or ''}".encode()
            return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
        return {}

    def __repr__(self) -> str:
        what = "bearer token" if self.token else f"basic auth as {self.user!r}" if self.user is not None else "none"
        return f"HttpAuth({what})"


def auth_from_env(prefix: str, env: Mapping[str, str]) -> HttpAuth:
    """``<prefix>_TOKEN``, else ``<prefix>_USERNAME`` / ``<prefix>_PASSWORD``; ValueError when a
    password comes without its user name."""
    token = env.get(f"{prefix}_TOKEN") or None
    user, password = env.get(f"{prefix}_USERNAME") or None, env.get(f"{prefix}_PASSWORD") or None
    if password is not None and user is None:
        raise ValueError(f"{prefix}_PASSWORD is set without {prefix}_USERNAME")
    return HttpAuth(token=token, user=None if token else user, password=None if token else password)


def _opener(url: str) -> urllib.request.OpenerDirector:
    host = urllib.parse.urlsplit(url).hostname
    return urllib.request.build_opener(urllib.request.ProxyHandler({} if host in _LOOPBACK else None))


def bounded_get(url: str, params: Mapping[str, str], *, timeout_s: float, max_bytes: int,
                auth: HttpAuth | None = None, headers: Mapping[str, str] | None = None) -> bytes:
    """The body of ``GET url?params`` within ``timeout_s`` in all and ``max_bytes``."""
    base = url.split("?", 1)[0]
    req = urllib.request.Request(f"{url}?{urllib.parse.urlencode(params)}",
                                 headers={**(auth.headers() if auth else {}), **(headers or {})})
    t0 = time.monotonic()
    try:
        with _opener(url).open(req, timeout=timeout_s) as resp:
            length = resp.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise HttpFailure(f"{base}: the answer is {int(length):,} bytes, over the limit of "
                                  f"{max_bytes:,}", "too_large")
            out = bytearray()
            while chunk := resp.read(_CHUNK):
                out += chunk
                if len(out) > max_bytes:
                    raise HttpFailure(f"{base}: the answer is over the limit of {max_bytes:,} bytes", "too_large")
                if time.monotonic() - t0 > timeout_s:
                    raise TimeoutError
            return bytes(out)
    except urllib.error.HTTPError as exc:
        raise HttpFailure(f"{base}: answered {exc.code}: {_error_text(exc)}", "status", exc.code) from None
    except TimeoutError:
        raise HttpFailure(f"{base}: no whole answer within {timeout_s:g} s", "timeout") from None
    except urllib.error.URLError as exc:
        kind = "timeout" if isinstance(exc.reason, TimeoutError) else "unreachable"
        reason = f"no answer within {timeout_s:g} s" if kind == "timeout" else f"cannot reach it: {exc.reason}"
        raise HttpFailure(f"{base}: {reason}", kind) from None
    except OSError as exc:
        raise HttpFailure(f"{base}: cannot reach it: {exc}", "unreachable") from None


def _error_text(exc: urllib.error.HTTPError) -> str:
    """A short reason from an error answer (Prometheus' and InfluxDB's ``error`` field)."""
    try:
        raw = exc.read(16 << 10)
    except OSError:
        return str(exc.reason)[:200]
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        return raw[:200].decode("utf-8", "replace").strip() or str(exc.reason)[:200]
    if isinstance(answer, dict) and "error" in answer:
        return str(answer["error"])[:300]
    return str(exc.reason)[:200]
