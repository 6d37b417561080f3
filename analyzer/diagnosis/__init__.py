"""Diagnosis: from each iteration's scores to incidents with culprits, class and evidence.

Fourth hop of the analyzer's flow (read -> detect -> score -> **diagnosis** -> write). Owns the
rules, one module per fault family, run by the :class:`Diagnoser` in the order of
:data:`RULES` (transient stalls, stragglers, links, pipeline, arrival, silence) under the
protocol of :mod:`~analyzer.diagnosis.rule`; the book of open and recent incidents; the
verdicts on out-of-band events; and the job's health (:mod:`~analyzer.diagnosis.health`: data
completeness and the sporadic stalls counted as noise). Pure computation: no I/O.

May import: the core (``rankscope``: topology, schema, the incident model, host names),
``analyzer.config``, ``analyzer.detect``, ``analyzer.score`` and itself; not ``write/``,
``read/`` or ``service/``.
"""

from analyzer.diagnosis.diagnoser import RULES, Diagnoser
from analyzer.diagnosis.health import Completeness, DiagnosisHealth
from analyzer.diagnosis.observation import Observation

__all__ = ["RULES", "Completeness", "Diagnoser", "DiagnosisHealth", "Observation"]
