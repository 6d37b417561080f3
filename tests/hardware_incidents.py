"""Incidents on the GPUs of :class:`tests.dcgm_series.Job` jobs, checked by the real
:class:`~analyzer.service.hardware_evidence.HardwareEvidence` against a source, as the analyzer's
cycle hands them over (the job's topology and the time its data reaches)."""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.read.gpu_samples import TelemetrySource
from analyzer.service.hardware_config import HardwareSettings
from analyzer.service.hardware_evidence import HardwareEvidence
from rankscope.incident import Incident, IncidentClass
from rankscope.topology import Topology
from tests.dcgm_series import AFTER_S, Job


@dataclass
class Cycle:
    """What a cycle hands the evidence: the job's topology and the time its data reaches."""

    topo: Topology
    last_time_ms: int


def topology(job: Job) -> Topology:
    return Topology(dp=job.nodes * job.gpus, gpus_per_node=job.gpus, hosts=tuple(job.hosts()))


def incident(job: Job, cls: IncidentClass = IncidentClass.COMPUTE_STRAGGLER, uuids: bool = False,
             suffix: str = "1") -> Incident:
    """The incident naming ``job``'s culprit host's ranks (and their GPUs' UUIDs with ``uuids``)."""
    ranks = list(range(job.culprit * job.gpus, (job.culprit + 1) * job.gpus))
    host = job.hosts()[job.culprit]
    gpus = [{"rank": r, "host": host, "gpu": r % job.gpus, "uuid": job.uuid(job.culprit, r % job.gpus) if uuids else None}
            for r in ranks]
    stage = "mlp" if cls == IncidentClass.COMPUTE_STRAGGLER else "all_reduce"
    return Incident(id=f"{job.name}-{cls.short}-{suffix}", job=job.name, cls=cls, ranks=ranks, nodes=[job.culprit],
                    stage=stage, ratio=3.0, group_type="dp", group_ranks=ranks, onset_iteration=10,
                    onset_ms=job.onset_ms, hosts=[host], gpus=gpus)


def check(job: Job, source: TelemetrySource, incidents: list[Incident] | None = None,
          settings: HardwareSettings | None = None, now_ms: int | None = None) -> list[Incident]:
    """``incidents`` (default: the culprit's compute straggler) with the evidence ``source`` gives."""
    incs = incidents if incidents is not None else [incident(job)]
    ev = HardwareEvidence([source], settings)
    ev.attach(job.name, incs, Cycle(topology(job), now_ms or job.onset_ms + AFTER_S * 1000))
    return incs


def signals(hw: dict) -> set[str]:
    """Every signal that sets one of the culprit GPUs apart."""
    return {s["signal"] for g in hw["gpus"] for s in g["signals"]}
