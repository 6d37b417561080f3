"""Alertmanager, Grafana and rankscope's own payloads -> event rows, and what is refused why.

The payloads are shaped as the Alertmanager configuration docs (webhook_config, version 4)
and Grafana's webhook notifier docs show them; ``GRAFANA_DOCUMENTED`` is Grafana's example
verbatim. ``tests/test_events_receiver.py`` posts the same builders over HTTP.
"""

from __future__ import annotations

import calendar
import copy
import hashlib

import pytest

from events.payloads import (
    DEFAULT_HOST_LABELS,
    from_alertmanager,
    from_grafana,
    from_rankscope,
    host_of,
    strip_port,
)
from events.rows import NO_END, EventError, EventRow, events_frame
from rankscope.times import format_time, parse_time

ZERO_TIME = "0001-01-01T00:00:00Z"


def utc_ms(y: int, mo: int, d: int, h: int, mi: int, s: int, ms: int = 0) -> int:
    return calendar.timegm((y, mo, d, h, mi, s)) * 1000 + ms


def am_alert(name: str, labels: dict[str, str], starts: str, status: str = "firing",
             ends: str = ZERO_TIME, summary: str = "", description: str = "") -> dict:
    """One alert of an Alertmanager v4 webhook payload."""
    annotations = {k: v for k, v in (("summary", summary), ("description", description)) if v}
    return {
        "status": status,
        "labels": {"alertname": name, **labels},
        "annotations": annotations,
        "startsAt": starts,
        "endsAt": ends,
        "generatorURL": "http://prometheus.example.org:9090/graph?g0.expr=node_network_up+%3D%3D+0"
                        "\u0026g0.tab=1",
        "fingerprint": hashlib.sha256(repr(sorted(labels.items())).encode()).hexdigest()[:16],
    }


def am_payload(alerts: list[dict], receiver: str = "rankscope", status: str | None = None) -> dict:
    """An Alertmanager webhook payload, version 4, around ``alerts``."""
    names = sorted({a["labels"].get("alertname", "") for a in alerts if isinstance(a, dict)})
    return {
        "version": "4",
        "groupKey": "{}:{alertname=\"" + ",".join(names) + "\"}",
        "truncatedAlerts": 0,
        "status": status or ("firing" if any(a.get("status") == "firing" for a in alerts
                                             if isinstance(a, dict)) else "resolved"),
        "receiver": receiver,
        "groupLabels": {"alertname": names[0]} if len(names) == 1 else {},
        "commonLabels": {"alertname": names[0]} if len(names) == 1 else {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.example.org:9093",
        "alerts": alerts,
    }


#: Grafana's documented webhook example, verbatim (its alerts name no host).
GRAFANA_DOCUMENTED = {
    "receiver": "My Super Webhook",
    "status": "firing",
    "orgId": 1,
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "High memory usage", "team": "blue", "zone": "us-1"},
            "annotations": {
                "description": "The system has high memory usage",
                "runbook_url": "https://myrunbook.com/runbook/1234",
                "summary": "This alert was triggered for zone us-1",
            },
            "startsAt": "2021-10-12T09:51:03.157076+02:00",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "https://play.grafana.org/alerting/1afz29v7z/edit",
            "fingerprint": "c6eadffa33fcdf37",
            "silenceURL": "https://play.grafana.org/alerting/silence/new?alertmanager=grafana"
                          "&matchers=alertname%3DT2%2Cteam%3Dblue%2Czone%3Dus-1",
            "dashboardURL": "",
            "panelURL": "",
            "values": {"B": 44.23943737541908, "C": 1},
        },
        {
            "status": "firing",
            "labels": {"alertname": "High CPU usage", "team": "blue", "zone": "eu-1"},
            "annotations": {
                "description": "The system has high CPU usage",
                "runbook_url": "https://myrunbook.com/runbook/1234",
                "summary": "This alert was triggered for zone eu-1",
            },
            "startsAt": "2021-10-12T09:56:03.157076+02:00",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "https://play.grafana.org/alerting/d1rdpdv7k/edit",
            "fingerprint": "bc97ff14869b13e3",
            "silenceURL": "https://play.grafana.org/alerting/silence/new?alertmanager=grafana"
                          "&matchers=alertname%3DT1%2Cteam%3Dblue%2Czone%3Deu-1",
            "dashboardURL": "",
            "panelURL": "",
            "values": {"B": 44.23943737541908, "C": 1},
        },
    ],
    "groupLabels": {},
    "commonLabels": {"team": "blue"},
    "commonAnnotations": {},
    "externalURL": "https://play.grafana.org/",
    "version": "1",
    "groupKey": "{}:{}",
    "truncatedAlerts": 0,
    "title": "[FIRING:2]  (blue)",
    "state": "alerting",
    "message": "**Firing**\n\nLabels:\n - alertname = T2\n - team = blue\n - zone = us-1\n"
               "Annotations:\n - description = This is the alert rule checking the second system\n"
               " - runbook_url = https://myrunbook.com\n - summary = This is my summary\n"
               "Source: https://play.grafana.org/alerting/1afz29v7z/edit\n",
}


