"""Stages and the fields of ``stage_latency`` they must not collide with: :class:`Stage`, a
validated declaration, and :class:`StageSet`, an ordered set of them (re-exported by
:mod:`rankscope.schema`, the data model's one entry).

Example::

    >>> StageSet((Stage("mlp", "compute"), Stage("reduce_scatter", "comm", "dp"))).names
    ['mlp', 'reduce_scatter']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

#: Tags of one ``stage_latency`` point (all strings in InfluxDB; ints in frames except job
#: and host). ``host`` (the machine's host name) and ``gpu`` (the local device index) are
#: written where the collector knows them.
RANK_TAGS = ("job", "rank", "pp", "dp", "tp", "ep_group", "node", "host", "gpu")
#: Non-stage fields of ``stage_latency``.
ITERATION_FIELD = "iteration"
ITERATION_MS_FIELD = "iteration_ms"
#: The GPU's UUID (``GPU-...``), a string field where known: one value per rank, not a tag.
GPU_UUID_FIELD = "gpu_uuid"
#: The job's attempt (torchrun's ``TORCHELASTIC_RESTART_COUNT``: 0, then 1 after the first
#: restart...), an integer field where the collector knows it: a field, not a tag, so a
#: restart does not double the job's series. Without it the analyzer sees a restart by the
#: iteration numbers going back (analyzer/read/attempts.py).
ATTEMPT_FIELD = "attempt"
#: Not stored: the column the analyzer's reader adds to the rows, the job's segment (restart).
SEGMENT_COLUMN = "segment"
RESERVED_FIELDS = frozenset({ITERATION_FIELD, ITERATION_MS_FIELD, GPU_UUID_FIELD, ATTEMPT_FIELD, SEGMENT_COLUMN,
                             "time", *RANK_TAGS})

StageKind = Literal["compute", "comm", "host"]
STAGE_KINDS: tuple[StageKind, ...] = ("compute", "comm", "host")
#: Group kinds a communication stage can run in (see ``Topology.group_ids``).
COMM_GROUPS = ("tp", "dp", "ep", "edp", "pipeline")


class SchemaError(ValueError):
    """A stage declaration or a frame that does not fit the data model."""


@dataclass(frozen=True)
class Stage:
    """One timed stage of an iteration.

    ``kind`` says what its time means: ``compute`` is pure device work (no
    communication), ``comm`` a collective or p2p transfer whose measured time
    includes waiting for the other members of ``group``, ``host`` CPU-side work
    such as the data loader.
    """

    name: str
    kind: StageKind
    group: str | None = None
    description: str = ""
    #: The training framework's own names for this stage (e.g. Megatron-LM timer names).
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.aliases, tuple) or not all(isinstance(a, str) and a for a in self.aliases):
            raise SchemaError(f"stage {self.name!r}: alias must be a list of non-empty names, got {self.aliases!r}")
        if not self.name or not self.name.replace("_", "").isalnum():
            raise SchemaError(f"stage name {self.name!r} must be letters, digits and '_'")
        if self.name in RESERVED_FIELDS:
            raise SchemaError(f"stage name {self.name!r} is reserved")
        if self.kind not in STAGE_KINDS:
            raise SchemaError(f"stage {self.name!r}: kind {self.kind!r} is not one of {', '.join(STAGE_KINDS)}")
        if self.kind == "comm" and self.group not in COMM_GROUPS:
            raise SchemaError(
                f"stage {self.name!r}: a comm stage needs group = one of {', '.join(COMM_GROUPS)}, got {self.group!r}"
            )
        if self.kind != "comm" and self.group is not None:
            raise SchemaError(f"stage {self.name!r}: only comm stages have a group")


@dataclass(frozen=True)
class StageSet:
    """An ordered set of stages; the field names of ``stage_latency``."""

    stages: tuple[Stage, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.stages]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise SchemaError(f"duplicate stage name(s): {', '.join(sorted(dup))}")
        if not names:
            raise SchemaError("a stage set needs at least one stage")

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def __iter__(self):
        return iter(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __getitem__(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise SchemaError(f"unknown stage {name!r}; known: {', '.join(self.names)}")

    def of_kind(self, kind: StageKind) -> list[str]:
        return [s.name for s in self.stages if s.kind == kind]

    def index(self, name: str) -> int:
        return self.names.index(self[name].name)

    @classmethod
    def from_config(cls, table: Mapping[str, object]) -> StageSet:
        """Build from a ``[stages]`` config table.

        Each entry is ``name = "compute"`` / ``"host"``, or
        ``name = {kind = "comm", group = "dp"}``; an optional ``alias`` list maps
        the training framework's own timer names (e.g. Megatron-LM's
        ``"forward-compute"``) to the stage.
        """
        stages = []
        for name, spec in table.items():
            if isinstance(spec, str):
                stages.append(Stage(name, spec))  # type: ignore[arg-type]
            elif isinstance(spec, Mapping):
                unknown = set(spec) - {"kind", "group", "description", "alias"}
                if unknown:
                    raise SchemaError(f"stage {name!r}: unknown key(s) {', '.join(sorted(unknown))}")
                alias = spec.get("alias", ())
                alias = (alias,) if isinstance(alias, str) else tuple(alias) if isinstance(alias, list) else alias
                stages.append(Stage(name, spec.get("kind"), spec.get("group"), spec.get("description", ""), alias))  # type: ignore[arg-type]
            else:
                raise SchemaError(f"stage {name!r}: expected a kind string or a table, got {spec!r}")
        return cls(tuple(stages))
