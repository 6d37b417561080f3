"""The rule of every analyzer setting: its type, finite, its range, and the relations between keys.

:func:`problems` checks a whole set of settings and returns every breach (an empty list when
all hold); :func:`check` raises :class:`ConfigError` naming each key, its value and the rule
it breaks. :class:`~analyzer.config.AnalyzerConfig` checks itself with them, so a config
file is refused whole, at start and at a reload, and no object with a bad value exists.

Example::

    >>> for p in problems({"z": float("nan"), "baseline_warmup": 0, "reference_quantile": 5.0}):
    ...     print(p)
    z = nan: not finite (rule: z is a finite number > 0)
    baseline_warmup = 0: out of range (rule: baseline_warmup is an integer in [1, 1000000])
    reference_quantile = 5.0: out of range (rule: reference_quantile is a finite number in (0, 1))
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass

#: most an iteration count may be (a larger one is a typo, and some size arrays)
MAX_COUNT = 1_000_000


@dataclass(frozen=True)
class Rule:
    """``kind`` (int or float; floats finite), between ``low`` and ``high`` (open ends when
    ``open_low``/``open_high``; None: no bound on that side)."""

    kind: type
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def __str__(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        low, high = (_show(b) for b in (self.low, self.high))
        if self.low is not None and self.high is not None:
            return f"{what} in {'(' if self.open_low else '['}{low}, {high}{')' if self.open_high else ']'}"
        if self.low is not None:
            return f"{what} {'>' if self.open_low else '>='} {low}"
        return what

    def breach(self, value: object) -> str | None:
        """Why ``value`` breaks the rule, or None."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"wrong type, {type(value).__name__}"
        if self.kind is int and not isinstance(value, int):
            return "wrong type, not an integer"
        if not math.isfinite(value):
            return "not finite"
        low_ok = self.low is None or (value > self.low if self.open_low else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.open_high else value <= self.high)
        if low_ok and high_ok:
            return None
        return "must not be negative" if value < 0 <= (self.low or 0) else "out of range"


def _show(bound: float | None) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def count(low: int, high: int = MAX_COUNT) -> Rule:
    return Rule(int, low, high)


def number(low: float, open_low: bool = False) -> Rule:
    return Rule(float, low, None, open_low)


FRACTION = Rule(float, 0, 1, open_low=True, open_high=True)      # (0, 1)
SHARE = Rule(float, 0, 1, open_low=True)                          # (0, 1]
POSITIVE = number(0, open_low=True)
NON_NEGATIVE = number(0)
ABOVE_ONE = number(1, open_low=True)

RULES: dict[str, Rule] = {
    # L1
    "l1_window": count(3, 10_000), "l1_min_history": count(1, 10_000), "l1_threshold": POSITIVE,
    "l1_min_change": NON_NEGATIVE, "l1_persist": count(1), "l1_spike_max": count(1),
    "l1_rank_fraction": SHARE,
    # L2
    "smooth": count(1, 1_000), "reference_quantile": FRACTION, "min_excess_ms": NON_NEGATIVE,
    "min_change": NON_NEGATIVE, "abs_ratio": ABOVE_ONE, "spike_ratio": ABOVE_ONE, "z": POSITIVE,
    "min_sigma": POSITIVE, "baseline_alpha": SHARE, "baseline_warmup": count(1),
    "cv_threshold": POSITIVE, "floor_change": NON_NEGATIVE, "report_ratio": number(1),
    "report_max_ranks": count(1, 100_000_000), "l2_window": count(1),
    "l2_groups": count(1, 100_000_000),
    # diagnosis
    "transient_max": count(1), "transient_z": POSITIVE, "resolve_after": count(1),
    "reopen_within": count(0), "silent_after": count(1), "silent_after_s": POSITIVE,
    "iteration_wait_s": NON_NEGATIVE, "stall_min_excess": NON_NEGATIVE,
    "stall_min_gpu_hours": NON_NEGATIVE, "stall_repeat": count(1),
    "stall_repeat_alpha": FRACTION, "short_collective_ratio": SHARE,
    "arrival_short_ratio": SHARE, "arrival_min_gap_ms": NON_NEGATIVE, "arrival_rise": ABOVE_ONE,
    "arrival_baseline_alpha": SHARE, "arrival_clock_skew_ms": NON_NEGATIVE,
    "event_lookback": count(0), "history": count(1),
    "restart_warmup": count(0, 10_000), "job_idle_s": POSITIVE, "job_deadline_s": POSITIVE,
    "concurrency": count(1, 256),
}


@dataclass(frozen=True)
class Relation:
    """``lower`` must not exceed ``upper``."""

    lower: str
    upper: str
    why: str


RELATIONS = (
    Relation("l1_min_history", "l1_window", "a series cannot need more values than its reference keeps"),
    Relation("abs_ratio", "spike_ratio", "a one-iteration spike needs at least the bar of a lasting rise"),
)


@dataclass(frozen=True)
class Problem:
    """One breach: ``key`` holds ``value``, which breaks ``rule`` (``reason`` says how)."""

    key: str
    value: object
    reason: str
    rule: str

    def __str__(self) -> str:
        return f"{self.key} = {self.value!r}: {self.reason} (rule: {self.rule})"


class ConfigError(ValueError):
    """Analyzer settings refused, every breach named; nothing of them is applied."""

    def __init__(self, found: list[Problem]):
        self.problems = found
        super().__init__(f"{len(found)} analyzer setting(s) refused: " + "; ".join(map(str, found)))


def _unknown(key: str, value: object) -> Problem:
    near = difflib.get_close_matches(key, RULES, n=1)
    hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(sorted(RULES))}"
    return Problem(key, value, "unknown analyzer setting", f"a known setting; {hint}")


def problems(values: Mapping[str, object]) -> list[Problem]:
    """Every breach in ``values`` (a complete or partial set of settings), in order: unknown
    keys, then each value against its rule, then the relations whose both keys passed."""
    found = [_unknown(k, v) for k, v in values.items() if k not in RULES]
    bad = set(found and [p.key for p in found])
    for key, value in values.items():
        if key in RULES:
            reason = RULES[key].breach(value)
            if reason:
                found.append(Problem(key, value, reason, f"{key} is {RULES[key]}"))
                bad.add(key)
    for rel in RELATIONS:
        if rel.lower in values and rel.upper in values and not {rel.lower, rel.upper} & bad:
            lo, hi = values[rel.lower], values[rel.upper]
            if lo > hi:  # type: ignore[operator]  (both passed their rules: numbers)
                found.append(Problem(rel.lower, lo, f"above {rel.upper} = {hi!r}",
                                     f"{rel.lower} <= {rel.upper}: {rel.why}"))
    return found


def check(values: Mapping[str, object]) -> None:
    """Raise :class:`ConfigError` naming every breach in ``values``; return when all hold."""
    found = problems(values)
    if found:
        raise ConfigError(found)
