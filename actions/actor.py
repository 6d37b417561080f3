"""One pass of the actor: read the verdicts and the record, decide under the policy, act, record.

For every open incident of a class the policy names, and every host it names:

1. the node is resolved, read-only, in a dry-run too (:meth:`Scheduler.resolve`);
2. the action's own record decides first: a final step is never revisited, a failure waits
   for its retry time;
3. the node's state decides next: marked by rankscope for this incident, the drain is done
   (also after an actor killed between its call and its record: nothing is drained twice);
   drained by rankscope before and no longer, an operator resumed it (``skipped`` for good);
   out of service otherwise, someone else has it (``skipped`` for good);
4. then the policy (:mod:`actions.plan`), the budget, and the drain: planned in a dry-run; in
   enforce mode the intent is stored before the call, and the call's outcome after it.

Every step whose state or reason changed is written to the store (``action``) and posted to
Alertmanager; :class:`PassResult` holds the state of every action looked at.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from actions.lease import StoreLease
from actions.notify import AlertmanagerNotifier
from actions.plan import Budget, Hold, concerns, eligibility
from actions.policy import ActionPolicy
from actions.records import ActionRecord, latest, read_records, write_records
from actions.scheduler import NodeRefused, Scheduler, SchedulerError, checked_name
from actions.verdicts import read_incidents
from rankscope.incident import Incident
from rankscope.store import Store
from rankscope.times import format_time

log = logging.getLogger("rankscope.act")


@dataclass
class PassResult:
    """The state of each action a pass looked at, what it wrote, and whether it held the lease."""

    actions: list[ActionRecord] = field(default_factory=list)
    written: list[ActionRecord] = field(default_factory=list)
    held: bool = True
    holder: str = ""

    def to_json(self) -> dict:
        return {"actions": [r.to_json() for r in self.actions]}


def identity() -> str:
    """This replica's name in the record and the lease: host name and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Actor:
    """Acts on the store's verdicts through ``scheduler`` under ``policy`` (``enforce``: for
    real; otherwise it plans and changes nothing)."""

    def __init__(self, store: Store, policy: ActionPolicy, scheduler: Scheduler, enforce: bool = False,
                 clock: Callable[[], float] = time.time, name: str | None = None,
                 lease: StoreLease | None = None, notifier: AlertmanagerNotifier | None = None):
        self.store, self.policy, self.scheduler, self.enforce = store, policy, scheduler, enforce
        self.clock = clock
        self.name = name or identity()
        self.mode = "enforce" if enforce else "dry-run"
        self.lease = lease
        self.notifier = notifier if notifier is not None else (
            AlertmanagerNotifier(policy.alertmanager_url, policy.alert_hold_s) if policy.alertmanager_url else None)
        self.latest: dict[tuple[str, str, str, str], ActionRecord] = {}
        self._written: list[ActionRecord] = []
        self._ended: list[ActionRecord] = []

    # ------------------------------------------------------------------ a pass
    def _begin(self) -> tuple[int, PassResult | None]:
        now = int(self.clock() * 1000)
        if self.lease is not None:
            held, who = self.lease.acquire()
            if not held:
                log.info("another actor holds the lease (%s): not acting this pass", who)
                return now, PassResult(held=False, holder=who)
        self.scheduler.begin_pass()
        records = read_records(self.store, now - int(self.policy.lookback_s * 1000))
        self.latest = latest(records)
        self.budget = Budget(records, self.policy.max_drains_per_hour, self.policy.max_nodes_per_job_per_hour, now)
        self._written, self._ended = [], []
        return now, None

    def run(self, jobs: list[str] | None = None) -> PassResult:
        """One pass over every job's open incidents (``jobs``: only those)."""
        now, refused = self._begin()
        if refused is not None:
            return refused
        incidents = [i for i in read_incidents(self.store, now - int(self.policy.lookback_s * 1000), jobs)
                     if concerns(i, self.policy)]
        states = []
        for inc in incidents:
            hold = eligibility(inc, self.policy, now)
            for host in inc.hosts or ["none"]:
                states.append(self._host(inc, host, hold, now))
        return self._finish(states, now)

    def _finish(self, states: list[ActionRecord], now: int) -> PassResult:
        write_records(self.store, [r for r in self._written if not (r.state == "planned" and r.mode == "enforce")])
        if self.notifier is not None:
            alerting = [r for r in states if r in self._written or r.state in ("refused", "failed")
                        or (r.action, r.state) == ("drain", "done")]
            self.notifier.post(alerting, self._ended, now)
        for r in self._written:
            log.warning("%s %s of %s for %s (%s): %s", r.mode, r.action, r.node, r.incident, r.state, r.reason)
        return PassResult(states, list(self._written), True, self.name)

    def _step(self, inc: Incident | str, key: tuple[str, str, str, str], host: str, state: str, reason: str,
              now: int, final: bool = False, attempt: int = 0, retry_ms: int = -1) -> ActionRecord:
        """The record of a step (``inc``: the incident, or its class); kept to be written when it
        says something new."""
        job, incident, node, action = key
        r = ActionRecord(job, incident, node, action, state, reason, now, host=host,
                         cls=inc if isinstance(inc, str) else inc.cls.value, scheduler=self.scheduler.name,
                         mode=self.mode, attempt=attempt, retry_ms=retry_ms, final=final, actor=self.name)
        prior = self.latest.get(key)
        if r.same_step(prior):
            return prior
        if prior is not None and prior.state != r.state:
            self._ended.append(prior)
        self.latest[key] = r
        self._written.append(r)
        return r

    # ------------------------------------------------------------ one host
    def _host(self, inc: Incident, host: str, hold: Hold | None, now: int) -> ActionRecord:
        key = (inc.job, inc.id, host, "drain")
        if host == "none":
            return self._step(inc, key, host, hold.state if hold else "refused",
                              hold.reason if hold else "the incident names no host", now)
        try:
            node = self.scheduler.resolve(host, self.policy.node_map)
        except NodeRefused as exc:
            return self._step(inc, key, host, "refused", str(exc), now)
        except SchedulerError as exc:
            return self._failure(inc, key, host, f"cannot resolve the node: {exc}", now)
        key = (inc.job, inc.id, node, "drain")
        prior = self.latest.get(key)
        if prior is not None and prior.final:
            return prior
        if hold is not None:
            return self._step(inc, key, host, hold.state, hold.reason, now, hold.final)
        if prior is not None and prior.state == "failed" and prior.retry_ms > now:
            return prior
        return self._drain(inc, key, host, prior, now)

    def _failure(self, inc: Incident, key: tuple[str, str, str, str], host: str, error: str, now: int) -> ActionRecord:
        prior = self.latest.get(key)
        if prior is not None and prior.state == "failed" and prior.retry_ms > now:
            return prior
        attempt = (prior.attempt if prior is not None and prior.state == "failed" else 0) + 1
        retry = now + int(self.policy.backoff_s(attempt) * 1000)
        return self._step(inc, key, host, "failed", f"{error} (attempt {attempt}; next try at "
                          f"{format_time(retry)})", now, attempt=attempt, retry_ms=retry)

    def _drain(self, inc: Incident, key: tuple[str, str, str, str], host: str, prior: ActionRecord | None,
               now: int) -> ActionRecord:
        node = key[2]
        try:
            st = self.scheduler.state(node)
            plan = self.scheduler.describe(node, inc)
        except SchedulerError as exc:
            return self._failure(inc, key, host, str(exc), now)
        except NodeRefused as exc:
            return self._step(inc, key, host, "refused", str(exc), now)
        if st.marker == inc.id:
            return self._step(inc, key, host, "done", f"drained: {plan}", now)
        if prior is not None and prior.state == "done":
            why = (f"drained again by someone else (State={st.state}, Reason={st.reason!r})" if st.drained else
                   f"an operator resumed it after rankscope drained it at {format_time(prior.at)} (State={st.state})")
            return self._step(inc, key, host, "skipped", f"{why}: rankscope will not drain it again for this "
                              f"incident", now, final=True)
        if st.drained:
            who = f"rankscope, for incident {st.marker}" if st.marker else "someone else"
            return self._step(inc, key, host, "skipped", f"out of service already, by {who} (State={st.state}, "
                              f"Reason={st.reason!r}): rankscope leaves it alone", now, final=True)
        over = self.budget.refusal(inc.job, key)
        if over is not None:
            return self._step(inc, key, host, "refused", over, now)
        if not self.enforce:
            return self._step(inc, key, host, "planned", f"would run: {plan}", now)
        return self._call(inc, key, host, plan, now)

    def _call(self, inc: Incident, key: tuple[str, str, str, str], host: str, plan: str, now: int) -> ActionRecord:
        intent = self._step(inc, key, host, "planned", f"running: {plan}", now)
        write_records(self.store, [intent])   # stored before the call: a kill after it is found again
        self.budget.spend(intent)
        try:
            self.scheduler.drain(key[2], inc)
        except SchedulerError as exc:
            return self._failure(inc, key, host, str(exc), now)
        except NodeRefused as exc:
            return self._step(inc, key, host, "refused", str(exc), now)
        done = self._step(inc, key, host, "done", f"drained: {plan}", int(self.clock() * 1000))
        self.budget.spend(done)
        return done

    # ------------------------------------------------------------------ undo
    def undo(self, incident_id: str, job: str | None = None) -> PassResult:
        """Resume the nodes drained for ``incident_id`` that still carry its mark; the incident's
        nodes are never drained again for it."""
        now, refused = self._begin()
        if refused is not None:
            return refused
        mine = [r for r in self.latest.values() if r.incident == incident_id and r.action == "drain"
                and (job is None or r.job == job)]
        jobs = sorted({r.job for r in mine})
        if not mine:
            raise ValueError(f"rankscope has no action on incident {incident_id!r}"
                             f"{f' of job {job!r}' if job else ''} in {self.store!r}")
        if len(jobs) > 1:
            raise ValueError(f"incident {incident_id!r} is in several jobs ({', '.join(jobs)}): give --job")
        states = [self._undo_one(r, now) for r in mine]
        return self._finish(states, now)

    def _undo_one(self, drain: ActionRecord, now: int) -> ActionRecord:
        key = (drain.job, drain.incident, drain.node, "resume")
        if drain.state not in ("done", "planned") or (drain.state == "planned" and drain.mode != "enforce"):
            self._step(drain.cls, drain.key, drain.host, "skipped", "undone before it was drained: rankscope will not "
                       "drain it for this incident", now, final=True)
            return self._step(drain.cls, key, drain.host, "skipped", f"nothing to undo (the drain was {drain.state})", now)
        try:
            st = self.scheduler.state(checked_name(drain.node, "node"))
        except (SchedulerError, NodeRefused) as exc:
            return self._step(drain.cls, key, drain.host, "failed" if isinstance(exc, SchedulerError) else "refused",
                              str(exc), now)
        if st.marker != drain.incident:
            self._step(drain.cls, drain.key, drain.host, "skipped", "undone: rankscope will not drain it again for "
                       "this incident", now, final=True)
            why = (f"drained by someone else now (Reason={st.reason!r})" if st.drained
                   else f"not drained any more (State={st.state}): an operator resumed it")
            return self._step(drain.cls, key, drain.host, "refused" if st.drained else "skipped", why, now)
        if not self.enforce:
            return self._step(drain.cls, key, drain.host, "planned",
                              f"would run: {self.scheduler.describe_resume(drain.node, drain.incident)}", now)
        try:
            self.scheduler.resume(drain.node, drain.incident)
        except (SchedulerError, NodeRefused) as exc:
            return self._step(drain.cls, key, drain.host, "failed", str(exc), now)
        self._step(drain.cls, drain.key, drain.host, "skipped", "undone by rankscope act --undo: rankscope will not "
                   "drain it again for this incident", now, final=True)
        return self._step(drain.cls, key, drain.host, "done",
                          f"resumed: {self.scheduler.describe_resume(drain.node, drain.incident)}", now)
