"""Which jobs an analyzer replica owns: ``--shard K/N``, by a stable hash of the job name.

The jobs of a cluster are split over ``N`` analyzer replicas the way Prometheus splits
scrape targets with its ``hashmod`` relabel action: the MD5 digest of the job name (UTF-8),
its last 8 bytes read as a big-endian unsigned 64-bit integer, modulo ``N``. Replica ``K``
analyzes the jobs whose value is ``K``. So:

- every job is in exactly one of the ``N`` shards (the shards partition the jobs);
- the shard of a job depends on its name and ``N`` only: every process, on every machine and
  every Python version, computes the same (Python's own ``hash()`` of a string is salted
  per process and cannot be used);
- it is the value Prometheus' ``hashmod`` with ``modulus: N`` gives for the same string.

Shards are numbered from 0, as StatefulSet pod ordinals are: ``K`` is in ``0..N-1``, so the
pod with ordinal ``K`` of a StatefulSet of ``N`` replicas runs ``--shard K/N``. ``0/1`` is
every job. Two replicas given the same ``K/N`` (high availability) analyze the same jobs and
write the same points (docs/scaling.md).

Example::

    >>> shard = Shard.parse("1/2")
    >>> str(shard), shard.index, shard.count
    ('1/2', 1, 2)
    >>> shard_of("il-0477", 2), shard.owns("il-0477")
    (1, True)
    >>> try:
    ...     Shard.parse("3/2")
    ... except ShardSpecError as exc:
    ...     print(exc)
    shard '3/2': K must be in 0..1 (shards are numbered from 0 to N-1, as StatefulSet ordinals are; the last of 2 is 1/2)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

#: The environment variable that gives the shard when ``--shard`` does not (a StatefulSet
#: composes it from the pod's ordinal: deploy/kubernetes/).
SHARD_ENV = "RANKSCOPE_SHARD"

_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
_RULE = "expected K/N, two whole numbers: N the number of shards (1 or more), K this replica's shard in 0..N-1, e.g. 0/2"


class ShardSpecError(ValueError):
    """A shard spec that is not ``K/N`` with ``0 <= K < N``."""


def job_hash(job: str) -> int:
    """The stable 64-bit hash of a job name: the last 8 bytes of its MD5 digest, big-endian
    (Prometheus' ``hashmod``)."""
    return int.from_bytes(hashlib.md5(job.encode("utf-8"), usedforsecurity=False).digest()[8:], "big")


def shard_of(job: str, count: int) -> int:
    """The shard (``0..count-1``) that owns ``job`` among ``count``."""
    return job_hash(job) % count


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ShardSpecError(f"shard '{self.index}/{self.count}': N, the number of shards, must be "
                                 f"1 or more (0/1 is every job)")
        if not 0 <= self.index < self.count:
            raise ShardSpecError(f"shard '{self.index}/{self.count}': K must be in 0..{self.count - 1} "
                                 f"(shards are numbered from 0 to N-1, as StatefulSet ordinals are; the "
                                 f"last of {self.count} is {self.count - 1}/{self.count})")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"K/N"`` -> a shard; anything else raises :class:`ShardSpecError` naming the value
        and the rule."""
        m = _SPEC.fullmatch(text)
        if not m:
            raise ShardSpecError(f"shard {text!r}: {_RULE}")
        return cls(int(m.group(1)), int(m.group(2)))

    def owns(self, job: str) -> bool:
        return shard_of(job, self.count) == self.index

    def select(self, jobs: Iterable[str]) -> list[str]:
        """The jobs of ``jobs`` this shard owns, in their order."""
        return [j for j in jobs if self.owns(j)]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


__all__ = ["SHARD_ENV", "Shard", "ShardSpecError", "job_hash", "shard_of"]
