"""Diagnosis: from each iteration's L2 signals to incidents with culprits, class and evidence.

It sees through propagation. Collective times are symptoms (they are mostly
waiting), so only compute and host stages can name a culprit rank; a degraded
link raises the floors of its collectives; a heavier PP stage stands out as a
DP group; a silent rank stops reporting. Each family is a rule module of its
own (:data:`RULES`, in the order they run) following the protocol of
:mod:`analyzer.diagnosis.rule`: it detects and writes evidence; the diagnoser
resolves an incident after its rule has said "not active" for
``quiet_to_resolve`` iterations in a row, and keeps memory bounded.

State lives in the objects; :meth:`Diagnoser.update` is fed once per iteration.
"""

from __future__ import annotations

from analyzer.config import AnalyzerConfig
from analyzer.detect.window import Window
from analyzer.diagnosis.arrival import ArrivalRule
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.event_verdicts import OutOfBandEvent
from analyzer.diagnosis.health import DiagnosisHealth
from analyzer.diagnosis.links import LinkRule
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.pipeline import PipelineRule
from analyzer.diagnosis.rank_cells import RankCells
from analyzer.diagnosis.rule import Rule
from analyzer.diagnosis.silence import SilenceRule
from analyzer.diagnosis.stragglers import StragglerRule
from analyzer.diagnosis.transient import TransientStallRule
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology

#: The rules, in the order they run each iteration.
RULES = ("transient", "stragglers", "links", "pipeline", "arrival", "silence")


class Diagnoser:
    """Turns each iteration's scores into incident updates for one job."""

    def __init__(self, job: str, topo: Topology, stages: StageSet, config: AnalyzerConfig | None = None):
        self.job, self.topo, self.stages = job, topo, stages
        self.cfg = cfg = config or AnalyzerConfig()
        self.cells = RankCells(topo.world, len(stages))
        silence = SilenceRule(job, topo, stages, cfg)
        transient = TransientStallRule(job, topo, stages, cfg, self.cells)
        self._health = DiagnosisHealth(silence, transient)
        rules: dict[str, Rule] = {
            "transient": transient,
            "stragglers": StragglerRule(job, topo, stages, cfg, self.cells),
            "links": LinkRule(job, topo, stages, cfg),
            "pipeline": PipelineRule(job, topo, stages, cfg),
            "arrival": ArrivalRule(job, topo, stages, cfg),
            "silence": silence,
        }
        self.rules: list[Rule] = [rules[name] for name in RULES]
        self._owner: dict[IncidentClass, Rule] = {c: r for r in self.rules for c in r.classes}
        missing = set(IncidentClass) - set(self._owner)
        if missing:
            raise RuntimeError(f"no rule owns incident class(es) {sorted(missing)}")
        self.book = IncidentBook(cfg.event_lookback, keep_resolved=max(cfg.history, cfg.reopen_within),
                                 reopen_within=cfg.reopen_within, hosts=topo.hosts or ())
        self._quiet: dict[str, int] = {}
        self._replayed: dict[str, int] = {}   # adopted incident id -> time of its last update

    # ------------------------------------------------------------ state
    @property
    def incidents(self) -> list[Incident]:
        """Open and recently resolved incidents (older ones are only in the store)."""
        return self.book.incidents

    @property
    def health(self) -> DiagnosisHealth:
        """Data completeness and the sporadic stalls counted as noise (:mod:`analyzer.diagnosis.health`)."""
        return self._health

    @property
    def reporting_ranks(self) -> int:
        """Ranks that have reported at least once."""
        return self._health.reporting_ranks

    @property
    def events_held(self) -> int:
        """Out-of-band events held in memory (bounded: see :mod:`analyzer.diagnosis.book`)."""
        return len(self.book.events)

    def event_horizon(self, win: Window) -> int | None:
        """Events older than this cannot change any verdict (None: read them all)."""
        return self.book.horizon(win)

    def adopt(self, incidents: list[Incident]) -> None:
        """Take over incidents read back from the store (after a restart)."""
        for inc in incidents:
            if self.book.known(inc.id):
                continue
            self.book.adopt(inc)
            if inc.is_open:
                self._replayed[inc.id] = int(inc.updated_ms)
                self._owner[inc.cls].adopt(inc)

    def reconfigure(self, cfg: AnalyzerConfig) -> None:
        """New thresholds for every rule (their state kept)."""
        self.cfg = cfg
        self.book.event_lookback = cfg.event_lookback
        self.book.reopen_within = cfg.reopen_within
        self.book.keep_resolved = max(cfg.history, cfg.reopen_within)
        for rule in self.rules:
            rule.cfg = cfg  # type: ignore[attr-defined]

    def replace_topology(self, topo: Topology) -> None:
        """The same layout with another placement (see :meth:`JobAnalyzer.replace_placement`)."""
        self.topo = topo
        self.book.watch_hosts(topo.hosts or ())
        for rule in self.rules:
            rule.topo = topo  # type: ignore[attr-defined]

    def add_events(self, events: list[OutOfBandEvent]) -> None:
        self.book.add_events(events)

    # ----------------------------------------------------------- update
    def update(self, obs: Observation) -> list[Incident]:
        """One iteration; returns the incidents created or changed by it."""
        changed: dict[str, Incident] = {}
        self.cells.update(obs)
        for rule in self.rules:
            for inc in rule.detect(obs, self.book):
                changed[inc.id] = inc
        for inc in self._resolve(obs):
            changed[inc.id] = inc
        for inc in changed.values():
            inc.updated_ms = obs.time_ms
        self.book.forget_old(obs.iteration)
        self.book.forget_events(obs.window)
        return list(changed.values())

    def _resolve(self, obs: Observation) -> list[Incident]:
        """Resolve incidents their rule has found inactive long enough; count the return of an
        intermittent one that had gone quiet as its next episode."""
        out = []
        for inc in self.book.open():
            if inc.id in self._replayed:   # the previous analyzer judged these iterations already
                if obs.time_ms <= self._replayed[inc.id]:
                    continue
                del self._replayed[inc.id]
            rule = self._owner[inc.cls]
            before = self._quiet.get(inc.id, 0)
            needed = rule.quiet_to_resolve(inc)
            if rule.active(inc, obs):
                if inc.intermittent and before >= needed:   # quiet long enough to count as away
                    self.book.next_episode(inc, obs.iteration)
                    out.append(inc)
                self._quiet[inc.id] = 0
                continue
            q = before + 1
            if inc.intermittent:   # a fault that came back: resolved once it stays away long enough
                needed = max(needed, self.cfg.reopen_within)
            if q >= needed:
                inc.resolve(obs.iteration - q + 1)
                rule.resolved(inc)
                self._quiet.pop(inc.id, None)
                out.append(inc)
            else:
                self._quiet[inc.id] = q
        return out

    def rejudge_events(self, obs_window: Window) -> list[Incident]:
        """Open incidents whose event verdicts changed since they were last judged."""
        return self.book.rejudge_events(obs_window)
