"""Who may post to an endpoint (the events receiver, the analyzer's stream of points): a bearer token, HTTP basic auth, or (on loopback only) anyone.

Alertmanager's webhook ``http_config`` sends either ``authorization`` (``Authorization:
Bearer <credentials>``) or ``basic_auth`` (``Authorization: Basic base64(user:password)``), and
Grafana's webhook contact point either its *Authorization Header* or its basic-auth
*Username*/*Password*; the receiver takes whichever of the two is configured (both may be).
The secrets come from the environment only (:data:`TOKEN_ENV`, :data:`USER_ENV`,
:data:`PASSWORD_ENV`), are compared in constant time and never shown by ``repr``.

Without any credentials the receiver accepts every post, which is only allowed on a loopback
address (the machine's own processes): :func:`check_exposure` refuses any other address unless
the operator says ``insecure``.

Example::

    >>> creds = Credentials(user="alertmanager", password="s3cret")
    >>> creds.principal("Basic YWxlcnRtYW5hZ2VyOnMzY3JldA==")
    'basic user alertmanager'
    >>> creds.principal("Bearer s3cret") is None, creds
    (True, Credentials(basic auth as 'alertmanager'))
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Environment variable holding the bearer token senders present.
TOKEN_ENV = "RANKSCOPE_EVENTS_TOKEN"
#: Environment variables holding the basic-auth user name and password senders present.
USER_ENV = "RANKSCOPE_EVENTS_USER"
PASSWORD_ENV = "RANKSCOPE_EVENTS_PASSWORD"
#: Who posted when no credentials are configured (loopback only).
ANONYMOUS = "anonymous"
REALM = "rankscope-events"


class ExposureError(ValueError):
    """Listening where anyone may reach the receiver, with nothing asked of them."""


@dataclass(frozen=True)
class Credentials:
    """What a sender must present: a bearer ``token``, a basic-auth ``user`` and ``password``,
    either, or nothing (:attr:`required` False: everyone is let in)."""

    token: str | None = field(default=None, repr=False)
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("token", "user", "password"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"the receiver's {name} must be a string")
            if value is not None and not value:
                object.__setattr__(self, name, None)   # an empty variable is an unset one
        if (self.user is None) != (self.password is None):
            given, missing = (USER_ENV, PASSWORD_ENV) if self.password is None else (PASSWORD_ENV, USER_ENV)
            raise ValueError(f"basic auth needs both a user and a password: {given} is set, "
                             f"{missing} is not")
        if self.user is not None and ":" in self.user:
            raise ValueError(f"the basic-auth user name ({USER_ENV}) cannot contain ':'")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], names: tuple[str, str, str] = (TOKEN_ENV, USER_ENV, PASSWORD_ENV)
                 ) -> Credentials:
        """The credentials in ``environ`` (``os.environ``) under ``names`` (token, user, password
        variables; the events receiver's by default): unset or empty variables ask nothing."""
        token, user, password = (environ.get(n) or None for n in names)
        return cls(token=token, user=user, password=password)

    @property
    def required(self) -> bool:
        return self.token is not None or self.user is not None

    @property
    def schemes(self) -> tuple[str, ...]:
        """The HTTP auth schemes accepted (empty: none asked)."""
        return tuple(s for s, on in (("Bearer", self.token is not None),
                                     ("Basic", self.user is not None)) if on)

    def __repr__(self) -> str:
        parts = (["bearer token"] if self.token else []) + (
            [f"basic auth as {self.user!r}"] if self.user else [])
        return f"Credentials({' or '.join(parts) or 'none: anyone may post'})"

    def describe(self) -> str:
        """For the start-up line: what senders must present (never the secrets)."""
        return repr(self)[len("Credentials("):-1]

    def challenge(self) -> tuple[tuple[str, str], ...]:
        """``WWW-Authenticate`` headers of a 401."""
        return tuple(("WWW-Authenticate", f'{s} realm="{REALM}"') for s in self.schemes)

    def principal(self, header: str | None) -> str | None:
        """Who an ``Authorization`` header proves the sender is (``bearer token``,
        ``basic user NAME``; :data:`ANONYMOUS` when nothing is asked), or None: refused."""
        if not self.required:
            return ANONYMOUS
        scheme, _, value = (header or "").strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and self.token is not None:
            return "bearer token" if _same(value, self.token) else None
        if scheme == "basic" and self.user is not None and self.password is not None:
            pair = _basic_pair(value)
            if pair is None:
                return None
            # both compared whole, whatever the first gives: no early exit to time
            user_ok = _same(pair[0], self.user)
            password_ok = _same(pair[1], self.password)
            return f"basic user {self.user}" if user_ok and password_ok else None
        return None


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                               expected.encode("utf-8", "surrogateescape"))


def _basic_pair(value: str) -> tuple[str, str] | None:
    """``(user, password)`` of a basic-auth value (RFC 7617, UTF-8), or None when malformed."""
    try:
        text = base64.b64decode(value.encode("ascii"), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        return None
    user, sep, password = text.partition(":")
    return (user, password) if sep else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address) is reachable from this machine only: ``localhost``
    or a loopback IP address. A host name other than ``localhost`` is not assumed to be."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, credentials: Credentials, insecure: bool = False) -> None:
    """Refuse to listen on a non-loopback ``host`` without credentials, unless ``insecure``."""
    if credentials.required or insecure or is_loopback(host):
        return
    raise ExposureError(
        f"refusing to listen on {host} without credentials: anyone who reaches it could write "
        f"events and change the analyzer's verdicts. Set {TOKEN_ENV} (bearer) or {USER_ENV} and "
        f"{PASSWORD_ENV} (basic auth), listen on 127.0.0.1, or pass --insecure to accept posts "
        f"from anyone")
