"""A cluster day: a fleet of jobs with restarts, shrinks, node swaps, jobs ending and starting,
and faults, on the real InfluxDB; the analyzer run over it as a service, killed once.

1. ``simulator.fleet.build_fleet`` draws the day from a seed (``RANKSCOPE_FLEET_*``, below);
   ``simulator.fleet_run.write_fleet`` writes it, ending a few minutes before now;
2. ``rankscope analyze --every 5s`` runs over it as a separate process, is killed (SIGKILL)
   midway through its catch-up (half of the iterations analyzed), started again, and runs
   until a cycle finds nothing new (``benchmarks/fleet_analyzer.py``); its incidents are
   scored against the truth (``benchmarks/fleet_score.py``);
3. the analyzer's outputs are dropped and the same is done with two shards (``--shard 0/2``,
   ``--shard 1/2``), shard 0 killed and restarted once.

Scale: ``RANKSCOPE_FLEET_JOBS`` (60), ``RANKSCOPE_FLEET_RANKS`` (100,000),
``RANKSCOPE_FLEET_MAX_RANKS`` (12,960), ``RANKSCOPE_FLEET_HOURS`` (4), ``RANKSCOPE_FLEET_FAULTS``
(one per job), ``RANKSCOPE_FLEET_SEED``, ``RANKSCOPE_FLEET_REUSE_GAP_S`` (7,200, at most 60% of
the day; it must exceed the analyzer's ``job_idle_s``), ``RANKSCOPE_FLEET_DEADLINE_S`` (the
analyzer's ``job_deadline_s``; default its own, 60 s: a shorter one spreads a small day's
catch-up over several cycles, so the kill lands inside it), ``RANKSCOPE_FLEET_TIMEOUT_S`` (6 h per
configuration). ``RANKSCOPE_FLEET_KEEP=1`` keeps the database; the truth and the analyzer logs
are written under ``out/fleet/``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
import uuid
from collections import Counter
from pathlib import Path

from analyzer.service.shards import shard_of
from benchmarks.fleet_analyzer import AnalyzerRun, run_analyzers
from benchmarks.fleet_score import BUCKETS, FaultResult, FleetScore, read_incidents, score
from rankscope import schema
from rankscope.store import InfluxStore, StoreError
from simulator.fleet import Fleet, FleetConfig, build_fleet
from simulator.fleet_jobs import PLACEMENTS
from simulator.fleet_run import FleetTruth, write_fleet
from simulator.fleet_scenarios import ANALYZER_WARMUP, STALL_MARGIN, STALL_MIN_EXCESS

OUT = Path(__file__).resolve().parent.parent / "out" / "fleet"
#: The day ends this long before the analyzer starts (every iteration's wait is over).
END_MARGIN_S = 600
#: What the analyzer writes (dropped between the two configurations).
OUTPUTS = [m for m in schema.MEASUREMENTS if m not in (schema.STAGE_LATENCY, schema.EVENT)]
#: At most this many missed faults and false incidents are listed per configuration.
LISTED = 25


def _predicted_end_s(fleet: Fleet) -> float:
    """When the day's last point is due, from the healthy iteration times (s after its start)."""
    return max(j.start_s + sum(s.downtime_s + s.iterations * j.iteration_s for s in j.segments) for j in fleet.jobs)


def _clear_outputs(store: InfluxStore) -> None:
    for m in OUTPUTS:
        try:
            store.execute(f'DROP MEASUREMENT "{m}"')
        except StoreError:
            pass


def _analyze(url: str, store: InfluxStore, truth: FleetTruth, shards: int) -> tuple[AnalyzerRun, FleetScore]:
    per = [sum(j.iterations for j in truth.jobs if shards == 1 or shard_of(j.name, shards) == k) for k in range(shards)]
    print(f"analyzer, {shards} shard(s): job-iterations per shard {per}", flush=True)
    shutil.rmtree(OUT / f"{shards}-shard", ignore_errors=True)
    deadline = os.environ.get("RANKSCOPE_FLEET_DEADLINE_S", "").strip()
    timeout = os.environ.get("RANKSCOPE_FLEET_TIMEOUT_S", "").strip()
    run = run_analyzers(url, store.bucket, shards, per, OUT / f"{shards}-shard",
                        timeout_s=float(timeout) if timeout else 6 * 3600,
                        deadline_s=float(deadline) if deadline else None)
    incidents = read_incidents(store)
    (OUT / f"{shards}-shard" / "incidents.json").write_text(json.dumps([i.to_json() for i in incidents], indent=1))
    return run, score(truth, incidents)