def grafana_with_hosts(*hosts: str, status: str = "firing", ends: str = ZERO_TIME) -> dict:
    """Grafana's documented payload with an ``instance`` label (host:port) on each alert."""
    payload = copy.deepcopy(GRAFANA_DOCUMENTED)
    payload["status"] = status
    for alert, host in zip(payload["alerts"], hosts, strict=True):
        alert["labels"]["instance"] = f"{host}:9100"
        alert["status"] = status
        alert["endsAt"] = ends
    return payload


# ------------------------------------------------------------------ Alertmanager
def test_alertmanager_firing_alerts_become_rows():
    payload = am_payload([
        am_alert("NodeNetworkDown", {"instance": "gpu-node-01294:9100", "job": "node",
                                     "severity": "critical"},
                 "2026-07-08T09:30:00.123456789Z", summary="server port down",
                 description="eth2 on gpu-node-01294 is down"),
        am_alert("NodeNetworkDown", {"instance": "gpu-node-00007:9100", "job": "node"},
                 "2026-07-08T11:30:00.5+02:00", summary="server port down"),
    ], receiver="noc-webhook")
    tr = from_alertmanager(payload)
    assert tr.ok and tr.received == 2 and tr.truncated == 0
    first, second = tr.rows
    assert first == EventRow(time_ms=utc_ms(2026, 7, 8, 9, 30, 0, 123), name="NodeNetworkDown",
                             host="gpu-node-01294", severity="critical",
                             source="alertmanager/noc-webhook",
                             text="server port down - eth2 on gpu-node-01294 is down",
                             status="firing", ends_ms=NO_END)
    # the +02:00 offset is honoured, the severity defaults to warning
    assert second.time_ms == utc_ms(2026, 7, 8, 9, 30, 0, 500)
    assert (second.host, second.severity, second.text) == ("gpu-node-00007", "warning",
                                                           "server port down")


def test_alertmanager_resolved_alert_keeps_its_start_and_gets_its_end():
    alert = am_alert("NodeNetworkDown", {"instance": "gpu-node-01294:9100"},
                     "2026-07-08T09:30:00Z", status="resolved", ends="2026-07-08T09:42:10.250Z")
    row = from_alertmanager(am_payload([alert])).rows[0]
    assert row.status == "resolved"
    assert row.time_ms == utc_ms(2026, 7, 8, 9, 30, 0)
    assert row.ends_ms == utc_ms(2026, 7, 8, 9, 42, 10, 250)
    # a firing alert's endsAt (Prometheus sends a predicted one) is not an end
    firing = am_alert("NodeNetworkDown", {"instance": "gpu-node-01294:9100"},
                      "2026-07-08T09:30:00Z", ends="2026-07-08T09:34:00Z")
    assert from_alertmanager(am_payload([firing])).rows[0].ends_ms == NO_END


def test_partly_bad_payload_keeps_the_good_alerts_and_names_the_bad_ones():
    payload = am_payload([
        am_alert("NodeNetworkDown", {"instance": "gpu-node-01294:9100"}, "2026-07-08T09:30:00Z"),
        am_alert("NodeNetworkDown", {"job": "node", "zone": "eu-1"}, "2026-07-08T09:30:00Z"),
        {**am_alert("", {"instance": "gpu-node-00001:9100"}, "2026-07-08T09:30:00Z")},
        am_alert("NodeNetworkDown", {"instance": "gpu-node-00002:9100"}, "yesterday"),
        am_alert("NodeNetworkDown", {"instance": "gpu-node-00003:9100"}, "2026-07-08T09:30:00"),
        am_alert("NodeNetworkDown", {"instance": "gpu-node-00004:9100"}, ZERO_TIME),
        "not an alert",
        {**am_alert("NodeNetworkDown", {"instance": "gpu-node-00005:9100"},
                    "2026-07-08T09:30:00Z"), "status": "pending"},
        am_alert("Node\nDown", {"instance": "gpu-node-00006:9100"}, "2026-07-08T09:30:00Z"),
        {**am_alert("NodeNetworkDown", {"instance": "gpu-node-00008:9100"},
                    "2026-07-08T09:30:00Z"), "labels": {"alertname": "X", "instance": 7}},
    ])
    tr = from_alertmanager(payload)
    assert [r.host for r in tr.rows] == ["gpu-node-01294"]
    assert tr.received == 10
    reasons = {r.index: r.reason for r in tr.refused}
    assert sorted(reasons) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert "names no host" in reasons[1] and ", ".join(DEFAULT_HOST_LABELS) in reasons[1]
    assert "no alert name" in reasons[2]
    assert "startsAt 'yesterday' is not an RFC 3339 time" in reasons[3]
    assert "has no time zone" in reasons[4]
    assert "outside the range" in reasons[5]
    assert "must be an object" in reasons[6]
    assert "status 'pending'" in reasons[7]
    assert "newline" in reasons[8]
    assert "labels.instance must be a string" in reasons[9]


