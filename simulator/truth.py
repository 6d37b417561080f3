"""Ground truth of a simulated run: which ranks were made slow, how, and when.

Written as JSON next to the run's output so the analyzer's diagnoses can be
scored against it. Iterations are the scenario's; ``times_ms`` holds the
timestamp each iteration was written with, so onsets can also be matched in time.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: A job name used as it is in a file name: a letter or digit, then letters, digits, ``._-``.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")


def write_json_file(path: str | Path, text: str) -> Path:
    """Write a truth's JSON ``text`` to ``path`` (its folder made), ending in a newline."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def truth_file_name(job: str) -> str:
    """``<job>.truth.json`` for a job name that is a plain file name; any other name (``/``,
    ``..``, a leading dot, spaces, over 100 characters) is made one: its other characters
    become ``_``, leading dots go, and 8 hex digits of its SHA-256 keep two such names apart.
    The job name itself stays what it is in the store; only the file's name is derived, so it
    lies in the folder it is put in, whatever the name.

        >>> truth_file_name("il-0477"), truth_file_name("../../x")
        ('il-0477.truth.json', 'x-9cdf6a50.truth.json')
    """
    if _SAFE_NAME.fullmatch(job):
        return f"{job}.truth.json"
    stem = _UNSAFE_RUN.sub("_", job).lstrip("._")[:80] or "job"
    digest = hashlib.sha256(job.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{stem}-{digest}.truth.json"


@dataclass
class Truth:
    """What was injected into a run.

    ``faults``: ``{kind, ranks, nodes, stage, factor, start, end}`` per fault
    (iterations, ``end`` exclusive or None), plus ``start_time_ms``/``end_time_ms``
    once the run has reached them; ``events``: the out-of-band events written
    (``name, at, node, rank, severity, source, text`` and ``time_ms``).
    """

    job: str
    topology: dict[str, Any]
    faults: list[dict[str, Any]]
    events: list[dict[str, Any]]
    scenario: str = ""
    seed: int = 0
    iterations: int = 0
    times_ms: list[int] = field(default_factory=list)
    #: Nodes moved to other machines: ``{node, at, host}`` (their faults ended at ``at``).
    swaps: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_scenario(cls, scenario) -> Truth:
        topo = scenario.topology
        return cls(job=scenario.job, topology=topo.to_dict(),
                   faults=[f.to_dict(topo) for f in scenario.faults],
                   events=[e.to_dict() for e in scenario.events],
                   scenario=scenario.name, seed=scenario.seed, iterations=scenario.iterations,
                   swaps=[s.to_dict() for s in getattr(scenario, "swaps", [])])

    def _time_of(self, iteration: int | None) -> int | None:
        if iteration is None or not 0 <= iteration < len(self.times_ms):
            return None
        return int(self.times_ms[iteration])

    def finalise(self) -> None:
        """Attach the timestamps of onsets, ends and events the run reached."""
        for f in self.faults:
            f["start_time_ms"] = self._time_of(f["start"])
            f["end_time_ms"] = self._time_of(f["end"])
        for e in self.events:
            e["time_ms"] = self._time_of(e["at"])

    @property
    def culprit_ranks(self) -> list[int]:
        """All ranks any fault names, sorted."""
        return sorted({r for f in self.faults for r in f["ranks"]})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Truth:
        data = json.loads(text)
        missing = {"job", "topology", "faults", "events"} - set(data)
        if missing:
            raise ValueError(f"truth JSON lacks {', '.join(sorted(missing))}")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, path: str | Path) -> Path:
        return write_json_file(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> Truth:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
