"""Where Grafana sends alerts: contact points and the notification policy, as typed records
written in Grafana's file-provisioning format (``contactPoints``, ``policies``).

- rankscope's own alerts (label ``source = rankscope``, :mod:`dashboards.alerts`) go to the NOC
  webhook (its URL from Grafana's environment, ``RANKSCOPE_ALERT_WEBHOOK_URL``), one
  notification per job (``group_by: [job]``). Under it the routes split by ``class`` (a machine
  or link to repair pages at once and repeats hourly; a pipeline imbalance or a transient stall
  waits and repeats twice a day), then by ``severity``.
- every other alert of this Grafana (node exporters, NIC and ECC monitors: what the IL-0477 NOC
  saw as "server port down") goes to rankscope's events receiver (``rankscope events serve``,
  POST /grafana, bearer token ``RANKSCOPE_EVENTS_TOKEN``), so the analyzer judges it against its
  incidents, and on to the NOC webhook as well. rankscope's own alerts are never sent there: an
  incident would come back as an event confirming itself.

Grafana interpolates ``${VAR}`` in provisioning files from its environment (compose.yaml sets
them). The policy tree replaces the organisation's: this Grafana is rankscope's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dashboards.alerts import SOURCE

#: Environment variables the provisioned contact points read.
WEBHOOK_URL_ENV = "RANKSCOPE_ALERT_WEBHOOK_URL"
EVENTS_URL_ENV = "RANKSCOPE_EVENTS_URL"
EVENTS_TOKEN_ENV = "RANKSCOPE_EVENTS_TOKEN"
NOC = "rankscope-noc"
EVENTS = "rankscope-events"
#: Incident classes that name a machine or a link to repair now.
REPAIR_CLASSES = ("compute_straggler", "arrival_straggler", "host_stall", "silent_rank",
                  "link_degradation")
#: Incident classes that come and go or call for tuning, not a repair.
TUNING_CLASSES = ("pipeline_imbalance", "transient_stall")


@dataclass(frozen=True)
class Webhook:
    """A webhook contact point (one receiver)."""

    name: str
    uid: str
    url: str
    bearer_token: str | None = None
    send_resolved: bool = True

    def to_provisioning(self, org_id: int = 1) -> dict:
        settings: dict[str, object] = {"url": self.url, "httpMethod": "POST"}
        if self.bearer_token:
            settings |= {"authorization_scheme": "Bearer", "authorization_credentials": self.bearer_token}
        return {"orgId": org_id, "name": self.name,
                "receivers": [{"uid": self.uid, "type": "webhook", "settings": settings,
                               "disableResolveMessage": not self.send_resolved}]}


Matcher = tuple[str, str, str]


@dataclass(frozen=True)
class Route:
    """A node of the notification policy tree; unset timings and grouping are inherited."""

    receiver: str
    matchers: tuple[Matcher, ...] = ()
    group_by: tuple[str, ...] | None = None
    group_wait: str | None = None
    group_interval: str | None = None
    repeat_interval: str | None = None
    continue_matching: bool = False
    routes: tuple[Route, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for label, op, _ in self.matchers:
            if op not in ("=", "!=", "=~", "!~"):
                raise ValueError(f"route to {self.receiver}: matcher {label} {op}: unknown operator")

    def to_provisioning(self) -> dict:
        out: dict[str, object] = {"receiver": self.receiver}
        if self.matchers:
            out["object_matchers"] = [list(m) for m in self.matchers]
        if self.group_by is not None:
            out["group_by"] = list(self.group_by)
        for key in ("group_wait", "group_interval", "repeat_interval"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.continue_matching:
            out["continue"] = True
        if self.routes:
            out["routes"] = [r.to_provisioning() for r in self.routes]
        return out

    def walk(self):
        """This route and every route under it."""
        yield self
        for r in self.routes:
            yield from r.walk()


def contact_points() -> list[Webhook]:
    """The NOC webhook and rankscope's events receiver, addresses and token from the environment."""
    return [Webhook(NOC, "rankscope-noc-webhook", f"${{{WEBHOOK_URL_ENV}}}"),
            Webhook(EVENTS, "rankscope-events-receiver", f"${{{EVENTS_URL_ENV}}}",
                    bearer_token=f"${{{EVENTS_TOKEN_ENV}}}")]


def notification_policy() -> Route:
    """The policy tree: rankscope alerts by class and severity to the NOC, per job; everything
    else to the events receiver and the NOC."""
    ours = ("source", "=", SOURCE)
    theirs = ("source", "!=", SOURCE)
    rankscope = Route(
        NOC, matchers=(ours,), group_by=("job",), group_wait="30s", group_interval="5m", repeat_interval="4h",
        routes=(
            Route(NOC, matchers=(("class", "=~", "|".join(REPAIR_CLASSES)),), group_wait="30s",
                  group_interval="5m", repeat_interval="1h"),
            Route(NOC, matchers=(("class", "=~", "|".join(TUNING_CLASSES)),), group_wait="5m",
                  group_interval="15m", repeat_interval="12h"),
            Route(NOC, matchers=(("severity", "=", "critical"),), group_wait="30s", group_interval="5m",
                  repeat_interval="1h"),
            Route(NOC, matchers=(("severity", "=", "warning"),), group_wait="2m", group_interval="10m",
                  repeat_interval="4h"),
        ))
    return Route(
        NOC, group_by=("grafana_folder", "alertname"), group_wait="30s", group_interval="5m",
        repeat_interval="4h",
        routes=(
            rankscope,
            # every alert its own event; re-sent ones rewrite the same point
            Route(EVENTS, matchers=(theirs,), group_by=("...",), group_wait="10s", group_interval="1m",
                  repeat_interval="1h", continue_matching=True),
            Route(NOC, matchers=(theirs,)),
        ))


def notification_document(org_id: int = 1) -> dict:
    """The contact-point and notification-policy provisioning file (apiVersion 1)."""
    points = contact_points()
    policy = notification_policy()
    names = {p.name for p in points}
    unknown = {r.receiver for r in policy.walk()} - names
    if unknown:
        raise ValueError(f"notification policy routes to unknown contact point(s): {', '.join(sorted(unknown))}")
    return {"apiVersion": 1, "contactPoints": [p.to_provisioning(org_id) for p in points],
            "policies": [{"orgId": org_id, **policy.to_provisioning()}]}
