"""The values of a per-operation trace, checked column by column, row by row.

A trace file is data from the cluster: before a row becomes part of a point, each of its
values must be of the right type, finite and in range (:data:`INTEGER_COLUMNS`,
:data:`SECOND_COLUMNS`, ``optype`` text). A row that fails any check is refused; the others
are kept. :func:`checked_rows` says how many were refused and shows the first, naming the
file, the row (data rows counted from 1, a CSV header not counted), the column, the value
and the rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: Integer columns and the largest value each may hold (the smallest is 0): a rank, a DP rank
#: and a PP stage below 2^20; a step below 2^31.
INTEGER_COLUMNS = {"rank": (1 << 20) - 1, "dp_rank": (1 << 20) - 1, "stage": (1 << 20) - 1,
                   "step": (1 << 31) - 1}
#: Columns in seconds and the largest value each may hold (the smallest is 0): 11.6 days.
SECOND_COLUMNS = {"start_ts": 1e6, "duration": 1e6}


@dataclass(frozen=True)
class Refusals:
    """The rows of one file refused for a value that failed its check."""

    source: str
    rows: int
    refused: int = 0
    #: The first refused row: ``row N, column 'c': value rule``.
    first: str = ""

    def __str__(self) -> str:
        return (f"{self.source}: refused {self.refused} of {self.rows} row(s) with bad values "
                f"(first: {self.first})")


def _as_float(value: object) -> tuple[float, bool]:
    """``(value as a float, whether it is of a numeric type)`` of one cell of a text column."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return math.nan, True
    if isinstance(value, bool | np.bool_):
        return math.nan, False
    if isinstance(value, int | float | np.integer | np.floating):
        try:
            return float(value), True
        except OverflowError:   # an integer beyond any float: out of every range
            return (1e308 if value > 0 else -1e308), True
    if isinstance(value, str):
        try:
            return float(value.strip()), True
        except ValueError:
            return math.nan, False
    return math.nan, False


def _numbers(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Every value as a float, and where a value is not a number (text, a list, a boolean)."""
    if pd.api.types.is_bool_dtype(column.dtype):
        return np.full(len(column), np.nan), np.ones(len(column), dtype=bool)
    if pd.api.types.is_numeric_dtype(column.dtype):
        return column.to_numpy(np.float64, na_value=np.nan), np.zeros(len(column), dtype=bool)
    pairs = [_as_float(v) for v in column.astype(object).to_numpy()]
    values = np.fromiter((p[0] for p in pairs), dtype=np.float64, count=len(pairs))
    return values, ~np.fromiter((p[1] for p in pairs), dtype=bool, count=len(pairs))


def _problems(ops: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per column, each row's problem (``""`` where the value passes)."""
    out: dict[str, np.ndarray] = {}
    checks = [(c, 0.0, float(most), True) for c, most in INTEGER_COLUMNS.items()]
    checks += [(c, 0.0, float(most), False) for c, most in SECOND_COLUMNS.items()]
    for col, least, most, integer in checks:
        values, wrong = _numbers(ops[col])
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(values)
            problem = np.select(
                [wrong, ~finite, (values < least) | (values > most), integer & (values != np.round(values))],
                ["is not a number", "is missing or not finite",
                 f"is outside {least:.0f}..{most:.0f}" if integer else f"is outside {least:g}..{most:g}",
                 "is not an integer"], "")
        out[col] = problem
    optype = ops["optype"].astype(object).to_numpy()
    out["optype"] = np.where([isinstance(v, str) for v in optype], "", "is not text")
    return out


def checked_rows(ops: pd.DataFrame, source: str) -> tuple[pd.DataFrame, Refusals]:
    """The rows of ``ops`` whose values pass every check (integer columns as int64, seconds as
    float64, ``optype`` text), and the refusals of the others."""
    problems = _problems(ops)
    bad = np.zeros(len(ops), dtype=bool)
    for problem in problems.values():
        bad |= problem != ""
    if not bad.any():
        good = ops
        refusals = Refusals(source, len(ops))
    else:
        i = int(np.flatnonzero(bad)[0])
        col = next(c for c, p in problems.items() if p[i])
        value = ops[col].iloc[i]
        shown = repr(value.item() if isinstance(value, np.generic) else value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        first = f"row {i + 1}, column {col!r}: {shown} {problems[col][i]}"
        good = ops[~bad]
        refusals = Refusals(source, len(ops), int(bad.sum()), first)
    good = good.reset_index(drop=True)
    out = pd.DataFrame({c: _numbers(good[c])[0].astype(np.int64) for c in INTEGER_COLUMNS})
    for c in SECOND_COLUMNS:
        out[c] = _numbers(good[c])[0]
    out.insert(4, "optype", good["optype"].astype(object).to_numpy())
    return out, refusals
