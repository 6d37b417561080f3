"""The policy's rules as pure functions: which incidents may be acted on, and the budget.

- :func:`eligibility`: an incident is acted on only when it is open, of a class the policy
  names, fresh (the analyzer updated it within ``fresh_within_s``), confirmed (its timeline
  says when), names its hosts unambiguously, has hardware evidence where the policy asks for
  it, and names no more machines than a job may lose in an hour.
- :class:`Budget`: the drains of the last hour (done, or begun in enforce mode: a call that may
  have gone through), cluster-wide and per job; an action's own earlier steps never count
  against it.

Example::

    >>> b = Budget([], max_per_hour=2, max_per_job=1, now_ms=3_600_000)
    >>> b.refusal("j", ("j", "i", "n1", "drain")) is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from actions.policy import ActionPolicy
from actions.records import ActionRecord
from rankscope.incident import Incident

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Hold:
    """Why an incident is not acted on: the state to record, its reason, and whether for good."""

    state: str
    reason: str
    final: bool = False


def eligibility(inc: Incident, policy: ActionPolicy, now_ms: int) -> Hold | None:
    """None when the policy lets ``inc`` be acted on; else why not. Incidents of other classes
    and closed ones are not the actor's business (:func:`concerns`)."""
    if inc.updated_ms and now_ms - inc.updated_ms > policy.fresh_within_s * 1000:
        age = (now_ms - inc.updated_ms) / 60_000
        return Hold("skipped", f"stale: the analyzer last updated it {age:.0f} min ago (fresh_within_s = "
                               f"{policy.fresh_within_s:g}); is the analyzer running?")
    if inc.timeline.get("confirmed") is None:
        return Hold("skipped", "not confirmed yet: acting only on incidents that outlived their first "
                               "iterations")
    if policy.require_hardware and inc.hardware.get("verdict") != "hardware_fault":
        seen = inc.hardware.get("verdict") or "none"
        return Hold("skipped", f"no hardware evidence (the policy requires it; hardware verdict: {seen})")
    if inc.evidence.get("ambiguous"):
        return Hold("refused", "no timing separates these machines: a person must choose which to drain")
    if not inc.hosts or any(h.startswith("node ") for h in inc.hosts):
        return Hold("refused", "the incident names no host (the collectors sent none): a person must act")
    if len(inc.hosts) > policy.max_nodes_per_job_per_hour:
        return Hold("refused", f"over budget: the incident names {len(inc.hosts)} hosts, more than the "
                               f"{policy.max_nodes_per_job_per_hour} node(s) a job may lose an hour: a "
                               f"person must act")
    return None


def concerns(inc: Incident, policy: ActionPolicy) -> bool:
    """Whether ``inc`` is one the actor looks at: open, of a class the policy names."""
    return inc.is_open and inc.cls.value in policy.classes and not inc.host_side


class Budget:
    """The drains of the last hour, cluster-wide and per job (``records``: every drain step
    of the last hour; :meth:`spend` adds those of this pass)."""

    def __init__(self, records: list[ActionRecord], max_per_hour: int, max_per_job: int, now_ms: int):
        self.max_per_hour, self.max_per_job = max_per_hour, max_per_job
        self.spent = {r.key: r for r in records if counts(r) and r.at > now_ms - HOUR_MS}

    def spend(self, record: ActionRecord) -> None:
        self.spent[record.key] = record

    def refusal(self, job: str, key: tuple[str, str, str, str]) -> str | None:
        """Why a new drain of ``key`` is over budget (None: within it)."""
        others = [r for k, r in self.spent.items() if k != key]
        nodes_of_job = {r.node for r in others if r.job == job and r.node != key[2]}
        if len(others) >= self.max_per_hour:
            return (f"over budget: {len(others)} drain(s) in the last hour cluster-wide (max_drains_per_hour "
                    f"= {self.max_per_hour}): a person must act")
        if len(nodes_of_job) >= self.max_per_job:
            return (f"over budget: job {job} lost {len(nodes_of_job)} node(s) in the last hour "
                    f"(max_nodes_per_job_per_hour = {self.max_per_job}): a person must act")
        return None


def counts(r: ActionRecord) -> bool:
    """A step that spends budget: a drain done, or begun in enforce mode (it may have gone through)."""
    return r.action == "drain" and (r.state == "done" or (r.state == "planned" and r.mode == "enforce"))
