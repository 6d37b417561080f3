"""Incidents as the analyzer writes them, for the actions tests: confirmed, fresh, on named hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from actions.actor import Actor
from actions.policy import ActionPolicy
from actions.records import latest, read_records
from rankscope import schema
from rankscope.incident import Incident, IncidentClass, incidents_frame


def now_ms() -> int:
    return int(time.time() * 1000)


def incident(job: str, hosts: list[str], rank: int = 10352, cls: IncidentClass = IncidentClass.COMPUTE_STRAGGLER,
             confirmed: bool = True, age_s: float = 600, updated_s: float = 10, **more) -> Incident:
    """An open incident of ``job`` on ``hosts``, its onset ``age_s`` ago, confirmed a minute ago."""
    t = now_ms()
    onset = t - int(age_s * 1000)
    return Incident(id=f"{cls.short}-30-r{rank}", job=job, cls=cls, ranks=list(range(rank, rank + 8)),
                    nodes=[rank // 8], stage="mlp", ratio=5.7, group_type="ep",
                    group_ranks=list(range(rank - 16, rank + 16)), onset_iteration=30, onset_ms=onset,
                    hosts=list(hosts), updated_ms=t - int(updated_s * 1000),
                    timeline={"onset": onset, "detected": onset + 60_000,
                              "confirmed": onset + 120_000 if confirmed else None,
                              "action": None, "recovered": None}, **more)


def write(store, *incidents: Incident) -> None:
    store.write_measurement(schema.INCIDENT, incidents_frame(list(incidents)))


def states(store) -> dict[tuple[str, str, str, str], str]:
    """Each action's state as the store holds it."""
    return {k: r.state for k, r in latest(read_records(store)).items()}


def policy(**settings) -> ActionPolicy:
    return ActionPolicy.from_table({"mode": "enforce", "settle_s": 0.0, **settings})


def run_pass(store, scheduler, enforce: bool = True, clock=time.time, **settings):
    return Actor(store, policy(**settings), scheduler, enforce=enforce, clock=clock).run()


def rankscope(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """The ``rankscope`` command of this environment, as an operator runs it."""
    exe = Path(sys.executable).with_name("rankscope")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env={**os.environ, **env},
                          timeout=timeout)
