"""A real Alertmanager (Debian's ``prometheus-alertmanager`` package) posting to a real
``rankscope events serve``, for the end-to-end events tests.

:func:`alertmanager_config` is the one place the configuration is written: the harness
starts Alertmanager with it and docs/events.md shows it (``tests/test_alertmanager.py``
compares the two). Alertmanager runs on a free 127.0.0.1 port with clustering disabled and
its data in a temporary folder; the receiver runs as the command operators start, with its
bearer token from ``RANKSCOPE_EVENTS_TOKEN``. A missing program is an error that says what
to install, never a skipped test.

:class:`PrometheusServer` (Debian's ``prometheus``) scrapes a :class:`MetricsTarget` standing
in for a machine's exporter and posts the alerts of :data:`PROMETHEUS_RULES` to Alertmanager,
the production path in front of it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.influx_server import free_port

#: Debian installs the program under this name; upstream's tarball calls it ``alertmanager``.
PROGRAMS = ("prometheus-alertmanager", "alertmanager")

#: What docs/events.md shows in place of the test's receiver address and token file.
DOC_URL = "http://127.0.0.1:9095/alertmanager"
DOC_TOKEN_FILE = "/etc/alertmanager/rankscope-events-token"

#: Alertmanager's defaults are 30s / 5m / 4h / 5m; the test waits seconds, not minutes.
TEST_TIMINGS = {"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h",
                "resolve_timeout": "1m"}


def alertmanager_config(url: str, token_file: str, *, group_wait: str = TEST_TIMINGS["group_wait"],
                        group_interval: str = TEST_TIMINGS["group_interval"],
                        repeat_interval: str = TEST_TIMINGS["repeat_interval"],
                        resolve_timeout: str = TEST_TIMINGS["resolve_timeout"]) -> str:
    """The Alertmanager configuration (YAML) that sends machine alerts to the receiver at ``url``
    with the bearer token read from ``token_file``."""
    return f"""\
global:
  resolve_timeout: {resolve_timeout}         # an alert posted without endsAt ends after this

route:
  receiver: default
  group_by: [alertname]
  group_wait: {group_wait}              # first notification of a new group
  group_interval: {group_interval}          # changes to a group (new alerts, resolved ones)
  repeat_interval: {repeat_interval}         # unchanged groups are not re-sent sooner
  routes:
    - receiver: rankscope
      matchers:
        - severity =~ "warning|critical"
      continue: true                 # the alerts still reach their usual receivers

receivers:
  - name: default
  - name: rankscope
    webhook_configs:
      - url: {url}
        send_resolved: true          # a resolved notice marks the event resolved
        http_config:
          authorization:
            type: Bearer
            credentials_file: {token_file}
"""


def find_program() -> str:
    for name in PROGRAMS:
        exe = shutil.which(name)
        if exe:
            return exe
    raise RuntimeError(
        "alertmanager not found (neither prometheus-alertmanager nor alertmanager on PATH): "
        "install Debian's 'prometheus-alertmanager' package (make test does: make alertmanager)")


def _http(method: str, url: str, body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # loopback: no proxy
    try:
        with opener.open(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def _wait_ready(proc: subprocess.Popen, url: str, what: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early (code {proc.returncode}): "
                               f"{log.read_text(errors='replace')[-2000:]}")
        try:
            if _http("GET", url, timeout=1)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer {url} within {timeout_s}s: "
                       f"{log.read_text(errors='replace')[-2000:]}")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class EventsServe:
    """``rankscope events serve`` as a process on a free loopback port, writing to ``store``
    (an InfluxDB URL) / ``bucket``, with a fresh bearer token in its environment."""

    def __init__(self, store: str, bucket: str, root: Path, env: dict[str, str] | None = None) -> None:
        self.store, self.bucket, self.root = store, bucket, root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(32)
        self.env = env or {}
        self.log_path = root / "events-serve.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> EventsServe:
        exe = Path(sys.executable).with_name("rankscope")
        if not exe.exists():
            raise RuntimeError(f"{exe} not found: install the project (make test does: pip install -e .)")
        env = {**os.environ, **self.env, "RANKSCOPE_EVENTS_TOKEN": self.token}
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(exe), "events", "serve", "--listen", f"127.0.0.1:{self.port}",
             "--store", self.store, "--bucket", self.bucket],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        _wait_ready(self.proc, self.url + "/healthz", "rankscope events serve", self.log_path, timeout_s)
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()


class AlertmanagerServer:
    """One Alertmanager process whose webhook is ``receiver_url``; ``url`` once started."""

    def __init__(self, receiver_url: str, token: str, root: Path | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="rankscope-alertmanager-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token_file = self.root / "rankscope-events-token"
        self.token_file.write_text(token)
        self.token_file.chmod(0o600)
        self.config_text = alertmanager_config(receiver_url, str(self.token_file))
        self.log_path = self.root / "alertmanager.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> AlertmanagerServer:
        exe = find_program()
        conf = self.root / "alertmanager.yml"
        conf.write_text(self.config_text)
        (self.root / "data").mkdir(exist_ok=True)
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [exe, f"--config.file={conf}", f"--storage.path={self.root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
             f"--web.external-url={self.url}", "--log.level=info"],
            stdout=self.log, stderr=subprocess.STDOUT)
        _wait_ready(self.proc, self.url + "/-/ready", "alertmanager", self.log_path, timeout_s)
        return self

    def post_alerts(self, alerts: list[dict]) -> None:
        """``POST /api/v2/alerts``, as Prometheus sends them."""
        status, answer = _http("POST", self.url + "/api/v2/alerts", alerts)
        if status != 200:
            raise RuntimeError(f"alertmanager refused the alerts ({status}): {answer}")

    def alerts(self) -> list[dict]:
        status, answer = _http("GET", self.url + "/api/v2/alerts")
        assert status == 200, answer
        return answer

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str,
             diagnostics: Callable[[], str] = lambda: "") -> Any:
    """Poll ``condition`` until it returns something other than None; that. Fails after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s\n{diagnostics()}")
        time.sleep(0.1)


