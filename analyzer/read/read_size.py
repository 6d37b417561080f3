"""How many iterations one read of ``stage_latency`` asks for: bounded by rows, not iterations.

A read of 20 iterations is 260,000 rows at 12,960 ranks and 2,000,000 at 100,000; InfluxDB
1.6.7 answers about 100,000 rows in 3-6 s here (BENCHMARKS.md, shapes), so the larger read
would outlast the store's 30 s request timeout and the job's analysis would fail. A read
holds at most ``max_rows`` rows (whole iterations' worth, at least one), and the first read
of a job, before its size is known, asks for one iteration.

Example::

    >>> iterations_per_read(None, 20), iterations_per_read(512, 20)
    (1, 20)
    >>> iterations_per_read(12_960, 20), iterations_per_read(100_000, 20)
    (20, 4)
"""

from __future__ import annotations

#: Rows one read asks for at most (about 13 s on InfluxDB 1.6.7 here).
MAX_READ_ROWS = 400_000


def iterations_per_read(ranks: int | None, cap: int, max_rows: int = MAX_READ_ROWS) -> int:
    """Iterations of a job of ``ranks`` ranks one read holds: ``max_rows // ranks``, 1 to ``cap``."""
    if not ranks:
        return 1
    return max(1, min(int(cap), int(max_rows) // int(ranks)))
