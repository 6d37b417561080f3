"""Diagnosis rules, one module per fault-class family, run by the :class:`Diagnoser`."""

from analyzer.diagnosis.diagnoser import RULES, Diagnoser
from analyzer.diagnosis.observation import Observation

__all__ = ["RULES", "Diagnoser", "Observation"]