@pytest.mark.parametrize("payload,needle", [
    ([1, 2], "expected a JSON object"),
    ({"version": "4"}, "'alerts' must be a list"),
    ({"version": "3", "alerts": []}, "payload version '3'"),
])
def test_unusable_alertmanager_payloads(payload, needle):
    tr = from_alertmanager(payload)
    assert tr.rows == [] and len(tr.refused) == 1
    assert tr.refused[0].index is None and needle in tr.refused[0].reason


def test_truncated_alerts_are_reported():
    payload = am_payload([am_alert("NodeNetworkDown", {"instance": "gpu-node-01294:9100"},
                                   "2026-07-08T09:30:00Z")])
    payload["truncatedAlerts"] = 3
    assert from_alertmanager(payload).truncated == 3


# ----------------------------------------------------------------------- hosts
@pytest.mark.parametrize("value,host", [
    ("gpu-node-01294:9100", "gpu-node-01294"),
    ("gpu-node-01294", "gpu-node-01294"),
    ("10.0.3.17:9100", "10.0.3.17"),
    ("[fe80::1]:9100", "fe80::1"),
    ("fe80::1", "fe80::1"),
    ("https://server.example.org", "server.example.org"),
    ("http://gpu-node-01294:9400/metrics", "gpu-node-01294"),
])
def test_strip_port(value, host):
    assert strip_port(value) == host


def test_host_label_preference_and_custom_labels():
    labels = {"instance": "10.0.3.17:9100", "hostname": "gpu-node-01294", "node": "n1"}
    assert host_of(labels) == "gpu-node-01294"            # hostname before instance
    assert host_of({"instance": "10.0.3.17:9100", "host": " "}) == "10.0.3.17"  # blank skipped
    assert host_of(labels, ("node",)) == "n1"
    assert host_of({"team": "blue"}) is None
    alert = am_alert("NodeNetworkDown", {"machine": "gpu-node-01294"}, "2026-07-08T09:30:00Z")
    assert not from_alertmanager(am_payload([alert])).rows
    assert from_alertmanager(am_payload([alert]), ("machine",)).rows[0].host == "gpu-node-01294"


# --------------------------------------------------------------------- Grafana
def test_grafana_documented_example_names_no_host_and_is_refused_alert_by_alert():
    tr = from_grafana(GRAFANA_DOCUMENTED)
    assert tr.rows == [] and tr.received == 2
    assert [(r.index, "names no host" in r.reason) for r in tr.refused] == [(0, True), (1, True)]
    assert "'High memory usage'" in tr.refused[0].reason


def test_grafana_alerts_with_an_instance_become_rows():
    tr = from_grafana(grafana_with_hosts("gpu-node-01294", "gpu-node-00007"))
    assert tr.ok
    mem, cpu = tr.rows
    assert (mem.name, mem.host, mem.source) == ("High memory usage", "gpu-node-01294",
                                                "grafana/My Super Webhook")
    assert mem.time_ms == utc_ms(2021, 10, 12, 7, 51, 3, 157)
    assert mem.text == "This alert was triggered for zone us-1 - The system has high memory usage"
    assert (cpu.host, cpu.status, cpu.severity) == ("gpu-node-00007", "firing", "warning")
    resolved = from_grafana(grafana_with_hosts("gpu-node-01294", "gpu-node-00007",
                                               status="resolved", ends="2021-10-12T10:01:03+02:00"))
    assert [r.ends_ms for r in resolved.rows] == [utc_ms(2021, 10, 12, 8, 1, 3)] * 2
    # Grafana's payload is version 1; Alertmanager's parser refuses it rather than guess
    assert "version '1'" in from_alertmanager(GRAFANA_DOCUMENTED).refused[0].reason


