"""Analyzer thresholds, all in one typed record (defaults from IL-0477 and calibration).

Loaded from the ``[analyzer]`` table of a TOML file (``--config``, read by
:func:`load_config`, together with an optional ``[stages]`` table). Every value is checked
against its rule (:mod:`analyzer.config_schema`: type, finite, range, relations between
keys; unknown keys refused by name), and a file with any bad value is refused whole. Most settings can change while the analyzer runs
(:mod:`analyzer.service.config_watch`); those in :data:`RESTART_ONLY` size the detectors'
state and take effect at the next start.

Example::

    >>> a = AnalyzerConfig()
    >>> changes(a, a.with_overrides(z=7.0, l1_window=30))
    {'l1_window': (20, 30), 'z': (6.0, 7.0)}
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from analyzer.config_schema import RULES, ConfigError, check
from rankscope.config_file import read_config_file
from rankscope.schema import SchemaError, StageSet

__all__ = ["RESTART_ONLY", "AnalyzerConfig", "ConfigError", "changes", "load_config"]

#: Settings that size state (ring buffers, history windows, baselines' memory): a change
#: takes effect when the analyzer restarts, not at a reload.
RESTART_ONLY = frozenset({"l1_window", "l1_min_history", "l1_persist", "l1_spike_max", "smooth",
                          "baseline_alpha", "baseline_warmup", "history"})


@dataclass(frozen=True)
class AnalyzerConfig:
    """Thresholds of L1, L2 and the diagnosis.

    L1 (iteration time): ``l1_window`` accepted values in the rolling reference,
    ``l1_min_history`` before alarming, robust z ``l1_threshold``, relative
    change ``l1_min_change``, ``l1_persist`` iterations to confirm a step,
    ``l1_spike_max`` iterations a spike may last.

    L2 (ranks against their group and their own past): compute and host stages are
    divided by the peers' ``reference_quantile`` (what healthy peers achieve even when
    part of the group is slow); a cell (rank x stage) is
    *hot* when its ratio to the group median stands ``min_change`` above its own
    baseline (smoothed over ``smooth`` iterations) or ``abs_ratio`` above the
    group whatever its past, or ``spike_ratio`` in a single iteration, each also
    ``z`` robust sigmas out, and losing at least ``min_excess_ms`` against the peers
    (so a tiny kernel inflated by the OS scheduler is not a straggler). ``cv_threshold`` marks a group anomalous (IL-0477's
    EP group had CV ~0.9 in mlp). Collective floors (the group's minimum: the
    pure transfer time) count as risen at ``floor_change``.

    Diagnosis: a hot streak of more than ``transient_max`` iterations is a
    straggler; a shorter one that ends, having been ``transient_z`` sigmas of its
    stage's one-iteration noise out, is a transient stall (8: a 12,960-rank job
    draws millions of cells per hour, whose largest normal deviate is ~5.5 sigma;
    a JIT stall of 4x is 20+ sigma of compute noise); an incident
    resolves after ``resolve_after`` iterations without its culprits hot; the same
    culprits back (same class, overlapping ranks) within ``reopen_within`` iterations of
    its resolution reopen it as an intermittent fault, which then resolves only after
    ``reopen_within`` quiet iterations. A rank missing for ``silent_after`` iterations in a
    row is silent (5: writers drop points under back-pressure, and at 1% dropped a 12,960-rank
    job has a rank missing 2 in a row every iteration; 5 in a row is 1e-10), or missing for 2
    or more iterations spanning ``silent_after_s`` seconds of its peers' time (jobs with long
    iterations). ``event_lookback`` iterations before onset count for correlating
    out-of-band events.

    Data as collectors write it: an iteration lacking some ranks' points is analyzed once the
    data or the clock is ``iteration_wait_s`` past it (more than the hosts' clock spread plus
    the writers' flush interval).

    A job's life (analyzer/read/attempts.py): after a restart from a checkpoint (iteration
    numbers going back, or the ``attempt`` field growing) the first ``restart_warmup``
    iterations are not analyzed (caches, compilers and communicators warm up, unevenly: nobody's
    fault); a job with no new point for ``job_idle_s`` seconds has ended (its open incidents
    close as "job ended", its state is released; the same name later is a new job). A cycle
    analyzes up to ``concurrency`` jobs at once and stops reading a job after ``job_deadline_s``
    seconds (the rest is read next cycle), so one large or slow job does not starve the others.

    Sporadic stalls (the same at every job size): a transient stall is an incident only when the
    job lost at least ``stall_min_excess`` iterations' worth of time to it (its iteration time
    over the level around the stall, where beyond its own swings; 0.5: a one-iteration 3x stall
    on one GPU costs an 8-rank job 20-40% of one iteration, and is noise) or
    ``stall_min_gpu_hours`` in all, or when the same ranks stall ``stall_repeat`` times within
    ``reopen_within`` iterations, or the stall is wider (GPUs side by side) or longer (iterations
    in a row) than the job's own sporadic stalls explain by chance; the rest are counted in one
    job-level summary (the ``job_health`` point). ``stall_repeat_alpha`` is the chance, over all
    ranks of a job, that sporadic stalls repeat, meet or last that long by luck.

    Evidence: a culprit's own collectives are *short* (it arrived last, the group waited for it)
    below ``short_collective_ratio`` of its group-mates' time.

    Arrival (a straggler named from collective timings alone): a rank's collective is *short*
    below ``arrival_short_ratio`` of its group's median and at least ``arrival_min_gap_ms``
    shorter, while that median has risen above ``arrival_rise`` times its baseline (a moving
    average with weight ``arrival_baseline_alpha`` for each new iteration). In a group spanning
    hosts the gap must also exceed ``arrival_clock_skew_ms``, the bound on the hosts' clock skew
    (times from arrival stamps compare their clocks).
    """

    l1_window: int = 20
    l1_min_history: int = 8
    l1_threshold: float = 4.0
    l1_min_change: float = 0.10
    l1_persist: int = 2
    l1_spike_max: int = 1
    l1_rank_fraction: float = 0.05

    smooth: int = 3
    reference_quantile: float = 0.25
    min_excess_ms: float = 1.0
    min_change: float = 0.15
    abs_ratio: float = 1.5
    spike_ratio: float = 2.0
    z: float = 6.0
    min_sigma: float = 0.01
    baseline_alpha: float = 0.1
    baseline_warmup: int = 5
    cv_threshold: float = 0.8
    floor_change: float = 0.3
    report_ratio: float = 1.3
    report_max_ranks: int = 2000
    l2_window: int = 5
    l2_groups: int = 64

    transient_max: int = 3
    transient_z: float = 8.0
    resolve_after: int = 3
    reopen_within: int = 20
    silent_after: int = 5
    silent_after_s: float = 600.0
    iteration_wait_s: float = 15.0
    stall_min_excess: float = 0.5
    stall_min_gpu_hours: float = 50.0
    stall_repeat: int = 3
    stall_repeat_alpha: float = 0.01
    short_collective_ratio: float = 0.8
    arrival_short_ratio: float = 0.5
    arrival_min_gap_ms: float = 1.0
    arrival_rise: float = 1.5
    arrival_baseline_alpha: float = 0.1
    arrival_clock_skew_ms: float = 1.0
    event_lookback: int = 5
    history: int = 40
    restart_warmup: int = 5
    job_idle_s: float = 1800.0
    job_deadline_s: float = 60.0
    concurrency: int = 4

    def __post_init__(self) -> None:
        """Refuse any value that breaks its rule (:mod:`analyzer.config_schema`), all named."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        check(values)
        for key, value in values.items():  # an integer given for a float setting: stored as float
            if RULES[key].kind is float and isinstance(value, int):
                object.__setattr__(self, key, float(value))

    def with_overrides(self, **kw: object) -> AnalyzerConfig:
        """These settings with ``kw`` changed; :class:`ConfigError` naming every bad key, its
        value and its rule (unknown keys too), nothing changed."""
        check({**{f.name: getattr(self, f.name) for f in fields(self)}, **kw})
        return replace(self, **kw)  # type: ignore[arg-type]  (checked above)


def changes(old: AnalyzerConfig, new: AnalyzerConfig) -> dict[str, tuple[object, object]]:
    """The settings that differ: name -> (old, new), sorted by name."""
    return {f.name: (getattr(old, f.name), getattr(new, f.name)) for f in sorted(fields(old), key=lambda f: f.name)
            if getattr(old, f.name) != getattr(new, f.name)}


def load_config(path: str | Path | None) -> tuple[AnalyzerConfig, StageSet | None]:
    """Thresholds (``[analyzer]``) and stages (``[stages]``) from a TOML file; defaults without one
    (the file's other tables belong to other parts: :mod:`rankscope.config_file`).

    Raises ValueError naming the file and what is wrong (nothing is half applied).
    """
    if not path:
        return AnalyzerConfig(), None
    data = read_config_file(path)
    table = data.get("analyzer", {})
    try:
        cfg = AnalyzerConfig().with_overrides(**table)
        stages = StageSet.from_config(data["stages"]) if "stages" in data else None
    except (ValueError, TypeError, SchemaError) as exc:
        raise ValueError(f"config {path}: {exc}") from None
    return cfg, stages
