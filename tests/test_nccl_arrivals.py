"""Flight Recorder without timing (PyTorch's default; gloo always): each collective timed by who
arrives last, from ``time_created_ns`` (dumps in the shapes of tests/nccl_records.py), and the
arrival rule's clock-skew bound."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest

from analyzer.config import AnalyzerConfig
from analyzer.service.run_once import run_once
from collector import nccl_import as ni
from rankscope.cli import main as cli_main
from rankscope.stage_rows import stage_rows
from rankscope.store import EmbeddedStore
from rankscope.topology import Topology
from tests import nccl_records as nr

TOPO = Topology(pp=2, dp=4, gpus_per_node=4)
LAYOUT = ["--pp", "2", "--dp", "4", "--gpus-per-node", "4"]
#: The dumps' process group of each simulated communicator (pg names in the order of nr.comms()).
PG = {c: str(i) for i, c in enumerate(nr.comms())}


@pytest.fixture(scope="module")
def slow_recs():
    return nr.simulate(iterations=30, slow_rank=5, slow_from=15)


def true_waits(recs: list[dict]) -> pd.DataFrame:
    """Each record's real wait for the last member: its time less the transfer after that arrival."""
    t = pd.DataFrame(recs)
    t["p2p"] = t["op"].isin(["send", "recv"])
    last = t.groupby(["comm", "p2p", "sn"])["start_us"].transform("max")
    t["wait_ms"] = (last.astype(int) - t["start_us"].astype(int)) / 1000.0   # as the dumps stamp it (us)
    t["comm"], t["sn"] = t["comm"].map(PG), t["sn"] + 1
    return t[["rank", "comm", "sn", "wait_ms"]]


def test_waits_are_exact_within_a_host_and_bounded_across(slow_recs, tmp_path):
    nr.flight_recorder_files(slow_recs, tmp_path, timed=False, hosts=True)
    loaded = ni.read_files([tmp_path])
    timing = loaded.timing
    # per iteration 4 + 4 pipeline hops, 2 + 2 DP collectives, 1 job-wide: hops and job-wide span hosts
    assert (timing.source, timing.collectives, timing.cross_host, timing.left_out) == \
        ("time_created_ns", 30 * 13, 30 * 9, 0)
    got = loaded.records.merge(true_waits(slow_recs), on=["rank", "comm", "sn"], validate="1:1")
    assert len(got) == len(slow_recs) and set(got["host"]) == {"gpu-node-000", "gpu-node-001"}
    dp = got["comm"].isin([PG["0xdp000000000000"], PG["0xdp000000000001"]])
    np.testing.assert_allclose(got.loc[dp, "ms"], np.maximum(got.loc[dp, "wait_ms"], ni.arrivals.MIN_WAIT_MS))
    # across hosts: the least the wait can have been with clocks 1 ms apart, never more
    cross = got[~dp]
    assert (cross["ms"] <= np.maximum(cross["wait_ms"], 0.001) + 1e-9).all()
    assert (cross["ms"] >= cross["wait_ms"] - 1.0 - 1e-9).all()
    hops = got["comm"].isin([PG[f"0xpp{d:012x}"] for d in range(4)])
    np.testing.assert_allclose(got.loc[hops, "ms"], np.maximum(got.loc[hops, "wait_ms"] - 1.0, 0.001))


def _dump(rank: int, arrivals_us: list[float], durations: list[float] | None = None) -> bytes:
    """A two-rank job's dump: one all-reduce per arrival, on the default group."""
    entries = [{"record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": i + 1,
                "p2p_seq_id": 0, "op_id": i + 1, "profiling_name": "gloo:all_reduce",
                "time_created_ns": int((nr.T0_US + t) * 1000), "state": "scheduled", "is_p2p": False,
                "time_discovered_started_ns": None, "time_discovered_completed_ns": None}
               for i, t in enumerate(arrivals_us)]
    for e, d in zip(entries, durations or [], strict=False):
        e["duration_ms"] = d
    return pickle.dumps({"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
                         "entries": entries})


@pytest.mark.parametrize("hosts, skew_ms, rank0_waits_ms", [
    (("node-a.", "node-b."), 1.0, 0.001),   # rank 1 is last by 0.5 ms, within the skew: nobody blamed
    (("node-a.", "node-b."), 0.2, 0.3),     # a tighter bound resolves it, less the bound
    (("node-a.", "node-a."), 1.0, 0.5),     # one host, one clock: exact
    (("", ""), 1.0, 0.001),                  # hosts unknown: compared as across hosts
])
def test_a_lead_within_the_clock_skew_blames_nobody(tmp_path, hosts, skew_ms, rank0_waits_ms):
    arrivals = np.arange(5) * 20_000.0
    (tmp_path / f"{hosts[0]}nccl_trace_rank_0").write_bytes(_dump(0, list(arrivals)))
    (tmp_path / f"{hosts[1]}nccl_trace_rank_1").write_bytes(_dump(1, list(arrivals + 500)))
    rec = ni.load([tmp_path], clock_skew_ms=skew_ms).sort_values(["rank", "sn"])
    np.testing.assert_allclose(rec.loc[rec["rank"] == 0, "ms"], rank0_waits_ms)
    np.testing.assert_allclose(rec.loc[rec["rank"] == 1, "ms"], 0.001)
    np.testing.assert_allclose(rec.loc[rec["rank"] == 0, "end_us"], nr.T0_US + arrivals + rank0_waits_ms * 1000,
                               rtol=0, atol=1)
    with pytest.raises(ni.NcclError, match="--clock-skew-ms must be a number of ms in 0..60000, got -1"):
        ni.load([tmp_path], clock_skew_ms=-1)


