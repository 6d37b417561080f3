"""The one small store interface the collector and the analyzer talk to.

A store writes frames of points and reads measurements back as frames. Two
backends implement it: :class:`~rankscope.store.influx.InfluxStore` (InfluxDB
1.x/2.x/3.x) and :class:`~rankscope.store.embedded.EmbeddedStore` (a local
SQLite file, for newcomers and the demo). Everything above this module is
pure functions over frames.

Frames: one row per point; a ``time`` column of integer epoch milliseconds;
tag columns (ints or strings); field columns (float, int or str). Reads return
the same shape, with the integer tags of :mod:`rankscope.schema` as ints.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.lineprotocol import check_key

log = logging.getLogger(__name__)

#: Tags that hold integers in frames (strings in InfluxDB).
INT_TAGS = frozenset({"rank", "pp", "dp", "tp", "ep_group", "node", "gpu", "group_id"})


@dataclass(frozen=True)
class Rejection:
    """One value refused by validation; the rest of its batch is still written."""

    row: int
    rank: int | None
    field: str
    value: float
    reason: str

    def __str__(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else f"row {self.row}"
        return f"{who}, {self.field}={self.value!r}: {self.reason}"


@dataclass
class WriteReport:
    measurement: str
    written: int = 0
    rejected: list[Rejection] = field(default_factory=list)


class RejectedPointsError(ValueError):
    """Raised after a write in which some points were refused (the valid ones were written)."""

    def __init__(self, report: WriteReport):
        self.report = report
        shown = "; ".join(str(r) for r in report.rejected[:5])
        more = f" (and {len(report.rejected) - 5} more)" if len(report.rejected) > 5 else ""
        super().__init__(
            f"{len(report.rejected)} point(s) of {report.measurement} refused, "
            f"{report.written} written: {shown}{more}"
        )


class StoreError(RuntimeError):
    """The backend failed (server down, bad query, bad credentials)."""


def validate(frame: pd.DataFrame, fields: Sequence[str], nonnegative: Sequence[str] = ()) -> tuple[np.ndarray, list[Rejection]]:
    """Mask of rows whose numeric fields are finite (and non-negative where asked).

    A NaN is a missing value (left out of the point), not an error; +-inf and
    negative durations are errors naming the rank and the field.
    """
    ok = np.ones(len(frame), dtype=bool)
    rejected: list[Rejection] = []
    ranks = frame["rank"].to_numpy() if "rank" in frame.columns else None
    nonneg = set(nonnegative)
    for f in fields:
        col = frame[f].to_numpy()
        if col.dtype.kind not in "fiu":
            continue
        bad = np.isinf(col) if col.dtype.kind == "f" else np.zeros(len(col), dtype=bool)
        neg = (col < 0) if f in nonneg else np.zeros(len(col), dtype=bool)
        for i in np.flatnonzero(bad | neg):
            reason = "not a finite number" if bad[i] else "a duration cannot be negative"
            rejected.append(Rejection(int(i), None if ranks is None else int(ranks[i]), f, float(col[i]), reason))
        ok &= ~(bad | neg)
    if "time" in frame.columns:
        tcol = frame["time"]
        if not pd.api.types.is_integer_dtype(tcol):
            raise ValueError("the time column must hold integer epoch milliseconds")
    return ok, rejected


def check_tags(frame: pd.DataFrame, tags: Sequence[str]) -> None:
    """Refuse tag values line protocol cannot carry (integer columns need no look)."""
    for t in tags:
        col = frame[t]
        if pd.api.types.is_integer_dtype(col):
            continue
        for v in pd.unique(col.astype(str)):
            check_key(v, f"tag {t!r} value")


class Store(ABC):
    """Write frames of points, read measurements back as frames."""

    bucket: str

    # -------------------------------------------------------------- writing
    def write(
        self,
        measurement: str,
        frame: pd.DataFrame,
        tags: Sequence[str],
        fields: Sequence[str],
        nonnegative: Sequence[str] = (),
    ) -> WriteReport:
        """Write ``frame`` (needs a ``time`` column of epoch ms).

        Invalid values (inf, negative durations) are refused with a
        :class:`RejectedPointsError` naming rank and field, raised AFTER the
        valid points of the batch have been written. A tag value that line
        protocol cannot carry refuses the whole batch before anything is written.
        """
        check_key(measurement, "measurement name")
        missing = [c for c in ("time", *tags, *fields) if c not in frame.columns]
        if missing:
            raise ValueError(f"{measurement}: frame lacks column(s) {', '.join(missing)}")
        for t in tags:
            check_key(t, "tag key")
        ok, rejected = validate(frame, fields, nonnegative)
        good = frame if ok.all() else frame.loc[ok]
        report = WriteReport(measurement, 0, rejected)
        if len(good):
            self._write(measurement, good, list(tags), list(fields), list(nonnegative))
            report.written = len(good)
        if rejected:
            raise RejectedPointsError(report)
        return report

    def write_measurement(self, measurement: str, frame: pd.DataFrame) -> WriteReport:
        """Write a frame of one of the schema's measurements: its tags, all other columns as fields."""
        m = schema.MEASUREMENTS[measurement]
        tags = [t for t in m.tags if t in frame.columns]
        fields = [c for c in frame.columns if c != "time" and c not in m.tags]
        return self.write(measurement, frame, tags, fields)

    def write_stage_latency(self, frame: pd.DataFrame) -> WriteReport:
        """Write ``stage_latency`` points (one row per rank per iteration)."""
        tags = [t for t in schema.RANK_TAGS if t in frame.columns]
        if "job" not in tags or "rank" not in tags:
            raise ValueError("stage_latency frames need job and rank columns")
        stages = schema.stage_fields(frame.columns)
        fields = [schema.ITERATION_FIELD, schema.ITERATION_MS_FIELD, schema.GPU_UUID_FIELD, schema.ATTEMPT_FIELD,
                  *stages]
        fields = [f for f in fields if f in frame.columns]
        return self.write(schema.STAGE_LATENCY, frame, tags, fields,
                          nonnegative=[schema.ITERATION_MS_FIELD, *stages])

    @abstractmethod
    def _write(self, measurement: str, frame: pd.DataFrame, tags: list[str], fields: list[str],
               nonnegative: list[str]) -> None:
        """Write validated points. A tag value line protocol cannot carry (see
        :func:`check_tags`) must refuse the whole frame before anything is written."""

    # -------------------------------------------------------------- reading
    @abstractmethod
    def read(
        self,
        measurement: str,
        job: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        where: dict[str, str | int | list] | None = None,
    ) -> pd.DataFrame:
        """Points of ``measurement`` (optionally one job, tag equalities, and an inclusive
        time range), sorted by time, as a frame with a ``time`` column in epoch ms.

        In ``where``, a value of None selects points that lack the tag, a list points with any
        of its values."""

    def read_sampled(self, measurement: str, job: str | None, start_ms: int, end_ms: int, every_ms: int,
                     where: dict[str, str | int | list] | None = None) -> pd.DataFrame:
        """As :meth:`read`, at most one point per series (tag set) and ``every_ms`` window of time:
        the window's last, stamped with the window's start (``GROUP BY time(every), *`` with
        ``last(*)``), so a read of 1 Hz samples over an hour stays small. This default reads
        everything and thins it; the InfluxDB backend asks the server for the thinned points."""
        df = self.read(measurement, job, start_ms, end_ms, where)
        if not len(df) or every_ms <= 1:
            return df
        tags = [t for t in schema.MEASUREMENTS[measurement].tags if t in df.columns] \
            if measurement in schema.MEASUREMENTS else []
        window = df["time"].to_numpy() // int(every_ms) * int(every_ms)
        out = df.assign(time=window).drop_duplicates([*tags, "time"], keep="last")
        return out.reset_index(drop=True)

    @abstractmethod
    def latest_times(self, measurement: str, job: str, n: int, before_ms: int | None = None) -> list[int]:
        """The ``n`` most recent distinct timestamps of a job's points, newest first (with
        ``before_ms``: of those at or before it, read from a rank that had points by then).

        Points with a ``rank`` tag are read from one series (the rank of the job's latest
        point): each rank stamps its own clock, so these are one per iteration of that rank,
        not every millisecond the job's ranks wrote."""

    @abstractmethod
    def next_times(self, measurement: str, job: str, after_ms: int | None, n: int) -> list[int]:
        """The ``n`` distinct timestamps of a job's points after ``after_ms`` (exclusive), oldest first.

        Lets a reader walk a long history in chunks of iterations. As :meth:`latest_times`,
        read from one rank's series where points have a ``rank``: the other ranks' points of
        an iteration may lie on either side of it (their own clocks), so a reader takes
        contiguous time ranges and assembles iterations by their ``iteration`` field.
        """

    @abstractmethod
    def tag_values(self, measurement: str, key: str) -> list[str]:
        """The distinct values of one tag of a measurement, sorted (empty when none)."""

    def jobs(self) -> list[str]:
        """Job names that have ``stage_latency`` points."""
        return self.tag_values(schema.STAGE_LATENCY, "job")

    def hosts(self) -> list[str]:
        """Host names the collectors reported in ``stage_latency``."""
        return self.tag_values(schema.STAGE_LATENCY, "host")

    def read_stage_latency(
        self,
        job: str,
        start_ms: int | None = None,
        end_ms: int | None = None,
        last_iterations: int | None = None,
    ) -> pd.DataFrame:
        """A job's ``stage_latency`` window: rows (iteration, rank), columns tags + stages.

        ``last_iterations`` selects the most recent N iterations (by timestamp)
        instead of, or inside, the time range. Rows without an ``iteration`` are left out:
        InfluxDB shows a point's fields one by one while it stores it, so a read racing a
        write sees points with some fields yet missing (a reader that reads again from a
        margin before its newest point, as the analyzer does, gets them whole), and a point
        written without one cannot be placed.
        """
        if last_iterations is not None:
            if last_iterations < 1:
                raise ValueError("last_iterations must be >= 1")
            times = self.latest_times(schema.STAGE_LATENCY, job, last_iterations)
            if not times:
                return pd.DataFrame()
            start_ms = max(start_ms or times[-1], times[-1])
        return stage_latency_rows(self.read(schema.STAGE_LATENCY, job, start_ms, end_ms))

    def read_events(self, job: str | None = None, start_ms: int | None = None,
                    end_ms: int | None = None, cluster: bool = True) -> pd.DataFrame:
        """Out-of-band events of ``job`` and, with ``cluster``, those that name no job (from the
        monitoring of the whole cluster: they are matched to jobs by host), sorted by time."""
        own = self.read(schema.EVENT, job, start_ms, end_ms)
        if job is None or not cluster:
            return own
        shared = self.read(schema.EVENT, None, start_ms, end_ms, where={"job": None})
        frames = [f for f in (own, shared) if len(f)]
        if not frames:
            return own
        out = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        return out.sort_values("time", kind="stable").reset_index(drop=True)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stage_latency_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Points of ``stage_latency`` as the analyzer takes them: those with an ``iteration`` (an
    integer), by time and rank. Shared by the reads and the stream of points."""
    if not len(df):
        return df
    if schema.ITERATION_FIELD not in df.columns:
        return df.iloc[:0]
    if df[schema.ITERATION_FIELD].isna().any():
        df = df.loc[df[schema.ITERATION_FIELD].notna()].copy()
    df[schema.ITERATION_FIELD] = df[schema.ITERATION_FIELD].astype(np.int64)
    return df.sort_values(["time", "rank"], kind="stable").reset_index(drop=True)


def normalise_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Integer tags to ints; sorted by time. Shared by both backends' reads."""
    for t in INT_TAGS & set(df.columns):
        col = df[t]
        if col.dtype == object or pd.api.types.is_string_dtype(col):
            num = pd.to_numeric(col, errors="coerce")
            if num.notna().all():
                df[t] = num.astype(np.int64)
    if "time" in df.columns and len(df):
        df["time"] = df["time"].astype(np.int64)
        df = df.sort_values("time", kind="stable").reset_index(drop=True)
    return df
