"""The kernel channel (L3): windows of kernel events compressed to bounded points, scored against
each rank's group, and a real gloo job whose one rank's operator degrades, named end to end."""

from __future__ import annotations

import uuid

import numpy as np
import pandas as pd
import pytest

from analyzer.score.kernel_scores import kernel_columns, kernel_findings
from collector.kernel_channel import KernelChannel
from rankscope import schema
from rankscope.kernel_names import MAX_NAME, OTHER, kernel_id, kernel_kind
from rankscope.topology import Topology
from tests.torch_alone import alone


def _events(rng, name: str, us: float, n: int = 40) -> list[tuple[str, float]]:
    return [(name, float(d)) for d in rng.lognormal(np.log(us), 0.03, n)]


def test_a_window_keeps_the_top_kernels_and_pools_the_rest():
    rng = np.random.default_rng(1)
    events = []
    for k in range(30):
        events += _events(rng, f"kernel_{k}", 10.0 * (k + 1))
    events += [("bad", float("nan")), ("bad", -1.0), ("bad", 0.0)]
    ch = KernelChannel({"job": "j", "rank": 0}, top_k=5)
    point, names = ch.window(3, 1_000, events)
    assert point["events"] == 30 * 40
    ids = set(kernel_columns(point))
    assert ids == {kernel_id(f"kernel_{k}") for k in range(25, 30)}    # the 5 longest
    assert f"{OTHER}_m0_n" in point and "bad" not in {n["name"] for n in names}
    assert sum(v for k, v in point.items() if k.endswith("_n")) == 30 * 40
    # names go once: a second window names nothing new
    assert len(names) == 5 and ch.window(4, 2_000, events)[1] == []


def test_long_names_are_cut_and_kinds_told_apart():
    long = "void cutlass::Kernel<" + "T" * 10_000 + ">"
    ch = KernelChannel({"job": "j", "rank": 0})
    _, names = ch.window(0, 0, [(long, 5.0), ("gloo:all_reduce", 9.0)])
    by = {n["kernel"]: n for n in names}
    assert len(by[kernel_id(long)]["name"]) == MAX_NAME
    assert by[kernel_id("gloo:all_reduce")]["kind"] == "comm" and kernel_kind("aten::mm") == "compute"
    point, names = KernelChannel({"job": "j", "rank": 0}).window(0, 0, [])
    assert point["events"] == 0 and not kernel_columns(point) and names == []


def _window(rng, world: int, slow: dict[int, float], missing: tuple[int, ...] = ()) -> pd.DataFrame:
    rows = []
    for r in range(world):
        if r in missing:
            continue
        ch = KernelChannel({"job": "j", "rank": r})
        ev = _events(rng, "aten::mm", 200.0 * slow.get(r, 1.0)) + _events(rng, "c10d::allreduce_", 500.0)
        if r % 2 == 0:
            ev += [("rare", 50.0)]   # one sample, on half the ranks
        rows.append(ch.window(9, 1_000, ev)[0])
    return pd.DataFrame(rows)


def test_findings_name_the_slow_rank_and_its_kernel_only():
    rng = np.random.default_rng(2)
    topo = Topology(dp=16, gpus_per_node=8, hosts=("a", "b"))
    names = {kernel_id("aten::mm"): ("aten::mm", "compute")}
    f = kernel_findings(_window(rng, 16, {11: 1.6}, missing=(3,)), names, topo)
    assert f[["rank", "name", "kind", "host", "group_type"]].values.tolist() == [[11, "aten::mm", "compute", "b", "dp"]]
    assert f["ratio"].iloc[0] == pytest.approx(1.6, rel=0.1) and f["w1_us"].iloc[0] > 50
    healthy = kernel_findings(_window(rng, 16, {}), names, topo)
    assert healthy.empty and list(healthy.columns) == list(f.columns)
    # a rank past the topology (a bad tag) is left out, not an error
    odd = _window(rng, 16, {}).assign(rank=lambda d: d["rank"].where(d["rank"] != 4, 99))
    assert kernel_findings(odd, names, topo).empty


@pytest.fixture(scope="module")
def kernel_run(influx_url):
    """A real 4-process gloo job, the kernel channel on (3 of every 5 steps profiled); rank 2's
    expert operator does 10x its work from step 15 (4 processes on 2 shared cores time their
    operators up to ~3x apart now and then: the fault stands above that). Analyzed once."""
    from analyzer.service.analyzer_service import AnalyzerService
    from evaluation.torch_demo import DemoConfig, run_demo
    from rankscope.store import InfluxStore

    store = InfluxStore(influx_url, bucket=f"kernels_{uuid.uuid4().hex[:8]}", api="v1")
    cfg = DemoConfig(job="kernel-run", store=influx_url, bucket=store.bucket, world=4, iterations=30,
                     slow_rank=2, slow_from=15, slow_factor=36, kernel_every=5, kernel_active=3)
    try:
        with alone():
            run_demo(cfg)
        svc = AnalyzerService(store, jobs=[cfg.job])
        svc.cycle(final=True)
        yield cfg, store
    finally:
        store.drop_database()
        store.close()