def test_durations_are_used_when_every_dump_has_them(tmp_path):
    arrivals = list(np.arange(3) * 20_000.0)
    (tmp_path / "nccl_trace_rank_0").write_bytes(_dump(0, arrivals, [7.0, 7.0, 7.0]))
    (tmp_path / "nccl_trace_rank_1").write_bytes(_dump(1, arrivals, [6.0, 6.0]))   # its last not done
    loaded = ni.read_files([tmp_path])
    assert loaded.timing.source == "duration_ms" and len(loaded.records) == 5
    assert sorted(loaded.records["ms"]) == [6.0, 6.0, 7.0, 7.0, 7.0]
    # one dump without any: every collective is timed by arrival, durations and all
    (tmp_path / "nccl_trace_rank_1").write_bytes(_dump(1, arrivals))
    loaded = ni.read_files([tmp_path])
    assert loaded.timing.source == "time_created_ns" and (loaded.records["ms"] == 0.001).all()


def test_collectives_not_recorded_by_every_member_are_left_out(slow_recs, tmp_path):
    paths = nr.flight_recorder_files(slow_recs, tmp_path, timed=False, hosts=True)
    dump = nr.flight_recorder_dump(slow_recs, 3, timed=False)
    dump["entries"] = dump["entries"][:-1]   # rank 3 dumped before its last all-reduce
    paths[3].write_bytes(pickle.dumps(dump))
    loaded = ni.read_files([tmp_path])
    assert loaded.timing.left_out == 1 and loaded.timing.collectives == 30 * 13 - 1
    world = loaded.records[loaded.records["comm"] == PG["0xworld00000000"]]
    assert world["sn"].max() == 29 and len(world) == 29 * 8
    frame = ni.stage_frame(loaded.records, "j", TOPO).frame
    assert sorted(frame["iteration"].unique()) == list(range(29))   # the last is not closed


def test_names_the_slow_rank_and_its_host_from_arrivals_alone(slow_recs, tmp_path, capsys):
    nr.flight_recorder_files(slow_recs, tmp_path / "fr", timed=False, hosts=True)
    store = tmp_path / "s.db"
    assert cli_main(["import-nccl", str(tmp_path / "fr"), "--job", "a", "--store", str(store), *LAYOUT]) == 0
    out = capsys.readouterr().out
    assert out.startswith("imported 240 point(s)")
    assert "timed by arrival (no duration_ms" in out and "390 collective(s), 270 of them across hosts" in out
    with EmbeddedStore(store) as s:
        incidents = run_once(s, "a")
    assert [(i["class"], i["ranks"], i["hosts"]) for i in incidents] == [("arrival_straggler", [5], ["gpu-node-001"])]
    assert 15 <= incidents[0]["onset_iteration"] <= 17


def test_a_healthy_job_timed_by_arrival_has_no_incident(tmp_path, embedded_store):
    recs = nr.simulate(iterations=30, slow_rank=None, seed=1)
    rec = ni.load(nr.flight_recorder_files(recs, tmp_path, timed=False, hosts=True))
    embedded_store.write_stage_latency(ni.stage_frame(rec, "h", TOPO).frame)
    assert run_once(embedded_store, "h") == []


def _waits(lead_ms: float) -> pd.DataFrame:
    """Four ranks on two hosts, one all-reduce per iteration; from iteration 15 rank 2 arrives
    last by ``lead_ms`` (its wait 1 us, the others' ``lead_ms``)."""
    rng = np.random.default_rng(3)
    it = np.repeat(np.arange(40), 4)
    rank = np.tile(np.arange(4), 40)
    wait = 0.2 + 0.1 * rng.random(len(it))
    late = it >= 15
    wait[late] = np.where(rank[late] == 2, 0.001, lead_ms + 0.05 * rng.random(late.sum()))
    topo = Topology(dp=4, gpus_per_node=2, host_pattern="node-{node}")
    return stage_rows("w", rank, it, 1_700_000_000_000 + it * 50 + rank, {"reduce_scatter": wait},
                      topo=topo, iteration_ms=np.where(late, 50.0 + lead_ms, 50.0))


def test_the_analyzer_blames_nobody_by_less_than_the_clock_skew(embedded_store):
    embedded_store.write_stage_latency(_waits(3.0))
    assert run_once(embedded_store, "w", config=AnalyzerConfig(arrival_clock_skew_ms=5.0)) == []
    embedded_store.write_stage_latency(_waits(3.0).assign(job="w2"))
    [inc] = run_once(embedded_store, "w2")
    assert (inc["class"], inc["ranks"], inc["hosts"]) == ("arrival_straggler", [2], ["node-1"])
    ev = inc["evidence"]
    assert ev["clock_skew_ms"] == 1.0 and 2.9 < ev["lead_ms"] < 3.1
    assert "The group spans hosts (node-0, node-1), whose clocks agree only within 1 ms " \
           "(arrival_clock_skew_ms)" in ev["summary"] and "this lead is 3.0 ms." in ev["summary"]
