"""Alertmanager: each step of an action as the alert ``RankscopeNodeDrained``, so the on-call
sees it through their own routing (``POST /api/v2/alerts``, as Prometheus posts its alerts).

One alert per action and state (labels: alertname, severity, job, incident, node, host, class,
action, state); severity ``warning`` for a drain done, ``critical`` where a person must act (a
drain refused over budget or ambiguous, a scheduler that failed), ``info`` for a plan, a skip
and a resume. A state that holds (a node still drained, a refusal still standing) is posted again
each pass with ``endsAt`` ``alert_hold_s`` ahead, as Prometheus refreshes a firing alert; a state
left behind is posted once more with ``endsAt`` now, and Alertmanager resolves it.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

from actions.records import ActionRecord
from rankscope.times import format_time

log = logging.getLogger("rankscope.act")

ALERTNAME = "RankscopeNodeDrained"


def severity(r: ActionRecord) -> str:
    if r.state in ("refused", "failed"):
        return "critical"
    return "warning" if (r.action, r.state) == ("drain", "done") else "info"


def alert(r: ActionRecord, ends_ms: int, base_url: str = "") -> dict:
    """The Alertmanager v2 alert of one step, ending at ``ends_ms``."""
    person = " A person must act." if severity(r) == "critical" else ""
    return {
        "labels": {"alertname": ALERTNAME, "severity": severity(r), "job": r.job, "incident": r.incident,
                   "node": r.node, "host": r.host or r.node, "class": r.cls, "action": r.action,
                   "state": r.state},
        "annotations": {"summary": f"rankscope {r.action} of {r.node} {r.state} ({r.mode})",
                        "description": f"{r.reason}.{person} Incident {r.incident} of job {r.job}."},
        "startsAt": format_time(r.at), "endsAt": format_time(ends_ms),
        **({"generatorURL": base_url} if base_url else {}),
    }


class AlertmanagerNotifier:
    """Posts the steps to the Alertmanager at ``url`` (errors are logged: the action stands)."""

    def __init__(self, url: str, hold_s: float = 900.0, timeout_s: float = 10.0):
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.hold_ms = int(hold_s * 1000)
        self.timeout_s = timeout_s

    def post(self, current: list[ActionRecord], ended: list[ActionRecord], now_ms: int) -> bool:
        """``current`` firing until ``hold_s`` from now, ``ended`` resolved now; False if it failed."""
        alerts = [alert(r, now_ms) for r in ended] + [alert(r, now_ms + self.hold_ms) for r in current]
        if not alerts:
            return True
        req = urllib.request.Request(self.url, data=json.dumps(alerts).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
            return True
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.error("cannot post %d alert(s) to %s: %s", len(alerts), self.url, exc)
            return False