def test_a_real_gloo_run_names_the_rank_and_operator_that_degraded(kernel_run):
    cfg, store = kernel_run
    stats = store.read(schema.KERNEL_STATS, cfg.job)
    assert set(stats["rank"]) == set(range(cfg.world)) and stats["iteration"].nunique() == 6
    found = store.read(schema.L3_KERNEL, cfg.job)
    confirmed = found[found["confirmed"] == 1] if len(found) else found
    assert len(confirmed), f"no confirmed kernel finding in {found}"
    shown = confirmed[["iteration", "rank", "name", "ratio", "windows"]]
    # the slow rank's operator, in the windows after it slowed, is the strongest finding
    late = confirmed[confirmed["iteration"] > cfg.slow_from]
    assert ("moe.expert_ffn", 2) in set(zip(late["name"], late["rank"], strict=True)), shown
    assert confirmed.loc[confirmed["ratio"].idxmax(), "rank"] == 2, shown
    row = late[late["name"] == "moe.expert_ffn"].iloc[0]
    # before it slowed, a process starved of CPU on the shared cores may stand out two windows in a
    # row (really slower, a finding); far less than the fault does
    early = confirmed[confirmed["iteration"] < cfg.slow_from]
    assert (early["ratio"] < 0.5 * row["ratio"]).all(), shown
    assert row["kind"] == "compute" and row["group_type"] == "dp" and row["ratio"] > 1.5 and row["host"]


# ------------------------------------------------------------- the cycle: retries, junk, restarts

def _points(world: int, iteration: int, time_ms: int, slow: dict[int, float] | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(iteration)
    rows = []
    for r in range(world):
        ch = KernelChannel({"job": "c", "rank": r, "host": f"h{r // 4}"})
        rows.append(ch.window(iteration, time_ms + r, _events(rng, "aten::mm", 200.0 * (slow or {}).get(r, 1.0)))[0])
    return pd.DataFrame(rows)


class _FailingOnce:
    """The store, but its first write of ``l3_kernel`` fails (the database went away)."""

    def __init__(self, store):
        self.store, self.failed = store, False

    def __getattr__(self, name):
        return getattr(self.store, name)

    def write_measurement(self, measurement, frame):
        if measurement == schema.L3_KERNEL and not self.failed:
            self.failed = True
            raise ConnectionError("store down")
        return self.store.write_measurement(measurement, frame)


def test_a_failed_write_is_retried_without_counting_its_windows_twice(influx_store):
    from analyzer.job_analyzer import JobAnalyzer
    from analyzer.service.kernel_cycle import KernelCycle

    topo = Topology(dp=8, gpus_per_node=4)
    influx_store.write_measurement(schema.KERNEL_NAME, pd.DataFrame([{"time": 0 + 3_600_000, "job": "c",
                                   "kernel": kernel_id("aten::mm"), "name": "aten::mm", "kind": "compute"}]))
    for k, it in enumerate((9, 19, 29)):       # rank 5 slow in the window of 9 only
        influx_store.write_measurement(schema.KERNEL_STATS, _points(8, it, 3_600_000 + 60_000 * k,
                                                                     {5: 2.0} if it == 9 else None))
    cycle, ja = KernelCycle(_FailingOnce(influx_store)), JobAnalyzer("c", topo, schema.DEFAULT_STAGES)
    assert cycle.run("c", ja) == 0 and "c" not in cycle.done            # the write failed: nothing moved
    assert cycle.run("c", ja) == 1                                      # the retry: the same window
    found = influx_store.read(schema.L3_KERNEL, "c")
    assert found[["iteration", "rank", "windows", "confirmed"]].values.tolist() == [[9, 5, 1, 0]]


def test_junk_fields_and_bad_modes_are_skipped_not_fatal():
    rng = np.random.default_rng(4)
    topo = Topology(dp=8, gpus_per_node=4)
    frame = _window(rng, 8, {6: 1.7})
    kid = kernel_id("aten::mm")
    frame[f"{kid}_m999999_n"] = 1.0                     # a mode index no channel writes: not read
    frame.loc[frame["rank"] == 2, f"{kid}_m0_p50"] = -3.0   # a negative duration: rank 2 has no mode
    frame.loc[frame["rank"] == 3, f"{kid}_m0_n"] = np.nan
    f = kernel_findings(frame, {kid: ("aten::mm", "compute")}, topo)
    assert f["rank"].tolist() == [6]
    junk = frame.assign(**{f"{kid}_m0_p50": -1.0})       # no rank has a valid mode left: nothing, no error
    assert kernel_findings(junk, {}, topo).empty
    unnamed = kernel_findings(frame, {}, topo)           # its name has not come: kind unknown
    assert unnamed[["rank", "kind", "cause"]].values.tolist() == [[6, "unknown", "unknown"]]


def test_windows_of_a_restart_that_runs_the_same_iterations_again_are_new_windows():
    from analyzer.service.kernel_cycle import GAP_MS, ready_windows

    first = _points(8, 100, 1_000_000)
    again = _points(8, 100, 1_000_000 + 3 * GAP_MS)      # resumed from a checkpoint: iteration 100 again
    later = _points(8, 110, 1_000_000 + 4 * GAP_MS)
    frame = pd.concat([first, again, later], ignore_index=True)
    wins = ready_windows(frame, None, True, 8)
    assert [(it, len(w)) for it, w in wins] == [(100, 8), (100, 8), (110, 8)]
    assert [it for it, _ in ready_windows(frame, int(first["time"].max()), False, 8)] == [100]
    # a window that misses ranks waits while only one newer window has begun, then goes
    nxt = _points(8, 110, 1_000_000 + GAP_MS)
    assert ready_windows(pd.concat([first.iloc[3:], nxt]), None, False, 8) == []
    assert [it for it, _ in ready_windows(pd.concat([first, nxt]), None, False, 8)] == [100]
    three = pd.concat([first.iloc[3:], nxt, _points(8, 120, 1_000_000 + 2 * GAP_MS)])
    assert [(it, len(w)) for it, w in ready_windows(three, None, False, 8)] == [(100, 5), (110, 8)]
