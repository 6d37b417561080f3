"""What runs after each analyzer cycle, found through entry points: the analyzer names no component.

A component declares ``[project.entry-points."rankscope.after_cycle"]`` in pyproject.toml,
``name = "package.module:factory"``; ``factory(store, settings)`` gets the store the analyzer
writes to and its config table (``[actions]`` for the actor) and returns the callable to run
after a cycle (one pass, which may take a while: the analyzer runs it in the background), or
None when its settings turn it off. The core finds them as it finds commands (:mod:`rankscope.cli`).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.store import Store

#: The entry-point group of what runs after a cycle.
AFTER_CYCLE_GROUP = "rankscope.after_cycle"


def after_cycle_hooks(store: Store, settings: dict[str, Any]) -> list[tuple[str, Callable[[], Any]]]:
    """``(name, run)`` of every installed hook that ``settings`` turns on, by name."""
    hooks = []
    for ep in sorted(entry_points(group=AFTER_CYCLE_GROUP), key=lambda e: e.name):
        run = ep.load()(store, settings)
        if run is not None:
            hooks.append((ep.name, run))
    return hooks
