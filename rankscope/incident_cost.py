"""What an incident costs the job (:class:`Impact`, part of :class:`rankscope.incident.Incident`)
and the words the briefing says it in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankscope.incident_vocabulary import IncidentClass

#: Classes whose incidents have no what-if, and why (said in the cost instead of a figure).
NO_WHAT_IF: dict[IncidentClass, str] = {
    IncidentClass.SILENT_RANK: "no what-if: silent ranks report no time, so none of the job's time can be "
                               "put down to them",
}


def seconds_text(s: float) -> str:
    """An iteration time as people read it: ``30.3``, ``0.25``."""
    return f"{s:.1f}" if abs(s) >= 10 else f"{s:.3g}"


def gpu_hours_text(h: float) -> str:
    """GPU-hours: whole ones from 10 on (``7,055``), two significant digits below (``0.044``)."""
    return f"{h:,.0f}" if abs(h) >= 10 or h == 0 else f"{h:.2g}"


@dataclass
class Impact:
    """What an incident costs the job.

    ``iteration_s_before``: the job's iteration time (median over ranks) before the onset;
    ``iteration_s_now``: since the onset (or until the resolution); ``slowdown`` their
    ratio; ``gpu_hours_lost``: world size x the excess time so far (final once resolved);
    ``iteration_s_if_restored``: the job's iteration time with the culprits restored (their
    excess removed, with the waits it causes the others). NaN where not known, and for the
    classes of :data:`NO_WHAT_IF`.
    """

    iteration_s_before: float = float("nan")
    iteration_s_now: float = float("nan")
    slowdown: float = float("nan")
    gpu_hours_lost: float = 0.0
    iteration_s_if_restored: float = float("nan")

    FIELDS = ("iteration_s_before", "iteration_s_now", "slowdown", "gpu_hours_lost", "iteration_s_if_restored")

    def to_json(self) -> dict[str, float | None]:
        """JSON's shape: unknown values as null."""
        return {k: (None if v != v else round(float(v), 4)) for k, v in self.__dict__.items()}

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> Impact:
        def num(v: Any) -> float:
            try:
                return float(v) if v is not None else float("nan")
            except (TypeError, ValueError):
                return float("nan")

        out = cls(**{k: num(values.get(k)) for k in cls.FIELDS})
        if out.gpu_hours_lost != out.gpu_hours_lost:
            out.gpu_hours_lost = 0.0
        return out
