"""One analyzer cycle over everything stored, for the demos, the accuracy suite and the tests."""

from __future__ import annotations

from analyzer.config import AnalyzerConfig
from analyzer.read.gpu_health_store import GpuHealthStore
from analyzer.service.analyzer_service import AnalyzerService
from analyzer.service.hardware_evidence import HardwareEvidence
from rankscope.schema import StageSet
from rankscope.store import Store
from rankscope.topology import Topology


def run_once(store: Store, job: str | None = None, topology: Topology | None = None,
             config: AnalyzerConfig | None = None, stages: StageSet | None = None,
             progress: bool = False, evidence: list | None = None) -> list[dict]:
    """One cycle over everything stored; the incidents (``to_json`` dicts) it knows of. ``evidence``:
    the sources of hardware evidence (default: the store's own ``gpu_health``)."""
    if evidence is None:
        evidence = [HardwareEvidence([GpuHealthStore(store)])]
    svc = AnalyzerService(store, config, stages, jobs=[job] if job else None, topology=topology,
                          progress=progress, evidence=evidence)
    svc.cycle(final=True)
    return [i.to_json() for i in svc.stored_incidents(job)]
