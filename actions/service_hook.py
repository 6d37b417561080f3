"""The actor as the analyzer service runs it after each cycle (entry point ``rankscope.after_cycle``).

The service reads ``[actions] mode`` and, unless it is ``"off"``, asks this factory for the pass
to run after each cycle, on its own background thread: ``"dry-run"`` plans (and records the
plan), ``"enforce"`` acts. Every replica of every shard runs it; the store's lease lets one act.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actions.actor import PassResult
from actions.factory import make_actor
from actions.policy import ActionPolicy
from rankscope.store import Store


def after_cycle(store: Store, settings: dict[str, Any]) -> Callable[[], PassResult] | None:
    """One actor pass per call, or None when ``[actions] mode`` is ``"off"``."""
    policy = ActionPolicy.from_table(settings)
    if not policy.acting:
        return None
    actor = make_actor(store, policy, enforce=policy.mode == "enforce", leased=True)
    return actor.run
