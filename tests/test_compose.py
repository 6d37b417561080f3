"""compose.yaml, Dockerfile and .env.example hang together (Docker cannot run here)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from analyzer.service.shards import Shard
from dashboards import provisioning
from rankscope.cli import build_parser
from rankscope.config import LONG_POLICY, RAW_POLICY, Retention, store_settings
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
ENV_EXAMPLE = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?[-?][^}]*)?\}")
#: The analyzer services: 2 shards, shard 1 run by a high-availability pair.
ANALYZERS = ("analyzer-0", "analyzer-1", "analyzer-1-ha")


def _env(service: str) -> dict[str, str]:
    env = SERVICES[service].get("environment") or {}
    return {k: str(v) for k, v in env.items()}


def _substitute(value: str) -> str:
    """Compose's interpolation with the values of .env.example."""
    return INTERPOLATION.sub(lambda m: ENV_EXAMPLE.get(m.group(1), ""), value)


def test_services_and_pinned_images():
    assert set(SERVICES) == {"influxdb", "influxdb-setup", "grafana", "collector", *ANALYZERS, "events"}
    assert SERVICES["influxdb"]["image"] == "influxdb:2.9"
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", SERVICES["grafana"]["image"])
    for name in ("collector", *ANALYZERS, "events"):
        assert SERVICES[name]["build"] == "." and SERVICES[name]["image"] == "rankscope:local"


def test_ports_bound_to_localhost_only():
    ports = [p for s in SERVICES.values() for p in s.get("ports", [])]
    assert ports and all(str(p).startswith("127.0.0.1:") for p in ports)


def test_bind_mounts_exist_and_provisioning_is_read_only():
    binds = []
    for name, svc in SERVICES.items():
        for vol in svc.get("volumes", []):
            src, target, *mode = vol.split(":")
            if src.startswith("."):
                binds.append((name, src, target, mode))
                assert (ROOT / src).exists(), f"{name}: {src} does not exist"
                assert mode == ["ro"], f"{name}: {src} must be mounted read-only"
            else:
                assert src in COMPOSE["volumes"], f"{name}: named volume {src} is not declared"
    targets = {src: target for _, src, target, _ in binds}
    assert targets["./dashboards/provisioning"] == "/etc/grafana/provisioning"
    assert targets["./dashboards/generated"] == provisioning.GRAFANA_DASHBOARD_PATH
    for sub in ("datasources", "dashboards", "alerting"):
        assert any((ROOT / "dashboards/provisioning" / sub).glob("*.yaml")), sub
    home = _env("grafana")["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards/generated" / Path(home).name).exists()


def test_influxdb_initialised_from_the_env_file():
    env = _env("influxdb")
    for key in ("MODE", "USERNAME", "PASSWORD", "ORG", "BUCKET", "ADMIN_TOKEN"):
        assert f"DOCKER_INFLUXDB_INIT_{key}" in env
    assert env["DOCKER_INFLUXDB_INIT_MODE"] == "setup"
    assert _substitute(env["DOCKER_INFLUXDB_INIT_BUCKET"]) == "rankscope"


def test_every_interpolated_variable_is_in_env_example():
    text = (ROOT / "compose.yaml").read_text()
    used = set(INTERPOLATION.findall(text))
    assert used and used <= set(ENV_EXAMPLE), used - set(ENV_EXAMPLE)


def test_grafana_gets_every_variable_the_datasource_file_reads():
    ds_text = (ROOT / "dashboards/provisioning/datasources/rankscope.yaml").read_text()
    wanted = set(INTERPOLATION.findall(ds_text))
    assert {"INFLUXDB_URL", "RANKSCOPE_BUCKET", "INFLUXDB_V2_TOKEN"} <= wanted
    assert wanted <= set(_env("grafana"))


