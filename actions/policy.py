"""The safety policy: what the actor may do on a verdict, from the ``[actions]`` table.

The defaults are a cautious operator's: nothing is done (``mode = "off"``); when asked to act,
only on confirmed, open incidents of the classes that point at a node (a compute straggler, a
link degradation), at most 2 drains an hour over the whole cluster and 1 node per job an hour,
a scheduler call given 20 s, a failed one retried after 1, 2, 4 ... minutes (at most an hour).
Every key is checked; an unknown key is refused with the nearest known name, a bad value with
the key, the value and the rule.

Example::

    >>> p = ActionPolicy.from_table({"mode": "dry-run", "node_map": {"gpu-node-01294": "n1294"}})
    >>> p.mode, p.max_drains_per_hour, p.classes
    ('dry-run', 2, ('compute_straggler', 'link_degradation'))
    >>> ActionPolicy.from_table({"mode": "on"})
    Traceback (most recent call last):
    ...
    ValueError: [actions] mode = 'on': must be one of off, dry-run, enforce
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, fields
from typing import Any

from rankscope.incident import IncidentClass

MODES = ("off", "dry-run", "enforce")
SCHEDULERS = ("slurm", "kubernetes")
#: The classes whose verdict names a machine to take out of service.
NODE_CLASSES = (IncidentClass.COMPUTE_STRAGGLER.value, IncidentClass.LINK_DEGRADATION.value)


@dataclass(frozen=True)
class ActionPolicy:
    """The ``[actions]`` settings (docs/actions.md has the table)."""

    mode: str = "off"
    scheduler: str = "slurm"
    classes: tuple[str, ...] = NODE_CLASSES
    require_hardware: bool = False
    max_drains_per_hour: int = 2
    max_nodes_per_job_per_hour: int = 1
    fresh_within_s: float = 1800.0
    lookback_s: float = 7 * 86400.0
    timeout_s: float = 20.0
    retry_base_s: float = 60.0
    retry_max_s: float = 3600.0
    lease_s: float = 120.0
    settle_s: float = 1.0
    alertmanager_url: str = ""
    alert_hold_s: float = 900.0
    node_map: dict[str, str] = field(default_factory=dict)
    scontrol: str = "scontrol"
    kubeconfig: str = ""
    kube_context: str = ""

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> ActionPolicy:
        """The policy of an ``[actions]`` table (``{}``: every default); ValueError naming
        every bad key."""
        known = {f.name: f for f in fields(cls)}
        errors = []
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key not in known:
                near = difflib.get_close_matches(key, known, 1)
                errors.append(f"unknown key {key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
                continue
            try:
                values[key] = _checked(key, value, cls.__dataclass_fields__[key].default)
            except ValueError as exc:
                errors.append(str(exc))
        if errors:
            raise ValueError("[actions] " + "; ".join(errors))
        return cls(**values)

    @property
    def acting(self) -> bool:
        return self.mode != "off"

    def backoff_s(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1, 2, 4 ... x the base)."""
        return float(min(self.retry_max_s, self.retry_base_s * 2 ** max(0, failures - 1)))


_POSITIVE = {"fresh_within_s", "lookback_s", "timeout_s", "retry_base_s", "retry_max_s", "lease_s",
             "alert_hold_s"}
_COUNTS = {"max_drains_per_hour", "max_nodes_per_job_per_hour"}


def _checked(key: str, value: Any, default: Any) -> Any:
    """``value`` for ``key`` if it fits its rule; ValueError naming both."""
    def bad(rule: str) -> ValueError:
        return ValueError(f"{key} = {value!r}: {rule}")

    if key == "mode" and value not in MODES:
        raise bad(f"must be one of {', '.join(MODES)}")
    if key == "scheduler" and value not in SCHEDULERS:
        raise bad(f"must be one of {', '.join(SCHEDULERS)}")
    if key == "classes":
        known = [c.value for c in IncidentClass]
        if not isinstance(value, list) or not value or any(v not in known for v in value):
            raise bad(f"must be a non-empty list of incident classes ({', '.join(known)})")
        return tuple(value)
    if key == "require_hardware" and not isinstance(value, bool):
        raise bad("must be true or false")
    if key in _COUNTS and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise bad("must be an integer >= 0 (0: never)")
    if key in _POSITIVE | {"settle_s"}:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or value < 0 or (value == 0 and key in _POSITIVE):
            raise bad("must be a finite number > 0" if key in _POSITIVE else "must be a finite number >= 0")
        return float(value)
    if key == "node_map":
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                  for k, v in value.items()):
            raise bad("must be a table of host = \"node name\"")
        return dict(value)
    if isinstance(default, str) and not isinstance(value, str):
        raise bad("must be a string")
    return value
