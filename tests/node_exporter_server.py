"""Real node_exporters (Debian's ``prometheus-node-exporter``, 1.5) serving NCCL Inspector's
textfiles, and a real Prometheus (Debian's ``prometheus``) scraping them, for the end-to-end
test of ``import-nccl --prometheus``.

Each :class:`NodeExporter` stands for one machine: only its textfile collector runs
(``--collector.disable-defaults --collector.textfile``), on the folder where that machine's
Inspector writes, listening on a free 127.0.0.1 port. :class:`ScrapingPrometheus` scrapes them
every :data:`SCRAPE_INTERVAL` with its TSDB in a temporary folder. A missing program is an
error that says what to install, never a skipped test.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.alertmanager_server import PrometheusProcess, _http, _stop, _wait_ready
from tests.influx_server import free_port

#: Debian installs the program under this name; upstream's tarball calls it ``node_exporter``.
PROGRAMS = ("prometheus-node-exporter", "node_exporter")
#: Prometheus scrapes this often here (a cluster: 15-30 s, as often as the Inspector dumps).
SCRAPE_INTERVAL = "250ms"


def find_node_exporter() -> str:
    for name in PROGRAMS:
        exe = shutil.which(name)
        if exe:
            return exe
    raise RuntimeError("node_exporter not found (neither prometheus-node-exporter nor node_exporter on PATH): "
                       "install Debian's 'prometheus-node-exporter' package (make test does: make node-exporter)")


class NodeExporter:
    """One node_exporter reading ``textfile_dir`` with its textfile collector only."""

    def __init__(self, textfile_dir: Path, log_path: Path) -> None:
        self.textfile_dir = textfile_dir
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> NodeExporter:
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [find_node_exporter(), "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={self.textfile_dir}", "--web.disable-exporter-metrics",
             f"--web.listen-address={self.address}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        _wait_ready(self.proc, f"http://{self.address}/metrics", "node_exporter", self.log_path, timeout_s)
        return self

    def metrics(self) -> str:
        status, body = _http("GET", f"http://{self.address}/metrics")
        assert status == 200, body
        return body if isinstance(body, str) else str(body)

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()


def scrape_config(targets: list[str], interval: str = SCRAPE_INTERVAL) -> str:
    """Prometheus scraping the node_exporters at ``targets`` (host:port) every ``interval``."""
    listed = ", ".join(f'"{t}"' for t in targets)
    return f"""\
global:
  scrape_interval: {interval}
  scrape_timeout: {interval}
scrape_configs:
  - job_name: node
    static_configs:
      - targets: [{listed}]
"""


class ScrapingPrometheus(PrometheusProcess):
    """One Prometheus on a free loopback port scraping ``targets``, its TSDB in ``root``."""

    def __init__(self, targets: list[str], root: Path) -> None:
        super().__init__(scrape_config(targets), root, ("--log.level=warn",))
