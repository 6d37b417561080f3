"""Thresholds reloaded without a restart: the ``--config`` file watched between cycles.

Before each cycle the watcher looks at the file (its content, not only its
time stamp) and at whether a SIGHUP asked for a reload. A changed, valid file
yields the new settings, and the log says what changed; an invalid one is
refused with the reason and the settings in force stay (the file is looked at
again when it changes). Settings that size the detectors' state
(:data:`analyzer.config.RESTART_ONLY`) and the ``[stages]`` table wait for a
restart, and the log says so.

Example::

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "analyzer.toml"
    >>> _ = path.write_text("[analyzer]\\nz = 6.0\\n")
    >>> w = ConfigWatcher(path)
    >>> w.poll() is None                       # nothing changed since it was loaded
    True
    >>> _ = path.write_text("[analyzer]\\nz = 7.5\\n")
    >>> w.poll().z
    7.5
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import replace
from pathlib import Path

from analyzer.config import RESTART_ONLY, AnalyzerConfig, changes, load_config

log = logging.getLogger("rankscope.analyze")


class ConfigWatcher:
    """The analyzer settings of one TOML file, reloaded when it changes or on request."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config, self.stages = load_config(self.path)
        self._digest = self._read_digest()
        self._requested = threading.Event()

    def request(self) -> None:
        """Ask for a reload at the next poll (what SIGHUP does)."""
        self._requested.set()

    def _read_digest(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None

    def poll(self) -> AnalyzerConfig | None:
        """The new settings when the file changed (or a reload was requested) and is valid;
        None when nothing is to change. Never raises: a bad file is logged and ignored."""
        requested = self._requested.is_set()
        self._requested.clear()
        digest = self._read_digest()
        if digest == self._digest and not requested:
            return None
        self._digest = digest
        try:
            config, stages = load_config(self.path)
        except ValueError as exc:
            log.error("config reload refused, the current thresholds stay: %s", exc)
            return None
        diff = changes(self.config, config)
        later = {k: v for k, v in diff.items() if k in RESTART_ONLY}
        now = {k: v for k, v in diff.items() if k not in RESTART_ONLY}
        if later:
            log.warning("config %s: %s take(s) effect at the next restart (they size the detectors' "
                        "state); not applied now", self.path, _describe(later))
        if stages != self.stages:
            log.warning("config %s: the [stages] table takes effect at the next restart", self.path)
        if not now:
            if not later:
                log.info("config %s reloaded: nothing changed", self.path)
            return None
        # the file's settings, except those that wait for a restart: they keep their running values
        try:  # (checked again: a new value must also agree with the running restart-only ones)
            applied = replace(config, **{k: getattr(self.config, k) for k in RESTART_ONLY})
        except ValueError as exc:
            log.error("config reload refused, the current thresholds stay: config %s with the "
                      "running restart-only settings: %s", self.path, exc)
            return None
        log.warning("config %s reloaded: %s (from the next cycle on)", self.path, _describe(now))
        self.config = applied
        return applied


def _describe(diff: dict[str, tuple[object, object]]) -> str:
    return ", ".join(f"{k} {old} -> {new}" for k, (old, new) in diff.items())
