"""Step 1b, timing: durations when the dumps have them, else waits from who arrives last.

A collective ends for all its members once the last one has arrived, so the time each member
spends in it is its wait for the last arrival plus the transfer: what Flight Recorder's
``duration_ms`` measures with ``TORCH_NCCL_ENABLE_TIMING=1``. Without timing (PyTorch's
default, and every gloo dump: entries stay ``state: scheduled``) each entry still says when
its rank arrived, ``time_created_ns``. A collective is found in every member's dump by its
process group and sequence number (``collective_seq_id``; ``p2p_seq_id`` for sends and
receives, kept apart); whoever arrived last waited for nobody, every other member waited from
its own arrival to that last one. That wait is the record's ``ms``: the last arriver has the
shortest, as with durations (the transfer is unknown and left out), which is what the arrival
rule of the analyzer reads. A wait is at least :data:`MIN_WAIT_MS` (1 us: what the stamps
resolve; no collective takes no time, and a 0 would leave a rank's ratio to its group's median
undefined). The record ends at its rank's arrival plus its wait.

**Clocks.** The ranks of one host share its clock and are compared exactly. Across hosts,
clocks agree only within their skew, bounded by ``clock_skew_ms`` (``--clock-skew-ms``,
default :data:`CLOCK_SKEW_MS`): a rank's wait for a member on another host is the least it
can have been, the apparent wait minus the bound (never below 0). A rank that arrives last by
less than the bound across hosts is therefore blamed for nothing. A rank's host is what its
dump's file name holds (``<host>.nccl_trace_rank_<rank>``); a rank of unknown host is taken
to be on a host of its own.

``time_created_ns`` is when the rank's host enqueued the collective. With gloo that is when
the rank arrives; with NCCL the host may run ahead of its GPU, so a GPU-side slowdown shows
once the host waits for its GPU (a synchronising call each iteration does).

**Which timing.** Durations when every dump has at least one (entries without one, not
completed yet, are left out); else arrivals, for every entry. A collective that not every
member recorded (the oldest of a ring buffer that wrapped, one still gathering its members
when a dump was written, or a member whose dump was refused) has no known last arrival: it
is left out and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collector.nccl_import.records import NcclError

#: Default bound on the clock skew between hosts (ms). NTP (chrony) keeps the hosts of a
#: data-centre network within a fraction of a millisecond of each other, PTP within
#: microseconds; 1 ms bounds the first with margin and is far below the waits a straggler
#: causes. Raise it where the hosts' offsets (``chronyc tracking``) say more.
CLOCK_SKEW_MS = 1.0
#: The least wait written (ms): the last arriver's, and any shorter one.
MIN_WAIT_MS = 0.001


@dataclass(frozen=True)
class Timing:
    """How the collectives of an import were timed."""

    #: ``duration_ms`` (durations as recorded) or ``time_created_ns`` (waits from arrivals).
    source: str
    clock_skew_ms: float
    #: Collectives timed from arrivals, those among them spanning hosts (or a rank of
    #: unknown host), and those left out (not recorded by every member).
    collectives: int = 0
    cross_host: int = 0
    left_out: int = 0

    def describe(self) -> str:
        """One clause for the import's summary."""
        if self.source == "duration_ms":
            return "timed by duration_ms"
        text = (f"timed by arrival (no duration_ms: each rank's wait for the last to arrive, from "
                f"time_created_ns) in {self.collectives} collective(s)")
        if self.cross_host:
            text += (f", {self.cross_host} of them across hosts, whose clocks agree within "
                     f"--clock-skew-ms {self.clock_skew_ms:g} ms: a wait across hosts counts only "
                     f"beyond that bound")
        if self.left_out:
            text += f"; {self.left_out} collective(s) not recorded by every member left out"
        return text


def timed(records: pd.DataFrame, clock_skew_ms: float = CLOCK_SKEW_MS) -> tuple[pd.DataFrame, Timing]:
    """Flight Recorder rows (with ``start_us``) -> rows with ``ms`` and ``end_us`` for every
    record kept, and how they were timed (see the module's doc)."""
    if isinstance(clock_skew_ms, bool) or not isinstance(clock_skew_ms, int | float) \
            or not math.isfinite(clock_skew_ms) or not 0 <= clock_skew_ms <= 60_000:
        raise NcclError(f"--clock-skew-ms must be a number of ms in 0..60000, got {clock_skew_ms!r}")
    has = records["ms"].notna().groupby(records["source"]).any()
    if len(has) and has.all():
        kept = records[records["ms"].notna()].drop(columns="start_us")
        return kept.reset_index(drop=True), Timing("duration_ms", float(clock_skew_ms))
    return arrival_waits(records, float(clock_skew_ms))


def arrival_waits(records: pd.DataFrame, clock_skew_ms: float) -> tuple[pd.DataFrame, Timing]:
    """Each record's wait for the last member to arrive (ms), across hosts the least it can
    have been with clocks ``clock_skew_ms`` apart; collectives not every member recorded are
    left out. Vectorised over the records."""
    df = records.reset_index(drop=True)
    p2p = df["op"].isin(("send", "recv")).to_numpy()
    unknown = "\0rank " + df["rank"].astype(str)   # a rank of unknown host: a clock of its own
    df = df.assign(_p2p=p2p, _clock=df["host"].where(df["host"].notna(), unknown))
    key = ["comm", "_p2p", "sn"]
    groups = df.groupby(key, sort=False)
    given = df.groupby("comm")["members"].first().map(lambda m: len(m) if isinstance(m, tuple) else np.nan)
    expected = given.fillna(df.groupby("comm")["rank"].nunique())
    ranks, rows = groups["rank"].transform("nunique"), groups["rank"].transform("size")
    complete = ((ranks == df["comm"].map(expected)) & (rows == ranks)).to_numpy()
    t = df["start_us"].to_numpy(np.float64)
    last = groups["start_us"].transform("max").to_numpy()
    last_here = df.groupby([*key, "_clock"], sort=False)["start_us"].transform("max").to_numpy()
    wait_us = np.maximum(np.maximum(last_here - t, last - clock_skew_ms * 1000.0 - t), 0.0)
    spans = (groups["_clock"].transform("nunique") > 1).to_numpy()
    first = ~df.duplicated(key).to_numpy()   # one row per collective, for the counts
    timing = Timing("time_created_ns", clock_skew_ms, collectives=int((first & complete).sum()),
                    cross_host=int((first & complete & spans).sum()), left_out=int((first & ~complete).sum()))
    if not timing.collectives:
        raise NcclError(f"no collective was recorded by every member of its group ({timing.left_out} "
                        f"left out), so no arrival can be compared: import every rank's dump")
    end = df["end_us"].to_numpy(np.float64)
    df["ms"] = np.maximum(wait_us / 1000.0, MIN_WAIT_MS)
    df["end_us"] = np.where(np.isfinite(end), end, t + df["ms"].to_numpy() * 1000.0)
    kept = df[complete].drop(columns=["start_us", "_p2p", "_clock"])
    return kept.reset_index(drop=True), timing
