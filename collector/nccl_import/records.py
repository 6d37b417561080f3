"""The record table both readers produce, its error, and the field checks they share.

One row per collective a rank ran (:data:`RECORD_COLUMNS` plus ``members``): the source file and
its line (or entry), the global rank, the communicator, its size, the operation, the sequence
number, the duration (ms), the end (epoch us), the rank's own order and the host when known.
"""

from __future__ import annotations

import math

import pandas as pd

from rankscope.times import MAX_EPOCH_MS

#: Columns of the normalised record table both readers produce.
RECORD_COLUMNS = ("source", "line", "rank", "comm", "n_ranks", "op", "sn", "ms", "end_us", "order", "host")


#: Bounds a record's values must keep (a file from the cluster is data, and checked as such):
#: ranks and communicator sizes below this,
MAX_RANKS = 1 << 20
#: sequence numbers and record ids below this,
MAX_SEQ = 1 << 62
#: a collective's duration at most this (ms: 11.6 days),
MAX_DURATION_MS = 1e9
#: and its end no later than the latest time a store holds (epoch us, 2262).
MAX_TIME_US = MAX_EPOCH_MS * 1000


class NcclError(ValueError):
    """Collective records that cannot be imported (the message names the file, record, field)."""


class Incomplete(NcclError):
    """A file still being written: empty, or cut short (skipped with a warning, not refused)."""


def get_field(obj, key, where):
    """``obj[key]``, or an error naming ``where`` and the missing field."""
    if not isinstance(obj, dict) or key not in obj:
        raise NcclError(f"{where}: missing field {key!r}")
    return obj[key]


def number(value, key, where, integer=False, most=None):
    """``value`` checked to be a finite non-negative number (an integer with ``integer``), at
    most ``most`` when given."""
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not (isinstance(value, int) or math.isfinite(value)) or value < 0:
        raise NcclError(f"{where}: field {key!r} must be a non-negative number, got {_shown(value)}")
    if integer and int(value) != value:
        raise NcclError(f"{where}: field {key!r} must be an integer, got {value!r}")
    if most is not None and value > most:
        raise NcclError(f"{where}: field {key!r} must be at most {most:g}, got {value!r}")
    return value


def _shown(value) -> str:
    """``repr(value)``, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def world_of(records: pd.DataFrame) -> int:
    """The job's size: one past the highest rank the records name, as a rank or as a member of
    a communicator, or the largest communicator's size (a rank whose file was refused or
    skipped is still in the job)."""
    members = records["members"].dropna() if "members" in records.columns else pd.Series([], dtype=object)
    listed = max((max(m) for m in members.drop_duplicates() if len(m)), default=-1)
    return max(int(records["rank"].max()) + 1, int(listed) + 1, int(records["n_ranks"].max()))


def with_members(df: pd.DataFrame) -> pd.DataFrame:
    """Members of every communicator (global ranks seen reporting it, unless given)."""
    seen = df.groupby("comm")["rank"].agg(lambda r: tuple(sorted(set(int(x) for x in r))))
    if "members" in df.columns:
        given = df.dropna(subset=["members"]).groupby("comm")["members"].first()
        seen.update(given)
    df = df.copy()
    df["members"] = seen.loc[df["comm"]].to_numpy()
    return df[[*RECORD_COLUMNS, "members"]].reset_index(drop=True)
