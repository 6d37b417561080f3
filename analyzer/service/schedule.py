"""The analyzer as a service: cycles on an APScheduler interval, and what it says while it runs.

One cycle at a time (a cycle that overruns its interval makes the next ones
skip, coalesced); a failing cycle is logged and the next one runs. When a cycle
hangs (a database that stopped answering without refusing), APScheduler would
log "maximum number of running instances reached" at every interval; instead
the analyzer says once, in its own words, that the cycle is waiting on the
database and for how long, and once more when it is over. Before each cycle a
:class:`~analyzer.service.config_watch.ConfigWatcher` may hand over new thresholds.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass

from analyzer.service.after_cycle import AfterCycle
from analyzer.service.analyzer_service import AnalyzerService
from analyzer.service.config_watch import ConfigWatcher
from analyzer.service.cycle_report import CycleFailed

log = logging.getLogger("rankscope.analyze")

#: APScheduler's own message for a skipped run, replaced by :class:`CycleGuard`'s.
_SKIPPED = "maximum number of running instances reached"


@dataclass
class CycleGuard:
    """When the running cycle started, and whether its overrun has been reported."""

    svc: AnalyzerService
    every_s: float
    watcher: ConfigWatcher | None = None
    after: AfterCycle | None = None   # what runs after each cycle, in the background (the actor)
    started: float | None = None
    reported: bool = False
    skipped: int = 0
    failures: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def run(self) -> bool:
        """One cycle (new thresholds first, when the config changed); errors are logged, not raised."""
        if self.watcher is not None:
            cfg = self.watcher.poll()
            if cfg is not None:
                self.svc.reconfigure(cfg)
        with self._lock:
            self.started, self.reported, self.skipped = time.monotonic(), False, 0
        ok = False
        try:
            ok = safe_cycle(self.svc)
            if self.after is not None:
                self.after.kick()   # never waited for: a hung scheduler cannot hold the cycles
            return ok
        finally:
            if not ok:
                self.failures += 1
            elif self.failures:
                log.warning("the analyzer cycle succeeded again after %d failed cycle(s)", self.failures)
                self.failures = 0
            with self._lock:
                took = time.monotonic() - (self.started or time.monotonic())
                if self.reported:
                    log.warning("the analyzer cycle ended after %.0f s (%d cycle(s) skipped meanwhile); "
                                "back to one every %g s", took, self.skipped, self.every_s)
                self.started, self.reported = None, False

    def skipped_one(self) -> None:
        """A scheduled cycle found the previous one still running: say so once per overrun."""
        with self._lock:
            self.skipped += 1
            if self.started is None or self.reported:
                return
            self.reported = True
            waited = time.monotonic() - self.started
        store = self.svc.store
        timeout = getattr(store, "timeout_s", None)
        log.warning("the analyzer cycle has been waiting on the database %r for %.0f s (longer than the "
                    "%g s interval)%s; later cycles are skipped until it answers",
                    store, waited, self.every_s,
                    f"; each request gives up after {timeout:g} s" if timeout else "")


def safe_cycle(svc: AnalyzerService) -> bool:
    """One cycle; an error (database down, bad data) is logged, not raised, so the next cycle runs."""
    ok = True
    try:
        report = svc.cycle()
    except CycleFailed as exc:   # some jobs failed: what the others did is said all the same
        log.error("analyzer cycle failed: %s: %s", type(exc).__name__, exc)
        report, ok = exc.report, False
    except Exception as exc:  # noqa: BLE001 - the scheduler must go on
        log.error("analyzer cycle failed: %s: %s", type(exc).__name__, exc)
        return False
    for inc in report.incidents:
        log.warning("incident %s [%s] %s", inc.id, inc.status, inc.title)
    if report.iterations:
        log.info("cycle: %s; read %.2fs analysis %.2fs write %.2fs",
                 ", ".join(f"{j}: {n} it" for j, n in report.iterations.items()),
                 report.read_s, report.analyze_s, report.write_s)
    return ok


class _DropSkipNotices(logging.Filter):
    """Leaves APScheduler's per-interval "skipped" warnings out (the guard reports overruns)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _SKIPPED not in record.getMessage()


_FILTER = _DropSkipNotices()


def build_scheduler(svc: AnalyzerService, every_s: float, blocking: bool = True,
                    watcher: ConfigWatcher | None = None, after: AfterCycle | None = None):
    """APScheduler 3.x: an interval job with coalescing, one instance at a time, a misfire grace;
    overruns reported by a :class:`CycleGuard` (``scheduler.rankscope_guard``); ``after`` started
    after each cycle."""
    from apscheduler.events import EVENT_JOB_MAX_INSTANCES
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.schedulers.blocking import BlockingScheduler

    guard = CycleGuard(svc, every_s, watcher, after)
    cls = BlockingScheduler if blocking else BackgroundScheduler
    sched = cls(job_defaults={"coalesce": True, "max_instances": 1,
                              "misfire_grace_time": max(1, int(every_s))})
    sched.add_job(guard.run, "interval", seconds=every_s, id="analyzer-cycle",
                  next_run_time=dt.datetime.now(dt.UTC))
    sched.add_listener(lambda _event: guard.skipped_one(), EVENT_JOB_MAX_INSTANCES)
    logging.getLogger("apscheduler.scheduler").addFilter(_FILTER)
    sched.rankscope_guard = guard
    return sched
