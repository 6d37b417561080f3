"""`rankscope analyze --every` with --config: thresholds change while it runs, a bad file does not.

The real command runs in its own process against an embedded store; the test waits for what it
logs (bounded waits on lines, no sleeps) and reads the incidents it writes.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rankscope import schema
from rankscope.store import EmbeddedStore
from simulator.cluster import ClusterSimulator
from simulator.scenario import load_scenario

START = 1_770_000_000_000


class Log:
    """The lines a process writes to stderr, waited for one by one."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self.lines.put(line)

    def wait_for(self, text: str, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                tail = "".join(x for x in self.seen[-40:] if "apscheduler" not in x)
                raise AssertionError(f"no log line with {text!r} in {timeout_s:g} s; saw: {tail}") from None
            self.seen.append(line)
            if text in line:
                return line


def wait_iterations(log: Log, n: int) -> None:
    """Until the analyzer's cycles have processed ``n`` more iterations (the writes race with
    the cycles, so they may come in several cycles)."""
    done = 0
    while done < n:
        line = log.wait_for("cycle: compute-slowdown: ")
        done += int(re.search(r"compute-slowdown: (\d+) it", line).group(1))
    assert done == n


def _write(store, sim, n):
    for _ in range(n):
        res = sim.step()
        store.write_stage_latency(sim.frame(res, time_ms=START + 30_000 * res.iteration))


def test_reload_while_running(tmp_path: Path):
    db = tmp_path / "store.db"
    config = tmp_path / "analyzer.toml"
    config.write_text("[analyzer]\nabs_ratio = 5.0\nmin_change = 3.0\nspike_ratio = 5.0\n")
    store = EmbeddedStore(db)
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=60)  # rank 1379 x2.5 from 20
    sim = ClusterSimulator(scenario)
    _write(store, sim, 26)
    env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_STORE"}
    proc = subprocess.Popen([sys.executable, "-m", "rankscope.cli", "-v", "analyze", "--every", "1s",
                             "--config", str(config), "--store", str(db), "--quiet"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    log = Log(proc)
    try:
        wait_iterations(log, 26)
        assert not len(store.read(schema.INCIDENT, scenario.job))     # x2.5 is below these thresholds
        config.write_text("[analyzer]\nabs_ratio = 'high'\n")
        assert "abs_ratio" in log.wait_for("config reload refused")
        _write(store, sim, 4)
        wait_iterations(log, 4)
        assert not len(store.read(schema.INCIDENT, scenario.job))     # the old thresholds stayed
        config.write_text("[analyzer]\n")                             # the defaults again
        proc.send_signal(signal.SIGHUP)                               # (a reload on request, too)
        changed = log.wait_for("reloaded:")
        assert "abs_ratio 5.0 -> 1.5" in changed
        _write(store, sim, 8)
        log.wait_for("incident cs-")
        stored = store.read(schema.INCIDENT, scenario.job)
        assert stored["id"].unique().tolist() == ["cs-30-r1379"] or len(stored["id"].unique()) == 1
        assert stored["ranks"].iloc[-1] == "1379"
    finally:
        proc.terminate()
        proc.wait(30)
        store.close()
