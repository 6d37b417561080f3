"""A real Alertmanager in the loop: alerts posted to its API as Prometheus posts them reach
``rankscope events serve`` as Alertmanager's own webhook payload, firing and then resolved,
and the analyzer judges them against an incident on the real InfluxDB. Then a real
Prometheus in front of it, evaluating ``up == 0`` for a target that stops answering."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from analyzer.service.run_once import run_once
from rankscope import schema
from rankscope.http_credentials import PASSWORD_ENV, USER_ENV
from rankscope.store import InfluxStore
from rankscope.times import format_time
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.alertmanager_server import (
    DOC_TOKEN_FILE,
    DOC_URL,
    PROMETHEUS_RULES,
    AlertmanagerServer,
    EventsServe,
    MetricsTarget,
    PrometheusServer,
    alertmanager_config,
    find_program,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "alertmanager/rankscope"


@pytest.fixture
def events_serve(influx_url, influx_store, tmp_path):
    server = EventsServe(influx_url, influx_store.bucket, tmp_path,
                         env={"RANKSCOPE_INFLUX_API": "v1"}).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def alertmanager(events_serve, tmp_path):
    root = tmp_path / "alertmanager"
    root.mkdir()
    server = AlertmanagerServer(events_serve.url + "/alertmanager", events_serve.token, root).start()
    try:
        yield server
    finally:
        server.stop()


def prometheus_alert(name: str, host: str, severity: str, summary: str, starts_ms: int,
                     ends_ms: int) -> dict:
    """One alert as Prometheus posts it to ``/api/v2/alerts`` (firing: ``endsAt`` a few
    evaluation intervals ahead, refreshed while it fires; resolved: ``endsAt`` in the past)."""
    return {
        "labels": {"alertname": name, "instance": f"{host}:9100", "job": "node",
                   "severity": severity},
        "annotations": {"summary": summary},
        "startsAt": format_time(starts_ms),
        "endsAt": format_time(ends_ms),
        "generatorURL": "http://prometheus.example.org:9090/graph?g0.expr=node_network_up+%3D%3D+0",
    }


def now_ms() -> int:
    return int(time.time() * 1000)


def test_alertmanager_notifications_are_judged_and_resolved(influx_store, events_serve, alertmanager):
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=35)
    start_ms = (now_ms() - 3 * 3600_000) // 60_000 * 60_000
    simulate(scenario, influx_store, start_ms=start_ms, progress=False)
    [culprit_host] = scenario.topology.hosts_of(scenario.faults[0].ranks)
    other_host = scenario.topology.host_names([0])[0]
    assert culprit_host == "gpu-node-00172" and other_host != culprit_host
    times = sorted(influx_store.latest_times(schema.STAGE_LATENCY, scenario.job, 100))
    starts_ms = times[25] + 123                  # after the onset (iteration 20), inside the run

    def alerts(ends_ms: int) -> list[dict]:
        return [
            prometheus_alert("NodeNetworkDown", culprit_host, "critical", "server port down",
                             starts_ms, ends_ms),
            prometheus_alert("NodeNetworkDown", other_host, "critical", "server port down",
                             starts_ms, ends_ms),
            prometheus_alert("ScrapeDurationHigh", culprit_host, "warning", "node_exporter is slow",
                             starts_ms, ends_ms),
            # not routed to rankscope (the route matches warning|critical)
            prometheus_alert("NodeNetworkDown", culprit_host, "info", "server port down",
                             starts_ms + 1000, ends_ms),
        ]

    def events(status: str, n: int = 3):
        back = influx_store.read_events()
        return back if len(back) == n and set(back["status"]) == {status} else None

    def diagnostics() -> str:
        return (f"receiver log:\n{events_serve.log_text()[-3000:]}\n"
                f"alertmanager log:\n{alertmanager.log_text()[-3000:]}\n"
                f"stored: {influx_store.read_events().to_dict('records')}")

    t0 = time.monotonic()
    alertmanager.post_alerts(alerts(ends_ms=now_ms() + 300_000))   # firing, as Prometheus re-sends it
    back = wait_for(lambda: events("firing"), 20, "the firing notifications", diagnostics)
    firing_wait = time.monotonic() - t0
    assert sorted(back["host"]) == sorted([culprit_host, culprit_host, other_host])
    assert sorted(back["name"]) == ["NodeNetworkDown", "NodeNetworkDown", "ScrapeDurationHigh"]
    assert set(back["severity"]) == {"critical", "warning"}        # the info alert never came
    assert set(back["source"]) == {SOURCE} and set(back["time"]) == {starts_ms}
    assert set(back["ends_ms"]) == {-1} and "job" not in back.columns   # cluster events
    assert "server port down" in set(back["text"])
    # Alertmanager's own payload got through the token check and was logged as one line per group
    # (the receiver logs after it stored the points: under load the line may come a moment later)
    assert wait_for(lambda: re.search(r"alertmanager from 127\.0\.0\.1 \(bearer token\): 2 alert\(s\), "
                                      r"2 written", events_serve.log_text()), 10, "the receiver's log line",
                    diagnostics)
    assert events_serve.token not in events_serve.log_text()

    [incident] = [i for i in run_once(influx_store, job=scenario.job) if culprit_host in i["hosts"]]
    assert incident["class"] == "compute_straggler"
    assert sorted((e["name"], e["host"], e["verdict"], e["status"]) for e in incident["events"]) == [
        ("NodeNetworkDown", culprit_host, "contradicted", "firing"),
        ("ScrapeDurationHigh", culprit_host, "unrelated", "firing")]
    # the other host's alert is stored but not attached: it is no culprit
    assert other_host not in [e["host"] for e in incident["events"]]

    ended_ms = now_ms() - 1000
    t1 = time.monotonic()
    alertmanager.post_alerts(alerts(ends_ms=ended_ms))           # the rule stopped firing
    back = wait_for(lambda: events("resolved"), 20, "the resolved notifications", diagnostics)
    resolved_wait = time.monotonic() - t1
    assert len(back) == 3 and set(back["time"]) == {starts_ms}  # rewritten in place, not added
    assert set(back["ends_ms"]) == {ended_ms}

    [incident] = [i for i in run_once(influx_store, job=scenario.job) if culprit_host in i["hosts"]]
    assert sorted((e["name"], e["verdict"], e["status"]) for e in incident["events"]) == [
        ("NodeNetworkDown", "contradicted", "resolved"), ("ScrapeDurationHigh", "unrelated", "resolved")]
    # seconds, not Alertmanager's default minutes
    assert firing_wait < 10 and resolved_wait < 10, (firing_wait, resolved_wait)


def test_prometheus_rule_on_a_stopped_target_fires_and_resolves(influx_store, events_serve,
                                                                 alertmanager, tmp_path):
    """The production path: Prometheus scrapes a machine's exporter, evaluates ``up == 0`` when
    it stops answering, posts the alert to Alertmanager, which notifies the receiver; the
    exporter back, the rule stops firing and the resolved notice rewrites the point."""
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=35)
    [culprit_host] = scenario.topology.hosts_of(scenario.faults[0].ranks)
    target = MetricsTarget().start()
    root = tmp_path / "prometheus"
    root.mkdir()
    prometheus = PrometheusServer(alertmanager.url, target.address, culprit_host, root).start()
    # Prometheus scrapes a new target only after its discovery's 5 s delay: simulate meanwhile
    simulate(scenario, influx_store, start_ms=(now_ms() - 3600_000) // 60_000 * 60_000, progress=False)

    def diagnostics() -> str:
        return (f"receiver log:\n{events_serve.log_text()[-3000:]}\n"
                f"alertmanager log:\n{alertmanager.log_text()[-3000:]}\n"
                f"prometheus log:\n{prometheus.log_text()[-3000:]}\n"
                f"stored: {influx_store.read_events().to_dict('records')}")

    def stored(status: str):
        back = influx_store.read_events()
        return back if len(back) == 1 and back["status"].iloc[0] == status else None

    try:
        wait_for(lambda: prometheus.query('up{job="node"} == 1') or None, 20,
                 "the target scraped", diagnostics)
        t0 = time.monotonic()
        target.stop()                                   # the machine stops answering
        back = wait_for(lambda: stored("firing"), 30, "the firing notification", diagnostics)
        firing_wait = time.monotonic() - t0
        row = back.iloc[0]
        assert (row["name"], row["host"], row["severity"], row["source"], row["ends_ms"]) == (
            "NodeUnreachable", culprit_host, "critical", SOURCE, -1)
        assert row["text"].startswith("node unreachable - ")
        [incident] = [i for i in run_once(influx_store, job=scenario.job) if culprit_host in i["hosts"]]
        assert incident["class"] == "compute_straggler"
        assert [(e["name"], e["verdict"], e["status"]) for e in incident["events"]] == [
            ("NodeUnreachable", "contradicted", "firing")]

        t1 = time.monotonic()
        target.start()                                  # back: up == 1, the rule stops firing
        back = wait_for(lambda: stored("resolved"), 30, "the resolved notification", diagnostics)
        resolved_wait = time.monotonic() - t1
        assert back.iloc[0]["time"] == row["time"] and back.iloc[0]["ends_ms"] > row["time"]
        assert firing_wait < 15 and resolved_wait < 15, (firing_wait, resolved_wait)
    finally:
        prometheus.stop()
        target.stop()


def test_the_documented_configuration_is_the_one_the_test_runs():
    text = (ROOT / "docs" / "events.md").read_text()
    blocks = re.findall(r"<!-- alertmanager-config -->\n```yaml\n(.*?)```", text, re.S)
    assert blocks == [alertmanager_config(DOC_URL, DOC_TOKEN_FILE)], (
        "docs/events.md's Alertmanager configuration differs from tests/alertmanager_server.py's "
        "alertmanager_config(DOC_URL, DOC_TOKEN_FILE): paste its output after <!-- alertmanager-config -->")


def test_alertmanager_accepts_the_documented_configuration(tmp_path):
    """Alertmanager's own checker reads the documented file (with a token file that exists)."""
    token = tmp_path / "token"
    token.write_text("x")
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(alertmanager_config(DOC_URL, str(token)))
    amtool = Path(find_program()).with_name("amtool")
    assert amtool.exists(), f"{amtool} missing: Debian's prometheus-alertmanager package ships it"
    result = subprocess.run([str(amtool), "check-config", str(conf)], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "2 receivers" in result.stdout


def test_a_missing_alertmanager_is_an_error_that_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="install Debian's 'prometheus-alertmanager' package"):
        AlertmanagerServer("http://127.0.0.1:1/alertmanager", "t", tmp_path).start()


