"""The ``event`` point in which a rank's writer reports the points it dropped.

One report per successful reporting: ``name=collector_dropped_points``, ``value`` = points
dropped since the last report. A report is built once and retried unchanged until it is
stored, so a report whose write timed out but was applied later is rewritten onto itself
(same tags, same timestamp), never counted twice.

Its timestamp is a whole second plus ``rank % 1000`` ms: the ``event`` tags do not include
the rank, so two ranks of one node reporting in the same millisecond would otherwise write
the same point and one report would replace the other. One writer's reports are at least a
second apart for the same reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

DROP_EVENT = "collector_dropped_points"
#: the point fields a report takes its tags from (from the first point the writer got)
REPORT_TAGS = ("job", "rank", "node", "host")


@dataclass(frozen=True)
class DropReport:
    """One pending report: ``lost`` points, its event ``frame`` and its log ``text``."""

    lost: int
    second: int
    frame: pd.DataFrame
    text: str


def drop_report(tags: dict[str, Any], lost: int, capacity: int, after_second: int) -> DropReport:
    """A report of ``lost`` points, timed in a second later than ``after_second``."""
    rank = int(tags.get("rank", -1))
    second = max(int(time.time()), after_second + 1)
    text = (f"rank {tags.get('rank', '?')}: the collector dropped {lost} point(s) "
            f"(queue bound {capacity}) while the store was unreachable or too slow")
    row: dict[str, Any] = {
        "time": second * 1000 + rank % 1000, "job": str(tags.get("job", "")), "name": DROP_EVENT,
        "node": str(tags.get("node", "")), "severity": "warning", "source": "rankscope.collector",
        "rank": rank, "text": text, "value": int(lost),
    }
    if tags.get("host"):
        row["host"] = str(tags["host"])
    return DropReport(lost, second, pd.DataFrame([row]), text)
