"""A real InfluxDB database filled with the IL-0477 incident, built once per test run and read by the
analyzer, simulator, dashboard and report tests (the ``il0477_incident`` fixture of tests/conftest.py).

The database is created with rankscope's retention (raw points 7 days in the
default policy ``raw``, everything else 400 days in ``long``), as a deployment has it.
It is filled by the simulator and the analyzer themselves: 40 iterations of the IL-0477
scenario, then one analyzer cycle (which also writes the rollups). There is no fallback:
when the simulator or the analyzer cannot be imported, or fails, every test that asks for
the database fails with that error (a broken import must not pass as green dashboard tests).

:func:`write_schema_points` is for the dashboards benchmark only (a 6-hour wall,
``write_schema_points(iterations=720)``, generated and written a chunk of iterations at a
time): points that follow :mod:`rankscope.schema` and the incident write-up (mlp of ranks
10352-10359 at 170-280 ms from the onset, reduce_scatter short at dp 256-287 of every pp
stage, iteration time 30 s -> 90 s, the "server port down" event, the analyzer's measurements
and the rollups), written without the analyzer. No test reads them as the incident.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analyzer.config import AnalyzerConfig
from analyzer.score.l2_points import l2_frames
from analyzer.service.run_once import run_once
from analyzer.write.rollups import incident_host_frame, rollup_frames, window_rollup
from rankscope import schema
from rankscope.config import Retention
from rankscope.frames import LatencyCube, cube_to_frame
from rankscope.incident import Impact, Incident, IncidentClass
from rankscope.store import InfluxStore
from rankscope.topology import Topology, format_ranks
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.truth import Truth

#: The job's topology, host names as the simulator makes them.
TOPOLOGY = Topology(tp=1, pp=9, dp=1440, ep=32, gpus_per_node=8, host_pattern="gpu-node-{node:05d}")
ITERATIONS = 40
ONSET = 20
#: A kernel window every this many iterations (L3): two after the fault (iteration 30), confirmed.
KERNEL_EVERY = 5
CULPRITS = np.arange(10352, 10360)
STEP_MS = 60_000
#: Iterations generated and written at once (a multiple of the L2 window).
CHUNK = 20
L2_WINDOW = 5


@dataclass
class IncidentData:
    """The filled database and what the tests need to know about it."""

    store: InfluxStore
    url: str
    db: str
    job: str
    start_ms: int
    end_ms: int
    truth: Truth        # the simulator's ground truth (iteration times, the fault, the event)
    truth_path: Path    # ... as it wrote it to disk
    source: str = "simulator+analyzer"   # the only source: there is no fallback


def fill(url: str) -> IncidentData:
    """Simulate IL-0477 into a new database and run one analyzer cycle over it (errors propagate)."""
    db = f"dash_{uuid.uuid4().hex[:10]}"
    store = InfluxStore(url, bucket=db, api="v1", retention=Retention())
    start_ms = (int(time.time() * 1000) - 3 * 3600_000) // 60_000 * 60_000
    truth_path = Path(tempfile.mkdtemp(prefix="il0477_truth_")) / "il-0477.truth.json"
    try:
        truth = simulate(load_scenario("il-0477").with_overrides(iterations=ITERATIONS, kernel_every=KERNEL_EVERY), store,
                         start_ms=start_ms, truth_path=truth_path, progress=False)
        jobs = store.jobs()
        if len(jobs) != 1:
            raise RuntimeError(f"the IL-0477 simulation wrote {len(jobs)} jobs ({jobs}), not one")
        job = jobs[0]
        run_once(store, job=job)
        last = store.latest_times(schema.STAGE_LATENCY, job, 1)
        if len(last) != 1:
            raise RuntimeError(f"the IL-0477 database holds no stage_latency point of job {job}")
    except BaseException:
        try:
            store.drop_database()
        finally:
            store.close()
            shutil.rmtree(truth_path.parent, ignore_errors=True)
        raise
    return IncidentData(store, url, db, job, start_ms, int(last[0]) + 1, truth, truth_path)


# ------------------------------------------------------------------ benchmark points (not the incident)
def stage_cube(rng: np.random.Generator, iterations: np.ndarray, onset: int = ONSET
               ) -> tuple[np.ndarray, np.ndarray]:
    """values[iteration, rank, stage] and iteration_ms[iteration, rank] of the incident at ``iterations``."""
    topo, stages = TOPOLOGY, schema.DEFAULT_STAGES.names
    base = {"attention": 25.0, "mlp": 40.0, "dispatch": 8.0, "combine": 8.0, "pp_send": 5.0,
            "pp_recv": 5.0, "reduce_scatter": 60.0, "expert_reduce": 25.0, "all_gather": 40.0, "optimizer": 12.0,
            "dataloader": 3.0}
    shape = (len(iterations), topo.world)
    values = np.stack([base[s] * rng.uniform(0.9, 1.1, shape) for s in stages], axis=-1)
    mlp, rs, dispatch = stages.index("mlp"), stages.index("reduce_scatter"), stages.index("dispatch")
    values[:, :, mlp] = rng.uniform(30, 50, shape)
    after = np.asarray(iterations) >= onset
    values[np.ix_(after, CULPRITS, [mlp])] = rng.uniform(170, 280, (after.sum(), CULPRITS.size, 1))
    group = topo.group_ranks("ep", int(CULPRITS[0]))
    others = np.setdiff1d(group, CULPRITS)
    values[np.ix_(after, others, [dispatch])] += 180.0
    late = np.isin(topo.dp_index, np.arange(256, 288))
    values[np.ix_(after, late, [rs])] *= 0.25
    values[np.ix_(after, ~late, [rs])] += 200.0
    it_ms = np.where(after[:, None], 90_000.0, 30_000.0) * rng.uniform(0.99, 1.01, shape)
    return values, it_ms


def _l2_points(job: str, values: np.ndarray, time_ms: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """l2_kind and l2_group of one window, made as the analyzer makes them (over the window's
    mean), and l2_rank (mlp over 2x its EP group's median)."""
    topo, stages = TOPOLOGY, schema.DEFAULT_STAGES.names
    window = values.mean(axis=0)
    members = topo.members("ep")
    gid = topo.group_ids("ep")
    mlp_all = window[:, stages.index("mlp")]
    ratio = mlp_all / np.median(mlp_all[members], axis=1)[gid]
    flagged = np.flatnonzero(ratio > 2.0)
    ranks = pd.DataFrame({
        "time": time_ms, "job": job, "rank": flagged, "stage": "mlp",
        "node": flagged // topo.gpus_per_node, "value": mlp_all[flagged], "ratio": ratio[flagged],
        "z": (ratio[flagged] - 1) * 10, "baseline_ratio": 1.0, "group_type": "ep", "group_id": gid[flagged]})
    kind, group = l2_frames(job, topo, schema.DEFAULT_STAGES, window, time_ms, AnalyzerConfig(), ranks)
    return kind, group, ranks


def write_schema_points(store: InfluxStore, job: str, start_ms: int, iterations: int = ITERATIONS,
                        onset: int = ONSET, step_ms: int = STEP_MS, seed: int = 477,
                        clock: dict[str, float] | None = None) -> None:
    """The incident's raw points, rollups and analyzer outputs, ``CHUNK`` iterations at a time.

    ``clock`` (optional) adds up the seconds spent generating, writing raw points, computing
    the rollups and writing them (keys ``generate``, ``raw``, ``rollup``, ``rollup_write``)."""
    clock = clock if clock is not None else defaultdict(float)
    if onset % L2_WINDOW or not 0 < onset < iterations:
        raise ValueError(f"onset {onset} must be a multiple of {L2_WINDOW} inside the {iterations} iterations")
    rng = np.random.default_rng(seed)
    topo, stages = TOPOLOGY, schema.DEFAULT_STAGES.names
    times = start_ms + np.arange(iterations, dtype=np.int64) * step_ms
    last_window = None
    pending: pd.DataFrame | None = None   # rollup_host rows of a window not yet complete
    pending_hour: pd.DataFrame | None = None   # rollup_host_5m rows of an hour not yet complete
    for first in range(0, iterations, CHUNK):
        t0 = time.perf_counter()
        its = np.arange(first, min(first + CHUNK, iterations))
        values, it_ms = stage_cube(rng, its, onset)
        frames = [cube_to_frame(job, topo, int(i), int(times[i]), values[k], stages, it_ms[k])
                  for k, i in enumerate(its)]
        raw = pd.concat(frames, ignore_index=True)
        t1 = time.perf_counter()
        store.write_stage_latency(raw)
        t2 = time.perf_counter()
        rolled = rollup_frames(job, topo, LatencyCube(its, times[its], list(stages), values, it_ms))
        # the 5-minute windows every iteration of which is written (the last chunk: all of them)
        pending = pd.concat([pending, rolled[schema.ROLLUP_HOST]]) if pending is not None \
            else rolled[schema.ROLLUP_HOST]
        w = schema.ROLLUP_WINDOW_MS
        cut = (int(times[its[-1]]) + step_ms) // w * w if its[-1] + 1 < iterations else np.iinfo(np.int64).max
        closed = pending["time"].to_numpy() < cut
        rolled[schema.ROLLUP_HOST_WINDOW] = window_rollup(pending[closed])
        pending = pending[~closed]
        # and the hours every window of which is written
        if len(rolled[schema.ROLLUP_HOST_WINDOW]):
            pending_hour = pd.concat([pending_hour, rolled[schema.ROLLUP_HOST_WINDOW]]) \
                if pending_hour is not None else rolled[schema.ROLLUP_HOST_WINDOW]
        if pending_hour is not None:
            h = schema.ROLLUP_HOUR_MS
            closed = pending_hour["time"].to_numpy() < (cut // h * h if cut < np.iinfo(np.int64).max else cut)
            rolled[schema.ROLLUP_HOST_HOUR] = window_rollup(pending_hour[closed], h)
            pending_hour = pending_hour[~closed]
        t3 = time.perf_counter()
        for name, frame in rolled.items():
            if len(frame):
                store.write_measurement(name, frame)
        t4 = time.perf_counter()
        for key, seconds in (("generate", t1 - t0), ("raw", t2 - t1), ("rollup", t3 - t2), ("rollup_write", t4 - t3)):
            clock[key] = clock.get(key, 0.0) + seconds
        # L2 over the windows of L2_WINDOW iterations after the onset (ending at 24, 29, ... for onset 20)
        for end in its[(its >= onset + L2_WINDOW - 1) & ((its - onset) % L2_WINDOW == L2_WINDOW - 1)]:
            k = int(end - first)
            kind, group, ranks = _l2_points(job, values[k - L2_WINDOW + 1:k + 1], int(times[end]))
            store.write_measurement(schema.L2_KIND, kind)
            store.write_measurement(schema.L2_GROUP, group)
            store.write_measurement(schema.L2_RANK, ranks)
            last_window = values[k - L2_WINDOW + 1:k + 1]
    onset_ms = int(times[onset])
    node = int(CULPRITS[0] // topo.gpus_per_node)
    event_at = min(onset + 2, iterations - 1)
    store.write_measurement(schema.EVENT, pd.DataFrame({
        "time": [int(times[event_at])], "job": job, "name": "server_port_down", "node": str(node),
        "severity": "warning", "source": "netmon", "rank": [-1], "text": "server port down", "value": [1]}))
    store.write_measurement(schema.L1_CHANGEPOINT, pd.DataFrame({
        "time": [onset_ms], "job": job, "scope": "job", "rank": "-1", "kind": "step", "iteration": [onset],
        "before_ms": [30_000.0], "after_ms": [90_000.0], "magnitude": [3.0], "ranks_affected": [topo.world],
        "recovered_iteration": [-1], "text": "iteration time 30.0 s -> 90.0 s (x3.0)"}))
    group = topo.group_ranks("ep", int(CULPRITS[0]))
    gid = int(topo.group_ids("ep")[CULPRITS[0]])
    window = (last_window if last_window is not None else values).mean(axis=0)[:, stages.index("mlp")]
    culprit_ms, group_median = float(window[CULPRITS].mean()), float(np.median(window[group]))
    events = [{"name": "server port down", "node": node, "verdict": "contradicted",
               "reason": "only compute-only stages (mlp) are slow on the node; its collectives are not"}]
    evidence = {"stage": "mlp", "ratio": round(culprit_ms / group_median, 2), "culprit_ms": round(culprit_ms, 1),
                "group_median_ms": round(group_median, 1),
                "group": {"type": "ep", "id": gid, "ranks": format_ranks(group)}}
    after_h = (iterations - onset) * step_ms / 3_600_000
    inc = Incident(id=f"cs-{onset}-r{int(CULPRITS[0])}", job=job, cls=IncidentClass.COMPUTE_STRAGGLER,
                   ranks=CULPRITS.tolist(), nodes=[node], stage="mlp", ratio=evidence["ratio"], group_type="ep",
                   group_ranks=group.tolist(), onset_iteration=onset, onset_ms=onset_ms,
                   evidence=evidence, updated_ms=int(times[-1]), hosts=topo.hosts_of(CULPRITS) or [],
                   impact=Impact(30.0, 90.0, 3.0, topo.world * after_h * 2 / 3, 30.3))
    row = inc.to_row() | {"text": "mlp of ranks 10352-10359 is far above their EP group's median; the network "
                                  "event is contradicted by the evidence.",
                          "events": json.dumps(events)}
    store.write_measurement(schema.INCIDENT, pd.DataFrame([row]))
    store.write_measurement(schema.INCIDENT_HOST, incident_host_frame([inc]))


_FILLED: dict[str, IncidentData] = {}
_FAILED: dict[str, BaseException] = {}


def shared_incident(url: str, addfinalizer) -> IncidentData:
    """The filled database for this test session (filled once, dropped at the end).

    A failure to fill it is raised to every test that asks, from the one attempt."""
    if url in _FAILED:
        raise RuntimeError(f"the IL-0477 database could not be built: {_FAILED[url]!r}") from _FAILED[url]
    if url not in _FILLED:
        try:
            data = fill(url)
        except Exception as exc:
            _FAILED[url] = exc
            raise
        _FILLED[url] = data

        def drop() -> None:
            try:
                data.store.drop_database()
            finally:
                data.store.close()
                shutil.rmtree(data.truth_path.parent, ignore_errors=True)
                _FILLED.pop(url, None)

        addfinalizer(drop)
    return _FILLED[url]