def test_a_missing_prometheus_is_an_error_that_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="install Debian's 'prometheus' package"):
        PrometheusServer("http://127.0.0.1:1", "127.0.0.1:2", "gpu-node-00172", tmp_path).start()


def test_promtool_accepts_the_rules_the_test_and_the_documentation_use(tmp_path):
    text = (ROOT / "docs" / "events.md").read_text()
    [documented] = re.findall(r"```yaml\n# rankscope-machine-alerts.yml\n(.*?)```", text, re.S)
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: Debian's prometheus package ships it"
    for name, rules in (("test", PROMETHEUS_RULES), ("documented", documented)):
        path = tmp_path / f"{name}.yml"
        path.write_text(rules)
        result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                                text=True, timeout=30)
        assert result.returncode == 0, (name, result.stdout + result.stderr)
        assert re.search(r"SUCCESS: \d+ rules found", result.stdout), result.stdout


BEARER_BLOCK = ("          authorization:\n            type: Bearer\n"
                "            credentials_file: {token_file}\n")


def basic_auth_config(url: str, user: str, password_file: str) -> str:
    """:func:`alertmanager_config` with ``http_config.basic_auth`` in place of the bearer token."""
    text = alertmanager_config(url, password_file)
    bearer = BEARER_BLOCK.format(token_file=password_file)
    assert bearer in text
    return text.replace(bearer, f"          basic_auth:\n            username: {user}\n"
                                f"            password_file: {password_file}\n")