def run(ctx) -> str:
    cfg = FleetConfig.from_env()
    fleet = build_fleet(cfg)
    print(f"fleet: {len(fleet.jobs)} jobs, {fleet.ranks:,} ranks, {fleet.points:,} points, "
          f"{len(fleet.faults)} faults, lifecycle {fleet.lifecycle()}", flush=True)
    store = InfluxStore(ctx.influx_url, bucket=f"fleet_{uuid.uuid4().hex[:8]}", api="v1")
    try:
        start_ms = int((time.time() - _predicted_end_s(fleet) - END_MARGIN_S) * 1000)
        t0 = time.perf_counter()
        truth = write_fleet(fleet, store, start_ms)
        write_s = time.perf_counter() - t0
        truth.write(OUT / "truth.json")
        time.sleep(max(0.0, truth.end_ms / 1000 + 60 - time.time()))   # every iteration's wait over
        one = _analyze(ctx.influx_url, store, truth, 1)
        _clear_outputs(store)
        two = _analyze(ctx.influx_url, store, truth, 2)
    finally:
        if os.environ.get("RANKSCOPE_FLEET_KEEP") != "1":
            store.drop_database()
        store.close()
    return _report(cfg, fleet, truth, write_s, {"1 process": one, "2 shards": two})


def _median_max(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    return f"{format(statistics.median(values), fmt)} ({format(max(values), fmt)})"


def _row(label: str, run: AnalyzerRun, sc: FleetScore) -> str:
    found = [r for r in sc.faults if r.found]
    rates = " / ".join(f"{n} ({rate:.2f})" for n, rate in (sc.false_rate(name) for name, *_ in BUCKETS))
    who = "shard 0" if run.shards > 1 else "the process"
    when = "midway" if run.midway else "after its catch-up"
    killed = (f", {who} killed at {run.killed_at_s:.0f} s, {when} ({run.killed_after:,} iterations analyzed)"
              if run.killed_at_s is not None else "")
    return (f"| {label}{killed} | **{sc.found}/{len(sc.faults)}** ({sum(r.class_ok for r in found)} of the "
            f"expected class) | {_median_max([r.delay_it for r in found], '.0f')} | "
            f"{_median_max([r.delay_s for r in found], '.0f')} | **{len(sc.false)}** | {rates} | "
            f"{run.longest_cycle_s:.1f} s | {run.peak_rss_mib:,.0f} MiB | {run.wall_s:.0f} s"
            f"{' (timed out)' if run.timed_out else ''} |")


def _breakdown(scores: dict[str, FleetScore]) -> list[str]:
    """Faults found by placement and by kind, per configuration."""
    labels = list(scores)
    rows = ["| faults | " + " | ".join(f"found, {k}" for k in labels) + " |", "|---|" + "---|" * len(labels)]
    first = next(iter(scores.values())).faults
    groups = [(p, lambda r, p=p: r.fault.placement == p) for p in PLACEMENTS]
    groups += [(k, lambda r, k=k: r.fault.kind == k) for k in sorted({r.fault.kind for r in first})]
    for name, keep in groups:
        cells = [f"{sum(r.found for r in s.faults if keep(r))}/{sum(keep(r) for r in s.faults)}" for s in scores.values()]
        rows.append(f"| {name.replace('_', ' ')} | " + " | ".join(cells) + " |")
    return rows


def _missed(r: FaultResult, sc: FleetScore) -> str:
    f = r.fault
    hosts = ", ".join(f.hosts[:3]) + (f" (+{len(f.hosts) - 3})" if len(f.hosts) > 3 else "")
    near = [i for i in (x.incident for x in sc.false) if i.job == f.job and abs(i.onset_ms - f.onset_ms) < 600_000]
    said = "; ".join(f"{i.cls.value} on {', '.join(i.hosts[:2]) or i.ranks[:4]}" for i in near[:3]) or "none"
    return (f"{f.job} ({f.world:,} ranks, attempt {f.attempt}, {f.placement.replace('_', ' ')}): {f.kind}"
            f"{' ' + f.stage if f.stage else ''} x{f.factor:g} on {hosts}, iterations {f.onset_iteration}-"
            f"{f.end_iteration - 1}{_lost(f)}; false incidents of the job within 10 min: {said}")


def _lost(f) -> str:
    """What a transient stall cost its job, as written (the analyzer's ``stall_min_excess`` test)."""
    return f", it cost the job {f.lost:.2f} iterations' worth" if f.kind == "transient_stall" else ""


def _stall_rule(truth: FleetTruth) -> str:
    lost = [f.lost for f in truth.faults if f.kind == "transient_stall"]
    costs = f" (as written, {min(lost):.2f}-{max(lost):.2f})" if lost else ""
    return (f" Transient stalls follow the analyzer's rule that a sporadic stall costing its job less than "
            f"`stall_min_excess` ({STALL_MIN_EXCESS:g}) of an iteration is job_health data, not an incident: "
            f"each is sized to cost its job at least {STALL_MARGIN:g}x that by the model{costs}; a GPU's speed "
            f"bias belongs to its host (the same over a job's attempts, a swapped-in host brings its own).")


def _lists(label: str, sc: FleetScore) -> list[str]:
    missed = [_missed(r, sc) for r in sc.faults if not r.found]
    false = [f"{x.incident.job}#{x.instance} ({x.world:,} ranks): {x.incident.cls.value} {x.incident.id} on "
             f"{', '.join(x.incident.hosts[:3]) or x.incident.ranks[:4]}, onset iteration "
             f"{x.incident.onset_iteration}: {x.where}" for x in sorted(sc.false, key=lambda x: x.incident.onset_ms)]
    out = []
    for what, items in ((f"Missed ({label})", missed), (f"False incidents ({label})", false)):
        if items:
            more = [f"- ... and {len(items) - LISTED} more"] if len(items) > LISTED else []
            out += ["", f"{what}:", "", *(f"- {x}" for x in items[:LISTED]), *more]
    return out


def _report(cfg: FleetConfig, fleet: Fleet, truth: FleetTruth, write_s: float,
            runs: dict[str, tuple[AnalyzerRun, FleetScore]]) -> str:
    sizes = sorted(j.world for j in truth.jobs)
    its = sum(j.iterations for j in truth.jobs)
    life = ", ".join(f"{v} {k}{'s' if v != 1 and k not in ('reuse',) else ''}" for k, v in truth.lifecycle.items())
    kinds = ", ".join(f"{v} {k}" for k, v in sorted(Counter(f.kind for f in truth.faults).items()))
    where = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in Counter(f.placement for f in truth.faults).items())
    n_attempt = sum(j.attempt_field for j in truth.jobs)
    table = ["| analyzers | faults found | delay, iterations: median (max) | delay, s: median (max) | false "
             "incidents | false by job size " + " / ".join(n for n, *_ in BUCKETS) + " (per 1,000 job-iterations) | "
             "longest cycle | peak RSS | wall |", "|---|---|---|---|---|---|---|---|---|"]
    table += [_row(label, run, sc) for label, (run, sc) in runs.items()]
    errors = [f"- {label}: {len(run.errors)} error line(s) in the analyzer's log, e.g. `{run.errors[0][:300]}`"
              for label, (run, _) in runs.items() if run.errors]
    lists = [line for label, (_, sc) in runs.items() for line in _lists(label, sc)]
    return "\n".join([
        "## Cluster day: a fleet with restarts, on the real InfluxDB",
        "",
        f"`benchmarks/bench_fleet.py`: {len(truth.jobs)} jobs ({len({j.name for j in truth.jobs})} names) of "
        f"{sizes[0]:,}-{sizes[-1]:,} ranks, {sum(sizes):,} ranks in all, over {cfg.hours:g} h of simulated time "
        f"(seed {cfg.seed}): {its:,} job-iterations, {truth.points:,} points written to InfluxDB 1.6.7 in "
        f"{write_s:.0f} s ({truth.points / max(write_s, 1e-9):,.0f} points/s), collector shapes on. Lifecycle: "
        f"{life}; restarts stop a job 60-600 s and rewind it to its last checkpoint, the first 2-4 iterations "
        f"of every attempt are a warm-up (1.5-3x, uneven by node); {n_attempt} jobs write the `attempt` field, "
        f"the others leave the restart to be seen in the rewind. Faults: {kinds} ({where}); those after a "
        f"restart begin after the analyzer's {ANALYZER_WARMUP} warm-up iterations, a job of one node gets no "
        f"node-wide fault, and no fault slows more than half of its job's ranks." + _stall_rule(truth),
        "",
        "A fault is found when an incident of its job names a culprit host with its onset from 3 iterations "
        "before the fault to 10 after its end; delay = that incident's onset minus the fault's. The analyzer "
        "runs as `rankscope analyze --every 5s` over the stored day"
        + (f" with `job_deadline_s = {deadline}`" if (deadline := os.environ.get("RANKSCOPE_FLEET_DEADLINE_S", "").strip())
           else "") +
        "; shard 0's process is killed (SIGKILL) when its cycles have analyzed half of its shard's "
        "iterations (or, when its first cycle catches up with the whole day, after that), and started "
        "again. Longest "
        "cycle: the wall time of one cycle, from the scheduler's log (a process catches up with the "
        "day in its first cycles); peak RSS: the largest VmHWM of one analyzer process.",
        "",
        *table,
        "",
        *_breakdown({label: sc for label, (_, sc) in runs.items()}),
        *(["", *errors] if errors else []),
        *lists,
    ])