@pytest.mark.parametrize("name,command", [
    ("collector", ["simulate", "il-0477", "--live"]),
    ("analyzer-0", ["analyze", "--every", "30s", "--shard", "0/2", "--heartbeat", "/tmp/rankscope-heartbeat"]),
    ("analyzer-1", ["analyze", "--every", "30s", "--shard", "1/2", "--heartbeat", "/tmp/rankscope-heartbeat"]),
    ("analyzer-1-ha", ["analyze", "--every", "30s", "--shard", "1/2", "--heartbeat", "/tmp/rankscope-heartbeat"]),
    ("events", ["events", "serve", "--listen", "0.0.0.0:9095"]),
])
def test_rankscope_services_run_real_commands_with_the_env_rankscope_reads(name, command):
    svc = SERVICES[name]
    assert svc["command"] == ["rankscope", *command]
    args = build_parser().parse_args(svc["command"][1:])  # the command exists and its options parse
    assert callable(args.func)
    env = {k: _substitute(v) for k, v in _env(name).items()}
    assert {"RANKSCOPE_STORE", "RANKSCOPE_BUCKET", "INFLUXDB_V2_TOKEN", "INFLUXDB_V2_ORG"} <= set(env)
    settings = store_settings(env=env)
    assert settings.is_influx and settings.location == "http://influxdb:8086"
    assert settings.bucket == "rankscope" and settings.token and settings.org == "rankscope"
    assert svc["depends_on"]["influxdb"]["condition"] == "service_healthy"


