"""A job's attempts: restarts from a checkpoint, seen in the rows, and the analyzer's steps.

After a crash a job resumes from its last checkpoint: its iteration numbers go back (it
crashed at 29, it resumes at 10) and iterations 10-29 run again, later. The analyzer needs one
order over every iteration the job executed, so each row gets a **step**: its iteration plus
its segment's offset, chosen so that a segment's first step follows the previous segment's
last. Before the first restart the step is the iteration. Steps are the iteration numbers of
everything the analyzer writes; ``job_lifecycle`` points map them back.

A segment begins

- at a **restart**: the rows' ``attempt`` field (``TORCHELASTIC_RESTART_COUNT``, written by the
  collector) grows, or, without it, a rank's iteration goes back (to its previous one or
  below) in a row stamped later than that rank's newest, after a pause of that rank's rows
  longer than ``min_gap_ms`` and than 3 of its iterations (a restart takes time: one late
  point stamped by a clock that moved on is no restart). The ranks' first rows of one restart
  are one boundary when they lie within ``merge_ms`` of each other (host clocks differ by
  seconds, a restart takes minutes); a row belongs to the newest segment begun at or before
  its time;
- at a **start**: a rank writes again after more than ``idle_ms`` without a point, from an
  iteration not past its previous one: the job had ended, and a new job reuses its name (the
  analyzer starts afresh there). Iterations that go on after such a gap are the same job (its
  collectors were down, or a trace has a gap);
- a rank written from another host than the one it runs on, with no pause between (two jobs
  under one name), is bad input: those rows are refused and said;
- at a **jump**: at least half the ranks' iterations leap more than ``max_jump`` past their
  previous one (a counter reset or re-based). Fewer ranks doing so is bad input: their rows
  are refused, counted and logged, and nothing else is lost.

Rows that fit no segment (an iteration before its restart's first one, a late row of an older
segment that reaches the next segment's first step) are refused and counted. A restarted
analyzer restores the segments from the ``job_lifecycle`` points and numbers steps as before.

Parameters: ``merge_ms`` (default 30 s), ``min_gap_ms`` (default 10 s), ``max_jump`` (default 100,000 iterations),
``idle_ms`` (default None: a job never ends by a gap),
``base_step`` (the first step of a job that reuses an ended job's name: its steps, and so its
incident ids, follow the old job's).

Example::

    >>> import pandas as pd
    >>> att = Attempts()
    >>> rows = pd.DataFrame({"time": [0, 1_000, 200_000, 201_000], "rank": [0, 0, 0, 0],
    ...                      "iteration": [28, 29, 10, 11]})
    >>> att.steps(rows)["iteration"].tolist()
    [28, 29, 30, 31]
    >>> [(s.kind, s.first_iteration, s.first_step) for s in att.take_new()]
    [('restart', 10, 30)]
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope import schema

log = logging.getLogger(__name__)

IT = schema.ITERATION_FIELD
ATTEMPT = schema.ATTEMPT_FIELD
#: The column the rows handed on carry: the index of their segment.
SEGMENT = schema.SEGMENT_COLUMN
_NEVER = np.iinfo(np.int64).min


@dataclass
class Segment:
    """A run of a job's iterations without a restart: from ``start_ms``, its first iteration
    (the framework's number) is step ``first_step``."""

    kind: str            # "start", "restart" or "jump"
    start_ms: int
    first_iteration: int
    first_step: int
    attempt: int
    ranks: int = 0

    @property
    def offset(self) -> int:
        return self.first_step - self.first_iteration

    def row(self, job: str) -> dict:
        """Its ``job_lifecycle`` point."""
        text = {"restart": f"restart (attempt {self.attempt}): resumed at iteration {self.first_iteration}",
                "jump": f"iteration numbers jumped to {self.first_iteration}",
                "start": f"a new job under this name, from iteration {self.first_iteration}"}[self.kind]
        return {"time": int(self.start_ms), "job": job, "event": self.kind, "attempt": int(self.attempt),
                IT: int(self.first_iteration), "step": int(self.first_step), "ranks": int(self.ranks),
                "text": text}


@dataclass
class _Rows:
    """A read's new rows ordered by rank then time (``order``: their index in the read), each
    with its rank's previous row (``p_*``; ``has_prev``: the rank had one; ``first``: the
    rank's first row in the read)."""

    order: np.ndarray
    r: np.ndarray
    t: np.ndarray
    it: np.ndarray
    att: np.ndarray
    host: np.ndarray
    has_prev: np.ndarray
    p_t: np.ndarray
    p_it: np.ndarray
    p_att: np.ndarray
    p_host: np.ndarray
    first: np.ndarray


class Attempts:
    """Numbers a job's rows by step across its restarts (see the module docstring)."""

    def __init__(self, job: str = "", merge_ms: int = 30_000, max_jump: int = 100_000, base_step: int = 0,
                 idle_ms: int | None = None, min_gap_ms: int = 10_000):
        self.job, self.merge_ms, self.max_jump = job, int(merge_ms), int(max_jump)
        self.idle_ms, self.min_gap_ms = idle_ms, int(min_gap_ms)
        self.period_ms = 0.0                   # the ranks' typical time between iterations
        self.segments = [Segment("start", _NEVER, 0, int(base_step), 0)]
        self.high = [-1]                       # each segment's newest step
        self.refused = 0                       # rows that fit no segment
        self._new: list[Segment] = []          # segments not yet taken (stored)
        self._last_t = np.empty(0, dtype=np.int64)    # each rank's newest row: time
        self._last_it = np.empty(0, dtype=np.int64)   # ... its iteration
        self._last_att = np.empty(0, dtype=np.int64)  # ... its attempt field (-1: none)
        self._last_host = np.empty(0, dtype=np.int64)  # ... its host (a code of _hosts; -1: none)
        self._hosts: dict[str, int] = {}

    # ------------------------------------------------------------ state
    def restore(self, rows: pd.DataFrame) -> None:
        """The segments a predecessor stored (``job_lifecycle`` points of the job)."""
        if rows is None or not len(rows) or "event" not in rows.columns:
            return
        for r in rows[rows["event"].isin(["restart", "jump", "start"])].sort_values("time").to_dict("records"):
            if any(abs(s.start_ms - int(r["time"])) <= self.merge_ms for s in self.segments[1:]):
                continue
            seg = Segment(str(r["event"]), int(r["time"]), int(r[IT]), int(r["step"]), int(r["attempt"]),
                          int(r.get("ranks", 0) or 0))
            self.high[-1] = max(self.high[-1], seg.first_step - 1)
            self.segments.append(seg)
            self.high.append(seg.first_step - 1)

    def take_new(self) -> list[Segment]:
        """Segments found since the last call (to be stored)."""
        new = [s for s in self._new if s.first_step >= 0]
        self._new = [s for s in self._new if s.first_step < 0]
        return new

    def warm_up(self, steps: np.ndarray, warmup: int) -> np.ndarray:
        """Which ``steps`` are among the first ``warmup`` of a restart (slow while caches,
        compilers and communicators warm up: nobody's fault)."""
        steps = np.asarray(steps, dtype=np.int64)
        out = np.zeros(len(steps), dtype=bool)
        for s in self.segments[1:]:
            if s.kind == "restart":
                out |= (steps >= s.first_step) & (steps < s.first_step + warmup)
        return out

    @property
    def attempt(self) -> int:
        """The newest segment's attempt number."""
        return self.segments[-1].attempt

    # ------------------------------------------------------------ numbering
    def steps(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` with ``iteration`` as steps and a ``segment`` column; rows that fit no
        segment are left out (counted in :attr:`refused`)."""
        if frame is None or not len(frame):
            return frame
        t = frame["time"].to_numpy(dtype=np.int64)
        r = frame["rank"].to_numpy(dtype=np.int64)
        it = frame[IT].to_numpy(dtype=np.int64)
        att = np.full(len(frame), -1, dtype=np.int64)
        if ATTEMPT in frame.columns:
            a = pd.to_numeric(frame[ATTEMPT], errors="coerce").to_numpy(dtype=float)
            att = np.where(np.isfinite(a) & (a >= 0), a, -1).astype(np.int64)
        host = self._host_codes(frame)
        ok = self._find_boundaries(t, r, it, att, host)
        seg = np.searchsorted([s.start_ms for s in self.segments], t, side="right") - 1
        step = np.zeros(len(frame), dtype=np.int64)
        for k in np.unique(seg[ok]):
            ok &= self._number(int(k), seg, it, step, ok)
        self._remember(t[ok], r[ok], it[ok], att[ok], host[ok])
        self.refused += int((~ok).sum())
        out = frame.loc[ok].copy()
        out[IT] = step[ok]
        out[SEGMENT] = seg[ok]
        return out

    def _number(self, k: int, seg: np.ndarray, it: np.ndarray, step: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Steps of segment ``k``'s rows; which of them fit (mask over all rows)."""
        s = self.segments[k]
        mine = ok & (seg == k)
        if s.first_step < 0:   # new: its first step follows the previous segment's newest
            s.first_step = self.high[k - 1] + 1
        step[mine] = it[mine] + s.offset
        fits = ~mine | (k == 0) | (it >= s.first_iteration)
        if k + 1 < len(self.segments) and self.segments[k + 1].first_step >= 0:
            fits &= ~mine | (step < self.segments[k + 1].first_step)
        if (mine & fits).any():
            self.high[k] = max(self.high[k], int(step[mine & fits].max()))
        return fits

    def _remember(self, t: np.ndarray, r: np.ndarray, it: np.ndarray, att: np.ndarray, host: np.ndarray) -> None:
        """Each rank's newest row, for telling its next rows' rewinds."""
        if not len(r):
            return
        n = int(r.max()) + 1
        if n > len(self._last_t):
            grow = n - len(self._last_t)
            self._last_t = np.r_[self._last_t, np.full(grow, _NEVER, dtype=np.int64)]
            self._last_it = np.r_[self._last_it, np.zeros(grow, dtype=np.int64)]
            self._last_att = np.r_[self._last_att, np.full(grow, -1, dtype=np.int64)]
            self._last_host = np.r_[self._last_host, np.full(grow, -1, dtype=np.int64)]
        order = np.lexsort((t, r))
        last = np.r_[r[order][1:] != r[order][:-1], True]   # each rank's newest row
        idx = order[last]
        idx = idx[t[idx] > self._last_t[r[idx]]]
        rr = r[idx]
        self._last_t[rr], self._last_it[rr], self._last_att[rr], self._last_host[rr] = (
            t[idx], it[idx], att[idx], host[idx])

    def _host_codes(self, frame: pd.DataFrame) -> np.ndarray:
        """The rows' host names as small integers (-1: none)."""
        if "host" not in frame.columns:
            return np.full(len(frame), -1, dtype=np.int64)
        codes, names = pd.factorize(frame["host"].astype(object), use_na_sentinel=True)
        known = np.array([self._hosts.setdefault(str(h), len(self._hosts)) if str(h) else -1 for h in names],
                         dtype=np.int64)
        return np.where(codes >= 0, known[np.maximum(codes, 0)] if len(known) else -1, -1).astype(np.int64)

    # ------------------------------------------------------------ boundaries
    def _sequence(self, t: np.ndarray, r: np.ndarray, it: np.ndarray, att: np.ndarray,
                  host: np.ndarray) -> _Rows | None:
        """The rows newer than their rank's newest, by rank and time, each beside its previous."""
        n = len(self._last_t)
        known = r < n
        at = np.minimum(r, max(n - 1, 0))
        prev_t = np.where(known, self._last_t[at], _NEVER) if n else np.full(len(t), _NEVER)
        new = np.flatnonzero(t > prev_t)
        if not len(new):
            return None
        o = new[np.lexsort((t[new], r[new]))]
        first = np.r_[True, r[o][1:] != r[o][:-1]]

        def prev(values: np.ndarray, last: np.ndarray, none: int) -> np.ndarray:
            before = np.where(known[o], last[at[o]], none) if n else np.full(len(o), none)
            return np.where(first, before, np.r_[none, values[o][:-1]])

        return _Rows(o, r[o], t[o], it[o], att[o], host[o], ~first | (prev_t[o] != _NEVER),
                     prev(t, self._last_t, _NEVER), prev(it, self._last_it, 0),
                     prev(att, self._last_att, -1), prev(host, self._last_host, -1), first)

    def _find_boundaries(self, t: np.ndarray, r: np.ndarray, it: np.ndarray, att: np.ndarray,
                         host: np.ndarray) -> np.ndarray:
        """New segments the rows show; the rows to keep (a jump of a few ranks, a rank written
        from two hosts at once, are refused)."""
        ok = np.ones(len(t), dtype=bool)
        q = self._sequence(t, r, it, att, host)
        if q is None:
            return ok
        grew = (q.att >= 0) & (q.p_att >= 0) & (q.att > q.p_att)
        self._follow_period(q.t - q.p_t, q.has_prev & (q.it == q.p_it + 1))
        paused = q.has_prev & (q.t - q.p_t > max(self.min_gap_ms, 3 * self.period_ms))
        restart = q.has_prev & (grew | ((q.it <= q.p_it) & paused & (q.att < 0)))
        # a new job under the name: points again after the idle time, from an iteration not past the
        # old one's (going on past it is the same job after an outage of its collectors or a gap in a trace)
        start = (q.has_prev & (q.t - q.p_t > self.idle_ms) & (q.it <= q.p_it) if self.idle_ms is not None
                 else np.zeros(len(q.t), bool))
        restart &= ~start
        jump = q.has_prev & ~restart & ~start & (q.it > q.p_it + self.max_jump)
        self._restarts(q.t[start], q.it[start], q.att[start], q.r[start], "start")
        self._restarts(q.t[restart], q.it[restart], q.att[restart], q.r[restart])
        self._joined(q.t[~q.has_prev])
        ok[q.order[self._two_writers(q, paused | grew)]] = False
        if jump.any():
            ok[q.order[jump]] &= self._jumps(q.t[jump], q.it[jump], q.r[jump], len(np.unique(q.r)))
        return ok

    def _joined(self, t: np.ndarray) -> None:
        """Ranks seen for the first time just before a new segment (a job that grew, or a new
        job under the name, on hosts whose clocks run behind) belong to it: the segment begins
        at their first row (within half of ``min_gap_ms``, less than any restart's pause)."""
        for s in self.segments[1:]:
            near = t[(t >= s.start_ms - self.min_gap_ms // 2) & (t < s.start_ms)]
            if len(near):
                s.start_ms = int(near.min())

    def _two_writers(self, q: _Rows, anew: np.ndarray) -> np.ndarray:
        """Rows of a rank written from another host than the one it runs on, with no restart
        between (two jobs under one name, or a copied config): refused, and said. A rank runs
        on the host of its first row, of its first row after a pause, or of a row that moves
        it to another host and goes on from its previous iteration (a replaced node); a row
        from another host whose iteration does not go on is the other writer's."""
        if not (q.host >= 0).any():
            return np.zeros(len(q.r), dtype=bool)
        idx = np.arange(len(q.r))
        moved = q.has_prev & (q.p_host >= 0) & (q.host >= 0) & (q.host != q.p_host) & (q.it > q.p_it)
        starts = q.first | anew | moved
        at = np.maximum.accumulate(np.where(starts, idx, 0))       # where each row's run began
        # the run's host: its first row's, but a rank's first run keeps the host it had before
        keep_before = q.first[at] & ~anew[at] & ~moved[at] & (q.p_host[at] >= 0)
        owner = np.where(keep_before, q.p_host[at], q.host[at])
        bad = (q.host >= 0) & (owner >= 0) & (q.host != owner)
        if bad.any():
            names = {v: k for k, v in self._hosts.items()}
            i = int(np.flatnonzero(bad)[0])
            log.error("job %s: %d row(s) of %d rank(s) come from another host than the rank runs on (rank %d on "
                      "%s, also written from %s) with no restart between: two jobs under one name? Those rows "
                      "are refused", self.job, int(bad.sum()), len(np.unique(q.r[bad])), int(q.r[i]),
                      names.get(int(owner[i]), "?"), names.get(int(q.host[i]), "?"))
        return bad

    def _follow_period(self, gaps: np.ndarray, consecutive: np.ndarray) -> None:
        """The typical time between a rank's consecutive iterations (a moving median)."""
        if consecutive.sum() >= 3:
            now = float(np.median(gaps[consecutive]))
            self.period_ms = now if self.period_ms == 0 else 0.8 * self.period_ms + 0.2 * now

    def _restarts(self, t: np.ndarray, it: np.ndarray, att: np.ndarray, ranks: np.ndarray,
                  kind: str = "restart") -> None:
        """Boundaries from the ranks' first rows of restarts (or new jobs), clustered in time."""
        if not len(t):
            return
        o = np.argsort(t, kind="stable")
        t, it, att, ranks = t[o], it[o], att[o], ranks[o]
        cut = np.r_[0, np.flatnonzero(np.diff(t) > self.merge_ms) + 1, len(t)]
        for a, b in zip(cut[:-1], cut[1:], strict=False):
            attempt = int(att[a:b].max()) if (att[a:b] >= 0).any() else (
                self.attempt + 1 if kind == "restart" else 0)
            self._boundary(kind, int(t[a]), int(it[a:b].min()), attempt, len(np.unique(ranks[a:b])))

    def _jumps(self, t: np.ndarray, it: np.ndarray, ranks: np.ndarray, of: int) -> np.ndarray:
        """A jump of at least half the ranks read is a new segment (rows kept); fewer ranks'
        is bad input (rows refused)."""
        n = len(np.unique(ranks))
        if 2 * n >= of:
            self._boundary("jump", int(t.min()), int(it.min()), self.attempt, n)
            return np.ones(len(t), dtype=bool)
        log.error("job %s: %d rank(s) (e.g. rank %d) jumped to iteration %d, more than %d past their "
                  "previous one, while the other ranks did not: %d row(s) refused", self.job, n,
                  int(ranks[0]), int(it[0]), self.max_jump, len(t))
        return np.zeros(len(t), dtype=bool)

    def _boundary(self, kind: str, start_ms: int, first_it: int, attempt: int, ranks: int) -> None:
        """A segment from ``start_ms``, or a known one within ``merge_ms`` moved earlier."""
        for s in self.segments[1:]:
            if abs(s.start_ms - start_ms) <= self.merge_ms:
                s.start_ms = min(s.start_ms, start_ms)
                return
        if start_ms < self.segments[-1].start_ms:
            log.warning("job %s: a restart at %d, before the newest known one, is ignored", self.job, start_ms)
            return
        seg = Segment(kind, start_ms, first_it, -1, attempt, ranks)
        self.segments.append(seg)
        self.high.append(-1)
        self._new.append(seg)
        log.info("job %s: %s at iteration %d (attempt %d, %d rank(s) seen)", self.job, kind, first_it,
                 attempt, ranks)
