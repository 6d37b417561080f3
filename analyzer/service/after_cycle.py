"""After each cycle, what other parts asked to run (the actor, with ``[actions] mode`` not
``"off"``), on one background thread: the cycle never waits on a scheduler.

The hooks come from the core's entry-point group (:mod:`rankscope.after_cycle`): the analyzer
names no component. A pass still running when the next cycle ends is not started twice (the
next starts after it); one running longer than ``slow_s`` is said once in the log, as a cycle
waiting on the database is. A hook that fails is logged and runs again after the next cycle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rankscope.after_cycle import after_cycle_hooks
from rankscope.config_file import config_table
from rankscope.store import Store

log = logging.getLogger("rankscope.analyze")

#: ``[actions] mode`` values: "off" runs nothing after the cycles.
ACTION_MODES = ("off", "dry-run", "enforce")


class AfterCycle:
    """Runs ``hooks`` (``(name, run)``) after each cycle on one background thread."""

    def __init__(self, hooks: list[tuple[str, Callable[[], Any]]], slow_s: float = 120.0):
        self.hooks, self.slow_s = hooks, slow_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="after-cycle")
        self._running: Future | None = None
        self._started = 0.0
        self._warned = False
        self.passes = 0
        self._lock = threading.Lock()

    def kick(self) -> Future | None:
        """Start a pass unless one is running; returns it (None: one was still running)."""
        with self._lock:
            if self._running is not None and not self._running.done():
                took = time.monotonic() - self._started
                if took > self.slow_s and not self._warned:
                    self._warned = True
                    log.warning("the actions after the cycles have been running for %.0f s (a scheduler that "
                                "does not answer?); the cycles go on without waiting", took)
                return None
            self._started, self._warned = time.monotonic(), False
            self._running = self._pool.submit(self._run)
            return self._running

    def _run(self) -> None:
        for name, run in self.hooks:
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - logged; tried again after the next cycle
                log.error("after the cycle, %s failed: %s: %s", name, type(exc).__name__, exc)
        self.passes += 1

    def wait(self, timeout_s: float) -> bool:
        """Wait for the running pass (``analyze --once``); False if it did not end in time."""
        running = self._running
        if running is None:
            return True
        try:
            running.result(timeout_s)
            return True
        except TimeoutError:
            log.warning("the actions after the cycle did not end within %g s; leaving them", timeout_s)
            return False

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def after_cycle(store: Store, config: str | Path | None) -> AfterCycle | None:
    """What runs after the cycles by the config's ``[actions]`` table; None when ``mode`` is
    ``"off"`` (the default). ValueError for a mode that is none of :data:`ACTION_MODES`, or when
    no installed part acts on it."""
    table = config_table(config, "actions")
    mode = table.get("mode", "off")
    if mode not in ACTION_MODES:
        raise ValueError(f"config {config}: [actions] mode = {mode!r}: must be one of {', '.join(ACTION_MODES)}")
    if mode == "off":
        return None
    hooks = after_cycle_hooks(store, table)
    if not hooks:
        raise ValueError(f"config {config}: [actions] mode = {mode!r}, but no installed part acts after the "
                         f"cycles (entry points rankscope.after_cycle): install rankscope whole")
    log.info("after each cycle: %s (actions %s)", ", ".join(n for n, _ in hooks), mode)
    return AfterCycle(hooks)