def test_alertmanager_posts_with_basic_auth_and_a_wrong_password_gets_nothing_in(
        influx_url, influx_store, tmp_path):
    """Alertmanager's ``http_config.basic_auth`` against ``RANKSCOPE_EVENTS_USER`` and
    ``RANKSCOPE_EVENTS_PASSWORD``: its notification is written and logged with the user; one
    with a wrong password is refused (401) and writes nothing."""
    user, password = "alertmanager", secrets.token_hex(16)
    serve = EventsServe(influx_url, influx_store.bucket, tmp_path,
                        env={"RANKSCOPE_INFLUX_API": "v1", USER_ENV: user, PASSWORD_ENV: password})
    serve.start()
    managers = []
    try:
        for name, secret in (("wrong", password + "x"), ("right", password)):
            root = tmp_path / name
            root.mkdir()
            am = AlertmanagerServer(serve.url + "/alertmanager", secret, root)
            am.config_text = basic_auth_config(serve.url + "/alertmanager", user, str(am.token_file))
            managers.append(am.start())
            starts = now_ms() - 60_000 + len(managers)
            am.post_alerts([prometheus_alert("NodeNetworkDown", f"gpu-node-{name}", "critical",
                                             "server port down", starts, now_ms() + 300_000)])
        def stored():   # a store of its own: the database did not exist when the test's looked
            with InfluxStore(influx_url, influx_store.bucket, api="v1") as store:
                back = store.read_events()
            return back if len(back) else None

        back = wait_for(stored, 20, "the notification with the right password", serve.log_text)
        wait_for(lambda: True if "refused, missing or wrong credentials" in serve.log_text() else None,
                 20, "the refusal of the wrong password", serve.log_text)
        time.sleep(1)                                   # (had the wrong one got in, it would show)
        back = stored()
        assert back["host"].tolist() == ["gpu-node-right"] and back["source"].tolist() == [SOURCE]
        assert f"(basic user {user}): 1 alert(s), 1 written" in serve.log_text()
        assert password not in serve.log_text()
    finally:
        for am in managers:
            am.stop()
        serve.stop()


def test_alertmanager_accepts_the_basic_auth_configuration(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("x")
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(basic_auth_config(DOC_URL, "alertmanager", str(secret)))
    amtool = Path(find_program()).with_name("amtool")
    result = subprocess.run([str(amtool), "check-config", str(conf)], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