#: The rule the Prometheus test evaluates: a machine whose exporter stops answering.
PROMETHEUS_RULES = """\
groups:
  - name: machines
    interval: 1s
    rules:
      - alert: NodeUnreachable
        expr: up{job="node"} == 0
        labels:
          severity: critical
        annotations:
          summary: node unreachable
          description: "{{ $labels.instance }} ({{ $labels.host }}) does not answer scrapes"
"""


def prometheus_config(alertmanager: str, target: str, host: str, rule_file: str) -> str:
    """Prometheus scraping ``target`` (labelled with the machine's ``host``) every second,
    evaluating ``rule_file`` and posting its alerts to the Alertmanager at ``alertmanager``
    (host:port)."""
    return f"""\
global:
  scrape_interval: 1s
  scrape_timeout: 500ms
  evaluation_interval: 1s
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["{alertmanager}"]
rule_files: ["{rule_file}"]
scrape_configs:
  - job_name: node
    static_configs:
      - targets: ["{target}"]
        labels:
          host: {host}
"""


class PrometheusProcess:
    """One Prometheus process (Debian's ``prometheus`` package) on a free loopback port running
    ``config_text``, its TSDB in ``root``, with ``args`` added to its command line."""

    def __init__(self, config_text: str, root: Path, args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_text = config_text
        self.args = args
        self.log_path = root / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> PrometheusProcess:
        exe = shutil.which("prometheus")
        if exe is None:
            raise RuntimeError("prometheus not found: install Debian's 'prometheus' package "
                               "(make test does: make prometheus)")
        conf = self.root / "prometheus.yml"
        conf.write_text(self.config_text)
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [exe, f"--config.file={conf}", f"--storage.tsdb.path={self.root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", *self.args],
            stdout=self.log, stderr=subprocess.STDOUT)
        _wait_ready(self.proc, self.url + "/-/ready", "prometheus", self.log_path, timeout_s)
        return self

    def query(self, expr: str) -> list[dict]:
        status, answer = _http("GET", self.url + "/api/v1/query?query=" + urllib.parse.quote(expr))
        assert status == 200, answer
        return answer["data"]["result"]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()


class PrometheusServer(PrometheusProcess):
    """Prometheus evaluating the ``up == 0`` rule on ``target`` and sending to Alertmanager."""

    def __init__(self, alertmanager_url: str, target: str, host: str, root: Path) -> None:
        rules = root / "rules.yml"
        rules.write_text(PROMETHEUS_RULES)
        super().__init__(prometheus_config(alertmanager_url.removeprefix("http://"), target, host,
                                           str(rules)), root,
                         ("--rules.alert.resend-delay=1s", "--log.level=info"))


class MetricsTarget:
    """A scrape target standing in for a machine's node_exporter: ``GET /metrics`` answers
    while it runs; :meth:`stop` makes the machine unreachable, :meth:`start` brings it back
    on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> MetricsTarget:
        class Metrics(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                body = b"# TYPE node_exporter_build_info gauge\nnode_exporter_build_info 1\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Metrics)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
