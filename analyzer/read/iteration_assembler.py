"""Whole iterations out of points as real collectors write them.

A real collector stamps each rank's point with that rank's own clock: one iteration of a
10,000-rank job carries thousands of distinct milliseconds, hosts whose clocks drift by
seconds, points that arrive late and points the writer dropped. Reads therefore go by time
only to find *which* points are new; an iteration is identified by ``job`` + the
``iteration`` field, and :class:`IterationAssembler` hands on whole iterations only:

- rows are collected per ``(iteration, rank)`` (a re-read or a late rewrite replaces the
  row, so overlapping reads do no harm);
- the oldest pending iteration is *ready* when every expected rank has reported, or when the
  data has moved ``wait_ms`` past it (a later iteration's typical time), or when the wall
  clock has (a job that hangs, or whose last points never come). Expected are the ranks
  the caller names and every rank the assembler has seen since the job's newest restart,
  late rows included; before
  the caller knows the job (``expected=None``) an iteration goes on only by the wait: the
  first iteration's points may be only those of the hosts whose clocks run behind;
- iterations are handed on in order; rows of an iteration already handed on are late and
  are counted once, not used (the iteration was judged without them); a row read again
  (reads overlap by a margin, for late writers, and a failed cycle's reads are read again)
  is not late. The ranks each recent iteration went on with tell a late row from a re-read
  one; for older iterations only a row newer than every row added before can be new, so a
  re-read is never counted (a late row stamped before the newest point read, of an
  iteration no longer remembered, goes uncounted). Iterations before a reader's start
  (:meth:`skip_through`) are ignored, not late.

``wait_ms`` bounds how long a missing point is waited for. It must exceed the host clocks'
spread plus the writers' flush interval, or points of skewed hosts are counted missing.

Example::

    >>> import pandas as pd
    >>> asm = IterationAssembler(wait_ms=60_000)
    >>> rows = pd.DataFrame({"time": [1000, 1030, 31000], "rank": [0, 1, 0],
    ...                      "iteration": [1, 1, 2]})
    >>> asm.add(rows)
    >>> len(asm.ready(expected=None))   # the job's size unknown: it waits
    0
    >>> asm.ready(expected=2)["iteration"].tolist()   # iteration 1 complete; 2 lacks rank 1
    [1, 1]
    >>> asm.pending_iterations()
    [2]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope import schema

IT = schema.ITERATION_FIELD
SEGMENT = schema.SEGMENT_COLUMN   # analyzer/read/attempts.py: the restart a row belongs to
#: Iterations handed on whose ranks are remembered (re-reads reach a couple of minutes back).
HANDED_KEPT = 32


@dataclass
class AssemblyCounts:
    """What the assembler saw: rows used, late rows dropped, iterations handed on short."""

    rows: int = 0
    late_rows: int = 0
    short_iterations: int = 0


class IterationAssembler:
    """Collects ``stage_latency`` rows and hands on whole iterations, oldest first.

    Parameters: ``wait_ms``, how far the data (or the clock) must be past an incomplete
    iteration before it is handed on with the ranks it has.
    """

    def __init__(self, wait_ms: int = 15_000):
        self.wait_ms = int(wait_ms)
        self.last_iteration = -1          # the newest iteration handed on
        self.counts = AssemblyCounts()
        self._rows: pd.DataFrame | None = None
        self._ranks = np.empty(0, dtype=np.int64)   # every rank ever seen (sorted)
        self._handed: dict[int, np.ndarray] = {}     # recent iterations handed on: their ranks
        self._skip = -1                              # iterations up to this are not ours
        self._seen_ms: int | None = None             # the newest row time added: older rows may be re-reads
        self._segment = 0                            # the newest restart's segment (attempts.py)

    def skip_through(self, iteration: int) -> None:
        """Ignore iterations up to ``iteration`` (a reader starting inside the data: its oldest
        iteration is partial, and the rest of it, read later, is not late)."""
        self._skip = max(self._skip, int(iteration))
        self.last_iteration = max(self.last_iteration, int(iteration))

    @property
    def ranks_seen(self) -> int:
        """Ranks that have sent a row, late ones included."""
        return len(self._ranks)

    def add(self, frame: pd.DataFrame) -> None:
        """Rows read from the store (any time range, overlaps and repeats allowed)."""
        if frame is None or not len(frame):
            return
        self._follow_ranks(frame)
        it = frame[IT].to_numpy(dtype=np.int64)
        times = frame["time"].to_numpy(dtype=np.int64)
        seen, self._seen_ms = self._seen_ms, int(times.max()) if self._seen_ms is None else max(
            self._seen_ms, int(times.max()))
        late = it <= self.last_iteration
        if late.any():
            ours = late & (it > self._skip)
            fresh = np.ones(len(frame), dtype=bool) if seen is None else times > seen
            self._count_late(frame.loc[ours], fresh[ours])
            frame = frame.loc[~late]
        if not len(frame):
            return
        rows = frame if self._rows is None else pd.concat([self._rows, frame], ignore_index=True)
        self._rows = rows.drop_duplicates([IT, "rank"], keep="last").reset_index(drop=True)

    def _follow_ranks(self, frame: pd.DataFrame) -> None:
        """The ranks a whole iteration has: every rank seen since the job's newest restart
        (``segment`` column, analyzer/read/attempts.py): ranks that left at a restart are
        not waited for."""
        ranks = frame["rank"].to_numpy(dtype=np.int64)
        if SEGMENT in frame.columns:
            seg = frame[SEGMENT].to_numpy(dtype=np.int64)
            if int(seg.max()) > self._segment:
                self._segment, self._ranks = int(seg.max()), np.empty(0, dtype=np.int64)
            ranks = ranks[seg == self._segment]
        self._ranks = np.union1d(self._ranks, ranks)

    def _count_late(self, late: pd.DataFrame, fresh: np.ndarray) -> None:
        """Count the rows of iterations handed on that were not there when they were, each
        once: a rank an iteration did not go on with (then remembered with it), or, for an
        iteration no longer remembered, a ``fresh`` row (newer than every row added before)."""
        if not len(late):
            return
        its = late[IT].to_numpy(dtype=np.int64)
        ranks = late["rank"].to_numpy(dtype=np.int64)
        for i in np.unique(its):
            had = self._handed.get(int(i))
            if had is None:
                self.counts.late_rows += len(np.unique(ranks[(its == i) & fresh]))
                continue
            r = np.unique(ranks[its == i])
            new = r[~np.isin(r, had)]
            self.counts.late_rows += len(new)
            self._handed[int(i)] = np.union1d(had, new)

    def pending_iterations(self) -> list[int]:
        """Iterations held, oldest first."""
        if self._rows is None:
            return []
        return np.unique(self._rows[IT].to_numpy(dtype=np.int64)).tolist()

    def pending(self) -> pd.DataFrame:
        """Every row held (for looking, e.g. at the ranks and tags seen so far)."""
        return pd.DataFrame() if self._rows is None else self._rows

    def ready(self, expected: int | None, now_ms: int | None = None, final: bool = False) -> pd.DataFrame:
        """The rows of the iterations ready now (removed from the assembler), oldest first.

        ``expected``: ranks an iteration is complete with, at least every rank seen so far
        (None: not known yet, an iteration goes on by the wait only); ``now_ms``: the wall
        clock; ``final`` hands on everything held."""
        rows = self._rows
        if rows is None or not len(rows):
            return pd.DataFrame()
        it = rows[IT].to_numpy(dtype=np.int64)
        uniq, idx = np.unique(it, return_inverse=True)
        counts = np.bincount(idx, minlength=len(uniq))
        # an iteration's typical time: robust to a host whose clock runs seconds ahead
        t = pd.Series(rows["time"].to_numpy(dtype=np.int64)).groupby(idx).median().to_numpy()
        need = max(int(counts.max()) if expected is None else int(expected), self.ranks_seen)
        if final:
            n = len(uniq)
        else:
            complete = counts >= need if expected is not None else np.zeros(len(uniq), dtype=bool)
            horizon = np.maximum.accumulate(t[::-1])[::-1]   # newest typical time at or after each
            later = np.r_[horizon[1:], -np.inf]              # ... strictly after it
            passed = later - t >= self.wait_ms
            if now_ms is not None:
                passed |= now_ms - t >= self.wait_ms
            ok = complete | passed
            n = len(uniq) if ok.all() else int(np.argmin(ok))   # the ready prefix, in order
        if n == 0:
            return pd.DataFrame()
        take = it <= uniq[n - 1]
        out, rest = rows.loc[take], rows.loc[~take]
        # what went on, for telling a late row from a re-read one
        o_it, o_r = out[IT].to_numpy(dtype=np.int64), out["rank"].to_numpy(dtype=np.int64)
        for i in uniq[:n]:
            self._handed[int(i)] = np.unique(o_r[o_it == i])
        for old in sorted(self._handed)[:-HANDED_KEPT]:
            del self._handed[old]
        self._rows = rest.reset_index(drop=True) if len(rest) else None
        self.last_iteration = int(uniq[n - 1])
        self.counts.rows += len(out)
        self.counts.short_iterations += int((counts[:n] < need).sum())
        return out.sort_values([IT, "rank"], kind="stable").reset_index(drop=True)
