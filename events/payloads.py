"""Webhook and API payloads -> event rows, with what was wrong with each refused alert.

Pure functions, one per format, each returning a :class:`Translation`: the rows of the
usable alerts AND the refusals (alert index and reason), so the caller can write the good
alerts of a partly bad payload and tell the sender exactly which ones it refused.

- :func:`from_alertmanager`: Prometheus Alertmanager's webhook payload, version 4;
- :func:`from_grafana`: Grafana alerting's webhook contact point (Alertmanager-shaped, with
  ``orgId``, ``title``, ``state``, ``message`` and per-alert ``values``, ``silenceURL``...);
- :func:`from_rankscope`: rankscope's own list ``[{"name", "host", "time", ...}]``.

For an alert: the name is the ``alertname`` label (or ``name``); the host the first
non-empty label of ``host_labels`` (a ``:port`` suffix, as in ``instance``, is stripped);
the text the annotations ``summary``, ``description``, ``message``; the severity the
``severity`` label (default ``warning``); the source ``alertmanager/<receiver>`` or
``grafana/<receiver>`` (``events/<source>`` for rankscope's own JSON: see
:func:`events.rows.sourced`); the time ``startsAt``; ``status`` and ``endsAt`` say whether and
when it was resolved. The alert's ``job`` label (Prometheus' scrape job) is not the
training job: the receiver's ``--job`` is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from events.rows import (
    DEFAULT_SEVERITY,
    DEFAULT_SOURCE,
    FIRING,
    NO_END,
    RESOLVED,
    STATUSES,
    EventError,
    EventRow,
    parse_end,
    sourced,
)
from rankscope.times import TimeError, parse_time

#: Labels that name the machine, in order of preference.
DEFAULT_HOST_LABELS: tuple[str, ...] = ("host", "hostname", "instance", "node")
NAME_LABELS = ("alertname", "name")
TEXT_ANNOTATIONS = ("summary", "description", "message")
#: The payload version each webhook format is documented with (refused when different).
ALERTMANAGER_VERSION = "4"
GRAFANA_VERSION = "1"
#: Keys of rankscope's own event objects.
OWN_KEYS = frozenset({"name", "host", "time", "severity", "source", "text", "status", "ends"})


@dataclass(frozen=True)
class Refusal:
    """One alert (by its index in the payload; None: the whole payload) that was not written."""

    index: int | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "error": self.reason}

    def __str__(self) -> str:
        return self.reason if self.index is None else f"#{self.index}: {self.reason}"


@dataclass
class Translation:
    """What a payload holds: the usable events, the refused alerts, how many it carried
    (``received``) and how many its sender left out (Alertmanager's ``truncatedAlerts``)."""

    rows: list[EventRow] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    received: int = 0
    truncated: int = 0

    @property
    def ok(self) -> bool:
        return not self.refused

    @classmethod
    def unusable(cls, reason: str) -> Translation:
        return cls(refused=[Refusal(None, reason)])


def strip_port(value: str) -> str:
    """The host of ``host:port``, ``[v6]:port`` or a URL (blackbox probes' ``instance``)."""
    text = value.strip()
    if "://" in text:
        return urlsplit(text).hostname or text
    if text.startswith("[") and "]" in text:
        return text[1:text.index("]")]
    head, sep, port = text.rpartition(":")
    if sep and head and port.isdigit() and ":" not in head:
        return head
    return text


def host_of(labels: Mapping[str, Any],
            host_labels: Sequence[str] = DEFAULT_HOST_LABELS) -> str | None:
    """The machine an alert is about: the first non-empty label of ``host_labels``."""
    for key in host_labels:
        value = labels.get(key)
        if isinstance(value, str) and value.strip():
            return strip_port(value)
    return None


def from_alertmanager(payload: object,
                      host_labels: Sequence[str] = DEFAULT_HOST_LABELS) -> Translation:
    """Rows of an Alertmanager webhook payload (version 4)."""
    return _alert_group(payload, "alertmanager", ALERTMANAGER_VERSION, host_labels)


def from_grafana(payload: object, host_labels: Sequence[str] = DEFAULT_HOST_LABELS) -> Translation:
    """Rows of a Grafana alerting webhook contact-point payload (version 1)."""
    return _alert_group(payload, "grafana", GRAFANA_VERSION, host_labels)


def from_rankscope(payload: object, now_ms: int, origin: str | None = "events") -> Translation:
    """Rows of rankscope's own JSON: a list of ``{"name", "host", "time", "severity", "source",
    "text"}`` (``time`` RFC 3339 or epoch ms, default ``now_ms``; optional ``status``
    firing|resolved and ``ends``, default ``now_ms`` when resolved). The stored source is
    ``<origin>/<source>`` (``events/noc``; just ``origin`` without a ``source``); with
    ``origin`` None, ``source`` as given (default ``rankscope``)."""
    if not isinstance(payload, list):
        return Translation.unusable(f"expected a JSON list of events, got {_kind(payload)}")
    out = Translation(received=len(payload))
    for i, item in enumerate(payload):
        _collect(out, i, lambda item=item: _own_row(item, now_ms, origin))
    return out


# ----------------------------------------------------------------- internals
def _alert_group(payload: object, kind: str, version: str,
                 host_labels: Sequence[str]) -> Translation:
    if not isinstance(payload, dict):
        return Translation.unusable(f"expected a JSON object ({kind} webhook payload), "
                                    f"got {_kind(payload)}")
    got = payload.get("version")
    if got is not None and str(got) != version:
        return Translation.unusable(f"payload version {got!r} is not the {kind} webhook "
                                    f"version {version!r}")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        return Translation.unusable(f"'alerts' must be a list, got {_kind(alerts)}")
    source = sourced(kind, payload.get("receiver"))
    group_status = payload.get("status")
    truncated = payload.get("truncatedAlerts")
    out = Translation(received=len(alerts),
                      truncated=truncated if isinstance(truncated, int) and truncated > 0 else 0)
    for i, alert in enumerate(alerts):
        _collect(out, i, lambda alert=alert: _alert_row(alert, source, group_status, host_labels))
    return out


def _alert_row(alert: object, source: str, group_status: object,
               host_labels: Sequence[str]) -> EventRow:
    if not isinstance(alert, dict):
        raise EventError(f"an alert must be an object, got {_kind(alert)}")
    labels = _string_map(alert.get("labels"), "labels")
    annotations = _string_map(alert.get("annotations"), "annotations")
    name = next((labels[k] for k in NAME_LABELS if labels.get(k, "").strip()), None)
    if name is None:
        raise EventError("no alert name (label alertname or name)")
    host = host_of(labels, host_labels)
    if host is None:
        raise EventError(f"alert {name!r} names no host "
                         f"(none of the labels {', '.join(host_labels)})")
    status = alert.get("status") or group_status
    if status not in STATUSES:
        raise EventError(f"alert {name!r}: status {status!r} is not one of {', '.join(STATUSES)}")
    if "startsAt" not in alert:
        raise EventError(f"alert {name!r}: no startsAt")
    starts = parse_time(alert["startsAt"], "startsAt")
    ends = parse_end(alert.get("endsAt")) if status == RESOLVED else NO_END
    return EventRow(time_ms=starts, name=name.strip(), host=host,
                    severity=labels.get("severity") or DEFAULT_SEVERITY, source=source,
                    text=_text(annotations), status=status, ends_ms=ends)


def _own_row(item: object, now_ms: int, origin: str | None) -> EventRow:
    if not isinstance(item, dict):
        raise EventError(f"an event must be an object, got {_kind(item)}")
    unknown = sorted(set(item) - OWN_KEYS)
    if unknown:
        raise EventError(f"unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(sorted(OWN_KEYS))}")
    for key in sorted(OWN_KEYS - {"time", "ends"}):
        if key in item and not isinstance(item[key], str):
            raise EventError(f"{key} must be a string, got {_kind(item[key])}")
    if not item.get("name", "").strip():
        raise EventError("no name")
    if not item.get("host", "").strip():
        raise EventError(f"event {item['name']!r} names no host")
    status = item.get("status") or FIRING
    if status not in STATUSES:
        raise EventError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    when = parse_time(item["time"]) if item.get("time") is not None else now_ms
    ends = NO_END
    if status == RESOLVED:
        ends = parse_time(item["ends"], "ends") if item.get("ends") is not None else now_ms
    elif item.get("ends") is not None:
        raise EventError("ends is only for a resolved event")
    return EventRow(time_ms=when, name=item["name"].strip(), host=item["host"].strip(),
                    severity=item.get("severity") or DEFAULT_SEVERITY,
                    source=(sourced(origin, item.get("source")) if origin is not None
                            else item.get("source") or DEFAULT_SOURCE),
                    text=item.get("text", ""),
                    status=status, ends_ms=ends)


def _collect(out: Translation, index: int, make: Callable[[], EventRow]) -> None:
    try:
        out.rows.append(make())
    except (EventError, TimeError) as exc:
        out.refused.append(Refusal(index, str(exc)))


def _string_map(value: object, what: str) -> dict[str, str]:
    """A labels/annotations object: missing is empty; a non-string value is refused."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise EventError(f"{what} must be an object, got {_kind(value)}")
    bad = [k for k, v in value.items() if not isinstance(v, str)]
    if bad:
        raise EventError(f"{what}.{bad[0]} must be a string, got {_kind(value[bad[0]])}")
    return value


def _text(annotations: Mapping[str, str]) -> str:
    parts: list[str] = []
    for key in TEXT_ANNOTATIONS:
        value = annotations.get(key, "").strip()
        if value and value not in parts:
            parts.append(value)
    return " - ".join(parts)


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)