def test_events_receiver_listens_in_the_network_and_is_published_on_loopback():
    svc = SERVICES["events"]
    args = build_parser().parse_args(svc["command"][1:])
    host, port = args.listen
    assert host == "0.0.0.0"  # other containers (Alertmanager, Grafana) reach it by service name
    assert svc["ports"] == [f"127.0.0.1:{port}:{port}"]
    env = dict(svc["environment"])
    token = env.pop("RANKSCOPE_EVENTS_TOKEN")
    assert env == SERVICES["analyzer-0"]["environment"]  # same store, same secrets
    assert token.startswith("${RANKSCOPE_EVENTS_TOKEN:?")  # required: the receiver is never open
    probe = " ".join(svc["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/healthz" in probe


def test_dockerfile_installs_every_package_of_the_project():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert re.search(r"^RUN pip install \.", text, re.M)
    packages = ("rankscope", "collector", "simulator", "analyzer", "dashboards", "evaluation",
                "events", "actions")
    for pkg in packages:
        assert re.search(rf"^COPY {pkg} \./{pkg}$", text, re.M), pkg
    pyproject = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"include = \[(.*?)\]", pyproject).group(1)
    assert {p.strip(' "*') for p in include.split(",")} == set(packages)
    assert "USER " in text


def test_the_analyzers_cover_every_shard_once_and_one_twice():
    """2 shards: each analyzed, shard 1 by two replicas (HA) that differ in nothing else; the
    job the collector writes falls in the HA shard; each replica's healthcheck reads the
    heartbeat file its command touches."""
    parsed = {name: build_parser().parse_args(SERVICES[name]["command"][1:]) for name in ANALYZERS}
    shards = {name: args.shard for name, args in parsed.items()}
    assert {s.count for s in shards.values()} == {2}
    assert sorted(s.index for s in shards.values()) == [0, 1, 1]
    assert shards["analyzer-1"] == shards["analyzer-1-ha"] == Shard(1, 2)
    assert SERVICES["analyzer-1"] == SERVICES["analyzer-1-ha"]   # the pair: the same service twice
    scenario = build_parser().parse_args(SERVICES["collector"]["command"][1:]).scenario
    assert Shard(1, 2).owns(load_scenario(scenario).job)
    for name, args in parsed.items():
        assert args.every == 30 and args.once is False
        probe = " ".join(SERVICES[name]["healthcheck"]["test"])
        assert f"os.path.getmtime('{args.heartbeat}')" in probe
        assert SERVICES[name]["restart"] == "unless-stopped"


# ----------------------------------------------------------- retention and alert routing
def test_raw_and_long_buckets_take_their_retention_from_the_env_file():
    assert _substitute(_env("influxdb")["DOCKER_INFLUXDB_INIT_RETENTION"]) == ENV_EXAMPLE["RANKSCOPE_RAW_RETENTION"]
    setup = {k: _substitute(v) for k, v in _env("influxdb-setup").items()}
    assert (setup["RAW_RETENTION"], setup["LONG_RETENTION"]) == ("7d", "400d") == (
        ENV_EXAMPLE["RANKSCOPE_RAW_RETENTION"], ENV_EXAMPLE["RANKSCOPE_LONG_RETENTION"])
    assert setup["BUCKET"] == "rankscope" and setup["INFLUX_HOST"] == "http://influxdb:8086"
    assert SERVICES["influxdb-setup"]["image"] == SERVICES["influxdb"]["image"]   # the same influx CLI
    assert SERVICES["influxdb-setup"]["depends_on"]["influxdb"]["condition"] == "service_healthy"
    for name in ("grafana", "collector", *ANALYZERS, "events"):   # nothing writes or reads before it ran
        assert SERVICES[name]["depends_on"]["influxdb-setup"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("name", ["collector", *ANALYZERS, "events"])
def test_rankscope_services_route_to_the_long_bucket_with_the_env_files_durations(name):
    settings = store_settings(env={k: _substitute(v) for k, v in _env(name).items()})
    assert settings.retention == Retention("7d", "400d")


_INFLUX_STUB = """#!/bin/sh
# a stand-in influx CLI: buckets and DBRP mappings in files, every call logged
echo "$*" >> "$STATE/calls"
case "$1 $2" in
  "bucket list") grep -F -x -- "$4" "$STATE/buckets" >/dev/null 2>&1 && printf 'id-%s\t%s\t7d\n' "$4" "$4" ;;
  "bucket create") echo "$4" >> "$STATE/buckets" ;;
  "bucket update") ;;
  "v1 dbrp") case "$3" in
      list) grep -F -x -- "$5 $7" "$STATE/dbrps" 2>/dev/null || true ;;
      create) echo "$5 $7" >> "$STATE/dbrps" ;;
    esac ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


def test_influxdb_setup_makes_the_long_bucket_and_both_mappings_once(tmp_path):
    """The setup step's shell, run with a stub influx CLI, twice (it runs on every `up`)."""
    svc = SERVICES["influxdb-setup"]
    assert svc["entrypoint"][:2] == ["/bin/sh", "-euc"]
    script = svc["command"][0].replace("$$", "$")   # compose's escape of a literal $
    state = tmp_path / "state"
    state.mkdir()
    (state / "buckets").write_text("rankscope\n")   # made by the image's DOCKER_INFLUXDB_INIT_*
    stub = tmp_path / "bin" / "influx"
    stub.parent.mkdir()
    stub.write_text(_INFLUX_STUB)
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin", "STATE": str(state),
           **{k: _substitute(v) for k, v in _env("influxdb-setup").items()}}
    for _ in range(2):
        subprocess.run([shutil.which("sh"), "-euc", script], env=env, check=True, timeout=30)
    calls = (state / "calls").read_text().splitlines()
    assert (state / "buckets").read_text().split() == ["rankscope", f"rankscope/{LONG_POLICY}"]
    assert [c for c in calls if c.startswith("bucket create")] == [
        "bucket create --name rankscope/long --retention 400d"]
    updates = [c for c in calls if c.startswith("bucket update")]
    assert updates[:2] == ["bucket update --id id-rankscope --retention 7d",
                           "bucket update --id id-rankscope/long --retention 400d"] and len(updates) == 4
    assert (state / "dbrps").read_text().split("\n")[:2] == [f"rankscope {RAW_POLICY}", f"rankscope {LONG_POLICY}"]
    creates = [c for c in calls if c.startswith("v1 dbrp create")]
    assert creates == ["v1 dbrp create --db rankscope --rp raw --default --bucket-id id-rankscope",
                       "v1 dbrp create --db rankscope --rp long --bucket-id id-rankscope/long"]


def test_grafana_gets_every_variable_the_contact_points_read():
    text = (ROOT / "dashboards/provisioning/alerting/notifications.yaml").read_text()
    wanted = set(INTERPOLATION.findall(text))
    assert wanted == {"RANKSCOPE_ALERT_WEBHOOK_URL", "RANKSCOPE_EVENTS_URL", "RANKSCOPE_EVENTS_TOKEN"}
    env = _env("grafana")
    assert wanted <= set(env)
    # the events contact point is the events service's Grafana endpoint, with the receiver's own token
    host, port = build_parser().parse_args(SERVICES["events"]["command"][1:]).listen
    assert env["RANKSCOPE_EVENTS_URL"] == f"http://events:{port}/grafana"
    assert env["RANKSCOPE_EVENTS_TOKEN"] == _env("events")["RANKSCOPE_EVENTS_TOKEN"]
    assert env["RANKSCOPE_ALERT_WEBHOOK_URL"].startswith("${RANKSCOPE_ALERT_WEBHOOK_URL:?")   # required