# -------------------------------------------------------------- rankscope JSON
def test_own_json_events():
    now = utc_ms(2026, 7, 8, 12, 0, 0)
    tr = from_rankscope([
        {"name": "server port down", "host": "gpu-node-01294", "time": "2026-07-08T09:30:00Z",
         "severity": "critical", "source": "noc", "text": "eth2 down"},
        {"name": "GPU Xid 79", "host": "gpu-node-00002", "time": utc_ms(2026, 7, 8, 9, 31, 0)},
        {"name": "NFS timeout", "host": "gpu-node-00003"},
        {"name": "server port down", "host": "gpu-node-01294", "time": "2026-07-08T09:30:00Z",
         "severity": "critical", "source": "noc", "status": "resolved"},
    ], now_ms=now)
    assert tr.ok
    a, b, c, d = tr.rows
    # the route comes first in the source: a script cannot pass for Alertmanager
    assert (a.time_ms, a.severity, a.source, a.text) == (utc_ms(2026, 7, 8, 9, 30, 0), "critical",
                                                         "events/noc", "eth2 down")
    assert (b.time_ms, b.severity, b.source) == (utc_ms(2026, 7, 8, 9, 31, 0), "warning", "events")
    forged = from_rankscope([{"name": "GPU Xid 79", "host": "h", "source": "alertmanager/noc"}], now)
    assert forged.rows[0].source == "events/alertmanager/noc"
    assert from_rankscope([{"name": "x", "host": "h"}], now, origin=None).rows[0].source == "rankscope"
    assert c.time_ms == now
    assert (d.status, d.ends_ms, d.time_ms) == ("resolved", now, a.time_ms)


def test_own_json_refusals():
    tr = from_rankscope([
        {"name": "server port down", "hots": "gpu-node-01294"},
        {"name": "server port down"},
        {"host": "gpu-node-01294"},
        {"name": "x", "host": "h", "time": 1_783_503_000},
        {"name": "x", "host": "h", "time": True},
        {"name": "x", "host": "h", "severity": 3},
        {"name": "x", "host": "h", "ends": "2026-07-08T09:30:00Z"},
    ], now_ms=utc_ms(2026, 7, 8, 12, 0, 0))
    assert tr.rows == []
    reasons = [r.reason for r in tr.refused]
    assert "unknown key(s) 'hots'" in reasons[0]
    assert "names no host" in reasons[1]
    assert reasons[2] == "no name"
    assert "looks like epoch seconds" in reasons[3]
    assert "is not a time" in reasons[4]
    assert "severity must be a string" in reasons[5]
    assert "only for a resolved event" in reasons[6]
    assert "expected a JSON list" in from_rankscope({"name": "x"}, now_ms=0).refused[0].reason


# ------------------------------------------------------------------ rows, frame
def test_times_round_trip_and_bad_rows_refused():
    ms = utc_ms(2026, 7, 8, 9, 30, 0, 123)
    assert parse_time(format_time(ms)) == ms
    assert parse_time(str(ms)) == ms
    with pytest.raises(EventError, match="a firing event has no end"):
        EventRow(time_ms=ms, name="x", host="h", ends_ms=ms)
    with pytest.raises(EventError, match="host is empty"):
        EventRow(time_ms=ms, name="x", host="")


def test_events_frame_has_the_event_measurement_layout():
    rows = from_alertmanager(am_payload([
        am_alert("NodeNetworkDown", {"instance": "gpu-node-01294:9100"}, "2026-07-08T09:30:00Z",
                 status="resolved", ends="2026-07-08T09:40:00Z"),
    ])).rows
    cluster = events_frame(rows)
    assert "job" not in cluster.columns  # cluster events: no job tag at all
    assert cluster.iloc[0].to_dict() == {
        "time": utc_ms(2026, 7, 8, 9, 30, 0), "name": "NodeNetworkDown", "host": "gpu-node-01294",
        "severity": "warning", "source": "alertmanager/rankscope", "rank": -1,
        "text": "NodeNetworkDown", "value": 1, "status": "resolved",
        "ends_ms": utc_ms(2026, 7, 8, 9, 40, 0)}
    assert events_frame(rows, job="il-0477")["job"].tolist() == ["il-0477"]
    assert str(cluster["ends_ms"].dtype) == "int64" and str(cluster["time"].dtype) == "int64"
