"""A real ``influxd`` (Debian's influxdb 1.x package) for the test suite.

Started with its data in a temporary folder on free 127.0.0.1 ports, waited for
on ``/ping``, stopped at the end. ``RANKSCOPE_TEST_INFLUX_URL`` points the suite
at an external server instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

CONFIG = """\
reporting-enabled = false
bind-address = "127.0.0.1:{rpc_port}"
[meta]
  dir = "{root}/meta"
  logging-enabled = false
[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  query-log-enabled = false
  cache-max-memory-size = "2g"
[monitor]
  store-enabled = false
[http]
  bind-address = "127.0.0.1:{http_port}"
  log-enabled = false
  max-body-size = 0
[logging]
  level = "warn"
[continuous_queries]
  enabled = false
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InfluxServer:
    """One influxd process; ``url`` once started."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rankscope-influx-"))
        self.http_port = free_port()
        self.rpc_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> InfluxServer:
        exe = shutil.which("influxd")
        if exe is None:
            raise RuntimeError(
                "influxd not found: install Debian's 'influxdb' package (make test does), "
                "or set RANKSCOPE_TEST_INFLUX_URL to a running server")
        conf = self.root / "influxdb.conf"
        conf.write_text(CONFIG.format(root=self.root, http_port=self.http_port, rpc_port=self.rpc_port))
        self.log = open(self.root / "influxd.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([exe, "-config", str(conf)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"influxd exited early: {(self.root / 'influxd.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/ping", timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"influxd did not answer /ping within {timeout_s}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def external_url() -> str | None:
    return os.environ.get("RANKSCOPE_TEST_INFLUX_URL") or None


def server_or_external(server_class: type[InfluxServer] = InfluxServer) -> tuple[InfluxServer | None, str]:
    """``(server, url)``: RANKSCOPE_TEST_INFLUX_URL's server (``server`` None: not ours to stop),
    else a ``server_class`` started here (the caller cleans it up)."""
    url = external_url()
    if url is not None:
        return None, url
    server = server_class().start()
    return server, server.url
