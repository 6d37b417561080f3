"""Hardware evidence on every verdict: the culprit GPUs' own telemetry against their past and the
job's other GPUs, attached to each incident the cycle changed before it is written
(:class:`~analyzer.service.cycle_report.IncidentEvidence`).

Per job and cycle, the incidents due (never checked, checked while their onset window was not yet
whole and ``refresh_s`` ago, or last found ``unavailable``) are checked together, at most
``max_checks`` of them: per source **one query** over the union of their culprit hosts and
``peer_hosts`` of the job's other hosts (:func:`rankscope.gpu_health.peer_nodes`), from the earliest
baseline to the latest onset window (a source may read the baseline coarser and of the culprit
hosts only, the peers being compared after the onset, and a group of compute incidents only its
signals: :data:`COMPUTE_READ`) (incidents more than 6 hours apart are asked for apart, at
most 4 queries a source). A check is ``final`` once its onset window (``window_s`` after the onset,
plus ``lag_s``) lies inside the job's data: it is kept in the record and never asked for again, a
restarted analyzer included. A source that is down answers ``unavailable``: one log line (at most
one a minute per source), the cycle goes on, the next cycle asks again.

Sources are asked in order (the store's ``gpu_health``, Prometheus, Telegraf); the incident's
record is the most telling of theirs (``hardware_fault`` > ``no_hardware_signal`` > ``unavailable`` >
``no_data``) with every source's verdict in ``sources``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pandas as pd

from analyzer.diagnosis.hardware_verdict import hardware_record, unavailable
from analyzer.read.gpu_samples import SourceUnavailable, TelemetrySource
from analyzer.score.gpu_series import GpuSeries, prepare
from analyzer.score.gpu_signals import COMPUTE_SIGNALS, LINK_SIGNALS, compare
from analyzer.service.hardware_config import HardwareSettings
from rankscope import gpu_health as gh
from rankscope.gpu_health import peer_nodes
from rankscope.incident import Incident, IncidentClass

log = logging.getLogger(__name__)

RANK = {"hardware_fault": 3, "no_hardware_signal": 2, "unavailable": 1, "no_data": 0}
#: Classes whose culprits are no machine's GPUs: not checked.
UNCHECKED = {IncidentClass.PIPELINE_IMBALANCE}
#: What a group of compute incidents is read for: the clocks' reasons, the levels and the errors
#: (no link counters; a group with a link or silent incident reads every signal).
COMPUTE_READ = frozenset({gh.REASONS, *gh.LEVELS, gh.XID, gh.ROW_REMAP_FAILURE, gh.REMAPPED_ROWS, gh.ECC_DBE})
_EVERY_SIGNAL = {IncidentClass.LINK_DEGRADATION, IncidentClass.SILENT_RANK}
_APART_MS = 6 * 3600_000
_MAX_QUERIES = 4


class HardwareEvidence:
    """Attaches ``gpus``' telemetry evidence to incidents (see the module doc)."""

    def __init__(self, sources: list[TelemetrySource], settings: HardwareSettings | None = None):
        self.sources = list(sources)
        self.settings = settings or HardwareSettings()
        self._lock = threading.Lock()
        self._logged: dict[str, float] = {}
        # when each incident was last checked (data time, ms): kept here, not in the record, so two
        # analyzers of the same data store the same record whenever each happened to check
        self._checked: dict[str, int] = {}
        self.queries = 0   # queries made, for the benchmark and the tests

    def __repr__(self) -> str:
        return f"HardwareEvidence({', '.join(s.name for s in self.sources)})"

    # ----------------------------------------------------------------- what is due
    def checkable(self, inc: Incident) -> bool:
        hosts = {g["host"] for g in inc.gpus}
        return inc.cls not in UNCHECKED and bool(inc.gpus) and 0 < len(hosts) <= self.settings.max_culprit_hosts \
            and not any(h.startswith("node ") for h in hosts)

    def due(self, inc: Incident, now_ms: int) -> bool:
        hw = inc.hardware
        if not hw or hw.get("verdict") == "unavailable":
            return True
        return not hw.get("final") and now_ms - self._checked.get(inc.id, 0) >= self.settings.refresh_s * 1000

    # ----------------------------------------------------------------- the check
    def attach(self, job: str, incidents: list[Incident], analyzer: Any) -> None:
        """Check the due ones of ``incidents`` (never raises: a failure is the record's)."""
        if not self.sources:
            return
        now_ms = int(analyzer.last_time_ms)
        due = [i for i in incidents if self.checkable(i) and self.due(i, now_ms)][: self.settings.max_checks]
        for group in _groups(sorted(due, key=lambda i: i.onset_ms))[:_MAX_QUERIES]:
            try:
                self._check(job, group, analyzer.topo, now_ms)
            except Exception as exc:  # noqa: BLE001 - evidence never fails a cycle
                log.error("job %s: hardware evidence failed: %s: %s", job, type(exc).__name__, exc)

    def _hosts(self, group: list[Incident], topo) -> list[str]:
        culprits = {g["host"] for i in group for g in i.gpus}
        if topo.hosts is None:
            return sorted(culprits)
        nodes = topo.node_index[[g["rank"] for i in group for g in i.gpus]]
        peers = topo.host_names(peer_nodes(nodes, topo.nodes, self.settings.peer_hosts))
        return sorted(culprits) + [h for h in peers if h not in culprits]

    def _check(self, job: str, group: list[Incident], topo, now_ms: int) -> None:
        s = self.settings
        start = min(i.onset_ms for i in group) - int(s.baseline_s * 1000)
        end = min(max(i.onset_ms for i in group) + int((s.window_s + s.lag_s) * 1000), max(now_ms, start + 1))
        hosts = self._hosts(group, topo)
        culprits = {g["host"] for i in group for g in i.gpus}
        peers = {h for h in hosts if h not in culprits}   # never another incident's culprit
        records: dict[str, list[dict]] = {i.id: [] for i in group}
        read = None if any(i.cls in _EVERY_SIGNAL for i in group) else COMPUTE_READ
        for source in self.sources:
            try:
                with self._lock:
                    self.queries += 1
                samples = source.samples(job, hosts, start, end, onset_ms=min(i.onset_ms for i in group),
                                         baseline_hosts=frozenset(culprits), signals=read)
            except SourceUnavailable as exc:
                self._log_once(source.name, f"job {job}: {exc}; the incidents say 'unavailable', asked again next cycle")
                for i in group:
                    records[i.id].append(unavailable(source.name, str(exc)))
                continue
            series = prepare(samples)   # once: every incident's comparison reuses it
            for i in group:
                records[i.id].append(self._record(i, series, {g["host"] for g in i.gpus} | peers, source))
        for i in group:
            i.hardware = self._combined(i, records[i.id], now_ms)
            self._checked[i.id] = now_ms
        if len(self._checked) > 100_000:   # bounded: a forgotten one is only checked again
            self._checked.clear()

    def _record(self, inc: Incident, series: GpuSeries, hosts: set[str], source: TelemetrySource) -> dict:
        """One source's record of ``inc``: its GPUs against the peers on ``hosts`` (its own culprit
        hosts and the job's peer hosts, never another incident's culprits: a peer that is itself a
        culprit would hide the fault)."""
        s = self.settings
        culprits = pd.DataFrame([{"host": g["host"], "gpu": -1 if g.get("gpu") is None else int(g["gpu"]),
                                  "uuid": g.get("uuid") or ""} for g in inc.gpus])
        signals = LINK_SIGNALS if inc.cls == IncidentClass.LINK_DEGRADATION else COMPUTE_SIGNALS
        if inc.cls == IncidentClass.SILENT_RANK:
            signals = (*COMPUTE_SIGNALS, *LINK_SIGNALS)
        found = compare(series, culprits, inc.onset_ms, int(s.baseline_s * 1000), int(s.window_s * 1000), s.rules,
                        signals, hosts)
        rec = hardware_record(found, inc.gpus, source.name, s.rules, source.note)
        rec["checked"] = "pcie, nvlink" if signals == LINK_SIGNALS else "clocks, temperature, power"
        return rec

    def _combined(self, inc: Incident, records: list[dict], now_ms: int) -> dict:
        best = max(records, key=lambda r: RANK[r["verdict"]])
        s = self.settings
        whole = inc.onset_ms + (s.window_s + s.lag_s) * 1000 <= now_ms
        return {**best, "sources": {r["source"]: r["verdict"] for r in records},
                "window_ms": {"before": [int(inc.onset_ms - s.baseline_s * 1000), int(inc.onset_ms)],
                              "after": [int(inc.onset_ms), int(inc.onset_ms + s.window_s * 1000)]},
                "final": bool(whole and all(r["verdict"] != "unavailable" for r in records))}

    def _log_once(self, source: str, line: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._logged.get(source, -1e9) < 60:
                return
            self._logged[source] = now
        log.warning("hardware evidence: %s", line)


def _groups(incidents: list[Incident]) -> list[list[Incident]]:
    """Incidents (by onset) in runs whose onsets lie within 6 hours of the run's first."""
    out: list[list[Incident]] = []
    for inc in incidents:
        if out and inc.onset_ms - out[-1][0].onset_ms <= _APART_MS:
            out[-1].append(inc)
        else:
            out.append([inc])
    return out


def hardware_evidence(store: Any, settings: HardwareSettings, env: Any) -> HardwareEvidence:
    """The evidence of the sources ``settings`` names: the store's ``gpu_health`` (unless turned
    off), dcgm-exporter in the Prometheus of ``prometheus_url``, Telegraf's ``nvidia_smi`` in
    database ``nvidia_smi_database`` of the store's InfluxDB (with the store's credentials)."""
    from analyzer.read.dcgm_prometheus import MIN_STEP_S, DcgmPrometheus
    from analyzer.read.gpu_health_store import GpuHealthStore
    from analyzer.read.telegraf_nvidia_smi import TelegrafNvidiaSmi
    from analyzer.service.hardware_config import AUTH_PREFIX
    from rankscope.bounded_http import HttpAuth, auth_from_env
    from rankscope.config import store_settings

    s = settings
    sources: list[TelemetrySource] = [GpuHealthStore(store, s.max_points)] if s.gpu_health else []
    max_bytes = int(s.prometheus_max_mb * (1 << 20))
    if s.prometheus_url:
        sources.append(DcgmPrometheus(s.prometheus_url, auth=auth_from_env(AUTH_PREFIX, env), timeout_s=s.prometheus_timeout_s,
                                      max_bytes=max_bytes, host_label=s.host_label, selector=s.selector,
                                      host_map=s.host_map, max_points=s.max_points,
                                      # the step gives an onset window its samples (min_samples), at most 30 s
                                      min_step_s=min(MIN_STEP_S, s.window_s / (s.rules.min_samples + 1)),
                                      baseline_points=s.baseline_points))
    url = getattr(store, "url", None)
    if s.nvidia_smi_database:
        if not url:
            raise ValueError(f"[hardware] nvidia_smi_database = {s.nvidia_smi_database!r} reads Telegraf's points "
                             f"on the store's InfluxDB, and the store {store!r} is not one")
        st = store_settings(url, env=env)
        sources.append(TelegrafNvidiaSmi(url, s.nvidia_smi_database, measurement=s.nvidia_smi_measurement,
                                         auth=HttpAuth(user=st.username, password=st.password) if st.username else None,
                                         influx_token=st.token, timeout_s=s.prometheus_timeout_s,
                                         max_bytes=max_bytes, host_map=s.host_map, max_points=s.max_points))
    return HardwareEvidence(sources, settings)
