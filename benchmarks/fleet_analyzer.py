"""The scheduled analyzer over a stored cluster day, as separate processes (the fleet benchmark).

One process per shard runs ``rankscope analyze --every 5s --heartbeat FILE`` (``-v``: its log
says what each cycle did). Its first cycles catch up with the whole day. One process (shard
0) is killed with SIGKILL once midway, when its cycles have analyzed half of its shard's
iterations, and started again; it rebuilds its state from the database. A process is done
when two cycles in a row end (its heartbeat file, removed before the start, is touched) having
logged no iteration analyzed and no job deferred to the next cycle (a cycle in which a job
fails logs no count for the others: its errors are counted, not waited for); then it is
stopped (SIGINT). ``deadline_s`` sets the analyzer's ``job_deadline_s`` (a config file): a
shorter one spreads the catch-up over more cycles, so the kill lands inside it. Peak resident memory is each process' ``VmHWM``
(``/proc/PID/status``), read until it is stopped; a cycle's time is the wall time between the
scheduler's log lines that begin and end it.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

EVERY_S = 5
POLL_S = 0.2
_ANALYZED = re.compile(r"cycle: (.*?); read ")
_CYCLE = re.compile(r"cycle: .*; read ([\d.]+)s analysis ([\d.]+)s write ([\d.]+)s")
#: The scheduler's own lines around each cycle (``-v``): when it began and when it ended.
_RUN = re.compile(r"^(\S+ \S+) INFO apscheduler\.executors\.default: (Running job|Job .*(?:executed successfully|"
                  r"raised an exception))", re.M)
_DEFERRED = re.compile(r"deadline of \S+ reached")
_ERROR = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) (.*)$", re.M)


@dataclass
class Proc:
    """One analyzer process and what was seen of it."""

    shard: str | None
    log: Path
    heartbeat: Path
    popen: subprocess.Popen
    peak_kib: int = 0
    touched: float = 0.0
    counts: list[tuple[int, int]] = field(default_factory=list)   # (cycles logged, deferrals) at each touch

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def analyzed(self) -> int:
        """Iterations analyzed so far, as its cycles logged them."""
        return sum(int(n) for line in _ANALYZED.findall(self.text()) for n in re.findall(r": (\d+) it\b", line))

    def cycles_s(self) -> list[float]:
        """Each cycle's wall time (s), from the scheduler's lines that begin and end it."""
        out, began = [], None
        for stamp, what in _RUN.findall(self.text()):
            t = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if what == "Running job":
                began = t
            elif began is not None:
                out.append(t - began)
                began = None
        return out

    def errors(self) -> list[str]:
        return [m[1] for m in _ERROR.findall(self.text())]

    def sample(self) -> None:
        """Peak memory so far; a heartbeat touched since the last sample (a cycle ended)."""
        try:
            status = Path(f"/proc/{self.popen.pid}/status").read_text()
            self.peak_kib = max(self.peak_kib, int(re.search(r"VmHWM:\s+(\d+)", status).group(1)))
        except (OSError, AttributeError):
            pass
        try:
            mtime = self.heartbeat.stat().st_mtime
        except OSError:
            return
        if mtime != self.touched:
            self.touched = mtime
            text = self.text()
            self.counts.append((len(_CYCLE.findall(text)), len(_DEFERRED.findall(text))))

    @property
    def done(self) -> bool:
        """Two cycles in a row ended (after the start's touch) that analyzed nothing and
        deferred nothing: caught up (or stuck on errors, which the report lists)."""
        return len(self.counts) >= 3 and self.counts[-1] == self.counts[-2] == self.counts[-3]

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            self.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@dataclass
class AnalyzerRun:
    """What the analyzer processes of one configuration did."""

    shards: int
    wall_s: float
    killed_at_s: float | None
    killed_after: int
    midway: bool
    peak_rss_mib: float
    longest_cycle_s: float
    catch_up_s: list[float]
    errors: list[str]
    timed_out: bool = False


def _start(url: str, bucket: str, shard: str | None, folder: Path, tag: str, config: Path | None) -> Proc:
    log, beat = folder / f"analyze-{tag}.log", folder / f"heartbeat-{tag}"
    beat.unlink(missing_ok=True)   # a file of an earlier run is no heartbeat of this one
    cmd = [sys.executable, "-m", "rankscope.cli", "-v", "analyze", "--store", url, "--bucket", bucket,
           "--every", f"{EVERY_S}s", "--heartbeat", str(beat), "--quiet", *(["--shard", shard] if shard else []),
           *(["--config", str(config)] if config else [])]
    env = {k: v for k, v in os.environ.items() if k not in ("RANKSCOPE_SHARD", "RANKSCOPE_HEARTBEAT")}
    with open(log, "wb") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Proc(shard, log, beat, popen)


def run_analyzers(url: str, bucket: str, shards: int, iterations: list[int], folder: Path,
                  kill: bool = True, timeout_s: float = 6 * 3600, deadline_s: float | None = None) -> AnalyzerRun:
    """Run ``shards`` analyzer processes over ``bucket`` until each has caught up, shard 0's
    killed (SIGKILL) and restarted once when its cycles have analyzed half of its shard's
    ``iterations`` (or, should one cycle take it all, once it has caught up: not midway)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = None
    if deadline_s is not None:
        config = folder / "analyzer.toml"
        config.write_text(f"[analyzer]\njob_deadline_s = {float(deadline_s)}\n", encoding="utf-8")
    specs = [f"{k}/{shards}" if shards > 1 else None for k in range(shards)]
    procs = [_start(url, bucket, s, folder, f"{shards}-{k}", config) for k, s in enumerate(specs)]
    everyone = list(procs)
    t0, killed_at = time.monotonic(), None
    want, killed_after, midway = max(1, iterations[0] // 2), 0, False
    while time.monotonic() - t0 < timeout_s:
        for p in procs:
            p.sample()
        if kill and killed_at is None and ((killed_after := procs[0].analyzed()) >= want or procs[0].done):
            # midway: a good part of its shard's iterations still to analyze (not a first cycle
            # that caught up with nearly all of them)
            midway = not procs[0].done and killed_after < 0.9 * iterations[0]
            procs[0].stop(signal.SIGKILL)
            killed_at = time.monotonic() - t0
            procs[0] = _start(url, bucket, specs[0], folder, f"{shards}-0-restarted", config)
            everyone.append(procs[0])
        if all(p.done or p.popen.poll() is not None for p in procs) and (killed_at is not None or not kill):
            break
        time.sleep(POLL_S)
    timed_out = time.monotonic() - t0 >= timeout_s
    for p in procs:
        p.sample()
        p.stop()
    wall = time.monotonic() - t0
    cycles = [c for p in everyone for c in p.cycles_s()]
    return AnalyzerRun(shards, wall, killed_at, killed_after, midway, max(p.peak_kib for p in everyone) / 1024,
                       max(cycles, default=0.0), [c[0] for p in everyone if (c := p.cycles_s())],
                       [e for p in everyone for e in p.errors()], timed_out)
