"""``rankscope import-nccl``: NCCL Inspector and Flight Recorder records (shapes of
tests/nccl_records.py) -> stage_latency, and the straggler named from communication alone."""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from analyzer.service.run_once import run_once
from collector import nccl_import as ni
from rankscope.cli import main as cli_main
from rankscope.store import EmbeddedStore
from rankscope.topology import Topology
from tests import nccl_records as nr

TOPO = Topology(pp=2, dp=4, gpus_per_node=4)
LAYOUT = ["--pp", "2", "--dp", "4", "--gpus-per-node", "4"]


@pytest.fixture(scope="module")
def slow_recs():
    return nr.simulate(iterations=30, slow_rank=5, slow_from=15)


@pytest.fixture(scope="module")
def healthy_recs():
    return nr.simulate(iterations=30, slow_rank=None, seed=1)


def inspector_frame(recs, tmp_path, **kw):
    nr.inspector_files(recs, tmp_path / "insp", **kw)
    return ni.stage_frame(ni.load([tmp_path / "insp"]), "j", TOPO)


# ------------------------------------------------------------------------------ the importer
def test_inspector_records_give_global_ranks_members_and_kinds(slow_recs, tmp_path):
    nr.inspector_files(slow_recs, tmp_path)
    rec = ni.load([tmp_path])
    assert sorted(rec["rank"].unique()) == list(range(8))
    assert set(rec["host"]) == {"gpu-node-000", "gpu-node-001"}
    kinds = ni.comm_kinds(rec, TOPO)
    assert kinds == {"0xworld00000000": "world", "0xdp000000000000": "dp", "0xdp000000000001": "dp",
                     **{f"0xpp{d:012x}": "pipeline" for d in range(4)}}
    assert ni.choose_anchor(rec) == "0xworld00000000"
    # verbose records: the end is the kernel's stop, not the dump thread's time
    r0 = rec[(rec["rank"] == 0) & (rec["comm"] == "0xworld00000000")].sort_values("sn").iloc[0]
    first = next(x for x in slow_recs if x["rank"] == 0 and x["comm"] == "0xworld00000000")
    assert r0["end_us"] == nr.T0_US + int(first["end_us"])


def test_stage_frame_one_point_per_rank_per_iteration(slow_recs, tmp_path):
    imp = inspector_frame(slow_recs, tmp_path)
    f = imp.frame
    assert len(f) == 30 * 8 and sorted(f["iteration"].unique()) == list(range(30))
    assert {"pp_send", "pp_recv", "reduce_scatter", "all_gather", "comm_other"} <= set(f.columns)
    assert not imp.missing
    for _, g in f.groupby("rank"):
        assert (np.diff(g.sort_values("iteration")["time"].to_numpy()) > 0).all()
    assert (f["host"] == [nr.host_of(r) for r in f["rank"]]).all()
    late = f[f["iteration"] >= 16].groupby("rank")["reduce_scatter"].median()
    # the slow rank (5) and its pipeline partner (1) arrive last in their DP groups: short
    assert late[[1, 5]].max() < 10 and late.drop([1, 5]).min() > 100
    pp = f[f["iteration"] >= 16].groupby("rank")["pp_recv"].median()
    assert pp[5] < 2 and pp[1] > 40   # rank 1 waits for 5 in the pipeline, 5 waits for nobody


def test_flight_recorder_pickle_and_json_match_the_inspector(slow_recs, tmp_path):
    insp = inspector_frame(slow_recs, tmp_path).frame
    pk = ni.stage_frame(ni.load(nr.flight_recorder_files(slow_recs, tmp_path / "pk")), "j", TOPO).frame
    nr.flight_recorder_files(slow_recs, tmp_path / "js", as_json=True)
    js = ni.stage_frame(ni.load([tmp_path / "js"]), "j", TOPO).frame
    assert len(pk) == len(js) == len(insp)
    for col in ("reduce_scatter", "pp_send", "pp_recv", "all_gather"):
        np.testing.assert_allclose(pk[col], insp[col], atol=0.01)
        np.testing.assert_allclose(js[col], pk[col])
    assert "host" not in pk.columns   # a dump names no host


def test_per_iteration_and_anchor(slow_recs, tmp_path):
    nr.inspector_files(slow_recs, tmp_path)
    rec = ni.load([tmp_path])
    two = ni.stage_frame(rec, "j", TOPO, per_iteration=2).frame
    assert sorted(two["iteration"].unique()) == list(range(15))
    # anchored on a DP group (a reduce-scatter and an all-gather per iteration): its ranks only
    dp = ni.stage_frame(rec, "j", TOPO, per_iteration=2, anchor="0xdp000000000000").frame
    assert set(dp["rank"]) == {0, 1, 2, 3} and dp["iteration"].nunique() == 30


def test_sampled_inspector_counts_missing_records(slow_recs, tmp_path):
    nr.inspector_files(slow_recs, tmp_path)
    p = tmp_path / f"{nr.host_of(3)}-pid1003.log"
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(ln for i, ln in enumerate(lines) if i != 5))   # the dump thread skipped one
    imp = ni.stage_frame(ni.load([tmp_path]), "j", TOPO)
    assert sum(imp.missing.values()) == 1


# ------------------------------------------------------------------------------ the analyzer
def test_names_the_slow_rank_from_communication_alone(slow_recs, tmp_path, embedded_store):
    embedded_store.write_stage_latency(inspector_frame(slow_recs, tmp_path).frame)
    incidents = run_once(embedded_store, "j")
    assert [(i["class"], i["ranks"]) for i in incidents] == [("arrival_straggler", [5])]
    inc = incidents[0]
    ev = json.loads(inc["evidence"]) if isinstance(inc["evidence"], str) else inc["evidence"]
    assert ev["from_communication_alone"] and ev["arrived_last"]
    assert ev["summary"].startswith("From communication alone: rank 5 (gpu-node-001) arrives last.")
    assert set(ev["short_stages"]) == {"pp_send", "pp_recv", "reduce_scatter"}
    assert inc["hosts"] == ["gpu-node-001"] and 15 <= inc["onset_iteration"] <= 17


def test_healthy_job_has_no_incident(healthy_recs, tmp_path, embedded_store):
    embedded_store.write_stage_latency(inspector_frame(healthy_recs, tmp_path).frame)
    assert run_once(embedded_store, "j") == []


def test_compute_stages_leave_it_to_the_straggler_rule(slow_recs, tmp_path, embedded_store):
    frame = inspector_frame(slow_recs, tmp_path).frame
    slow = (frame["rank"] == 5) & (frame["iteration"] >= 15)
    frame["compute_other"] = np.where(slow, 80.0, 20.0) * (1 + 0.02 * np.sin(np.arange(len(frame))))
    embedded_store.write_stage_latency(frame)
    incidents = run_once(embedded_store, "j")
    assert [(i["class"], i["ranks"]) for i in incidents] == [("compute_straggler", [5])]


def test_flight_recorder_on_influxdb(slow_recs, tmp_path, influx_store):
    files = nr.flight_recorder_files(slow_recs, tmp_path / "fr")
    imp = ni.stage_frame(ni.load(files), "fr", TOPO)
    influx_store.write_stage_latency(imp.frame)
    incidents = run_once(influx_store, "fr")
    assert [(i["class"], i["ranks"]) for i in incidents] == [("arrival_straggler", [5])]


# ------------------------------------------------------------------------------ the command
def test_import_nccl_cli(slow_recs, tmp_path, capsys):
    nr.inspector_files(slow_recs, tmp_path / "insp")
    store = tmp_path / "s.db"
    assert cli_main(["import-nccl", str(tmp_path / "insp"), "--job", "c", "--store", str(store), *LAYOUT]) == 0
    out = capsys.readouterr().out
    assert out.startswith("imported 240 point(s): 8 rank(s) (tp 1 x pp 2 x dp 4, ep 1), iterations 0-29")
    assert "anchor 0xworld00000000" in out and "0xpp000000000000 pipeline" in out
    with EmbeddedStore(store) as s:
        assert len(s.read_stage_latency("c")) == 240


def test_follow_picks_up_appended_records(slow_recs, tmp_path):
    d = tmp_path / "live"
    d.mkdir()
    lines = {r: [nr.inspector_line(x) + "\n" for x in sorted((x for x in slow_recs if x["rank"] == r),
                                                              key=lambda x: x["end_us"])] for r in range(8)}
    path = {r: d / f"{nr.host_of(r)}-pid{1000 + r}.log" for r in range(8)}
    half = len(lines[0]) // 2
    for r in range(8):
        path[r].write_text("".join(lines[r][:half]) + lines[r][half][:40])   # a line half written
    store = tmp_path / "s.db"
    rc: list[int] = []
    t = threading.Thread(target=lambda: rc.append(cli_main(
        ["import-nccl", str(d), "--job", "f", "--store", str(store), "--follow", "--interval", "0.1",
         "--max-seconds", "3", *LAYOUT])))
    t.start()
    time.sleep(1.5)
    with EmbeddedStore(store) as s:
        early = s.read_stage_latency("f")
    for r in range(8):
        with open(path[r], "a") as fh:
            fh.write(lines[r][half][40:] + "".join(lines[r][half + 1:]))
    t.join(20)
    assert rc == [0]
    assert 0 < len(early) < 240 and early["iteration"].max() < 15
    with EmbeddedStore(store) as s:
        pts = s.read_stage_latency("f")
    assert len(pts) == 240 and not pts.duplicated(["rank", "iteration"]).any()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_follow_stops_on_sigterm_or_ctrl_c_after_its_last_read(slow_recs, tmp_path, stop):
    """docker stop (SIGTERM) or Ctrl-C ends the follower at its next turn: a last read, every point
    written once, exit 0 (a flag the handler sets, not an exception that a library may swallow)."""
    nr.inspector_files(slow_recs, tmp_path / "insp")
    store = tmp_path / "s.db"
    proc = subprocess.Popen([str(Path(sys.executable).with_name("rankscope")), "import-nccl", str(tmp_path / "insp"),
                             "--job", "t", "--store", str(store), "--follow", "--interval", "0.2", *LAYOUT],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while "wrote " not in (proc.stdout.readline() if proc.poll() is None else "x wrote "):
            assert time.monotonic() < deadline, "the follower wrote nothing in 60 s"
        time.sleep(0.5)
        assert proc.poll() is None, "the follower ended before it was told to"
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.rstrip().endswith("240 point(s) written"), out
    with EmbeddedStore(store) as s:
        pts = s.read_stage_latency("t")
    assert len(pts) == 240 and not pts.duplicated(["rank", "iteration"]).any()


# ------------------------------------------------------------------------------ errors
def test_errors_name_the_file_record_and_field(slow_recs, tmp_path):
    nr.inspector_files(slow_recs[:50], tmp_path / "ok")
    bad = tmp_path / "bad.log"
    good = json.loads(nr.inspector_line(slow_recs[0]))
    bad.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ni.NcclError, match=r"bad.log:2: not a JSON record"):
        ni.load([bad], "inspector")
    del good["coll_perf"]["coll_sn"]
    bad.write_text(json.dumps(good) + "\n")
    with pytest.raises(ni.NcclError, match=r"bad.log:1: coll_perf: missing field 'coll_sn'"):
        ni.load([bad], "inspector")
    good = json.loads(nr.inspector_line(slow_recs[0]))
    good["coll_perf"]["coll"] = "AllToAllv"
    bad.write_text(json.dumps(good) + "\n")
    with pytest.raises(ni.NcclError, match=r"bad.log:1: coll_perf.coll 'AllToAllv' is not one of"):
        ni.load([bad], "inspector")
    good["coll_perf"]["coll"], good["coll_perf"]["coll_exec_time_us"] = "AllReduce", -3
    bad.write_text(json.dumps(good) + "\n")
    with pytest.raises(ni.NcclError, match=r"coll_exec_time_us' must be a non-negative number"):
        ni.load([bad], "inspector")
    fr = tmp_path / "nccl_trace_rank_0"
    dump = nr.flight_recorder_dump(slow_recs, 0)
    for e in dump["entries"]:
        del e["duration_ms"]
    fr.write_bytes(pickle.dumps(dump))
    # untimed: each collective is timed by who arrives last, which one rank's dump cannot say
    with pytest.raises(ni.NcclError, match=r"no collective was recorded by every member of its group "
                                           r"\(\d+ left out\), so no arrival can be compared"):
        ni.load([fr])
    dump = nr.flight_recorder_dump(slow_recs, 0)
    del dump["entries"][3]["profiling_name"]
    fr.write_bytes(pickle.dumps(dump))
    with pytest.raises(ni.NcclError, match=r"nccl_trace_rank_0: entry 3: missing field 'profiling_name'"):
        ni.load([fr])
    fr.write_bytes(b"\x80garbage")
    with pytest.raises(ni.NcclError, match=r"nccl_trace_rank_0: not a Flight Recorder dump"):
        ni.load([fr])
    with pytest.raises(ni.NcclError, match=r"nope: no such file or directory"):
        ni.load([tmp_path / "nope"])
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(ni.NcclError, match=r"x.txt: neither an NCCL Inspector log"):
        ni.load([tmp_path / "x.txt"])
    # a process whose job-wide communicator record is missing has no known global rank
    p = tmp_path / "ok" / f"{nr.host_of(0)}-pid1000.log"
    p.write_text("".join(ln + "\n" for ln in p.read_text().splitlines() if "0xworld" not in ln))
    with pytest.raises(ni.NcclError, match=r"pid1000.log: no record of a job-wide communicator"):
        ni.load([tmp_path / "ok"])


def test_cli_errors(slow_recs, tmp_path, capsys):
    nr.inspector_files(slow_recs, tmp_path / "insp")
    store = str(tmp_path / "s.db")
    rc = cli_main(["import-nccl", str(tmp_path / "insp"), "--job", "c", "--store", store, "--pp", "3"])
    assert rc != 0 and "--pp 3" in capsys.readouterr().err
    nr.flight_recorder_files(slow_recs, tmp_path / "fr")
    rc = cli_main(["import-nccl", str(tmp_path / "fr"), "--job", "c", "--store", store, "--follow",
                   "--format", "flight-recorder"])
    assert rc != 0 and "--follow tails Inspector logs" in capsys.readouterr().err
    rc = cli_main(["import-nccl", str(tmp_path / "insp"), "--job", "c", "--store", store, *LAYOUT,
                   "--anchor", "0xnothing"])
    assert rc != 0 and "anchor communicator '0xnothing' has no record" in capsys.readouterr().err


def test_all_to_alls_on_ep_groups_alternate_dispatch_and_combine():
    """dp=4, ep=2: two all-to-alls per iteration on each EP pair, then the job-wide all-reduce."""
    raw, t = [], 0.0
    comms = {"0xep0": (0, 1), "0xep1": (2, 3), "0xw": (0, 1, 2, 3)}
    sn = dict.fromkeys(comms, 0)
    for _ in range(3):
        for comm, ms in (("0xep0", 5.0), ("0xep1", 5.0), ("0xep0", 7.0), ("0xep1", 7.0), ("0xw", 1.0)):
            t += 10_000
            for i, r in enumerate(comms[comm]):
                raw.append({"source": f"h-pid{r}.log", "line": len(raw) + 1, "comm": comm, "comm_rank": i,
                            "n_ranks": len(comms[comm]), "op": ni.INSPECTOR_OPS["SendRecv"], "sn": sn[comm],
                            "ms": ms, "end_us": t, "host": "h"})
            if comm == "0xw":
                for x in raw[-4:]:
                    x["op"] = "all_reduce"
            sn[comm] += 1
    rec = ni.inspector_records(raw)
    topo = Topology(dp=4, ep=2, gpus_per_node=4)
    imp = ni.stage_frame(rec, "e", topo)
    assert imp.kinds == {"0xep0": "ep", "0xep1": "ep", "0xw": "dp"}
    f = imp.frame
    assert len(f) == 12 and (f["dispatch"] == 5.0).all() and (f["combine"] == 7.0).all()
    assert (f["reduce_scatter"] == 1.0).all()   # the all-reduce on the DP group: the gradient sync


def test_newer_inspector_fields_and_float_times_are_read(tmp_path):
    rec = json.loads(nr.inspector_line({"rank": 0, "comm": "0xworld00000000", "op": "all_reduce", "sn": 3,
                                        "start_us": 0.0, "end_us": 150.3, "ms": 0.1503}, verbose=False))
    rec["coll_perf"].update(coll_algo="RING", coll_proto="LL", coll_exec_time_us=150.3)
    out = ni.parse_inspector_lines([json.dumps(rec)], "x.log")
    assert out[0]["ms"] == pytest.approx(0.1503) and out[0]["end_us"] == nr.T0_US + 150 + 300


def test_a_network_event_on_the_arrival_straggler_is_contradicted():
    from analyzer.diagnosis.event_verdicts import Verdict, verdict
    from rankscope.incident import IncidentClass

    v, reason = verdict("network", IncidentClass.ARRIVAL_STRAGGLER, True, {"arrived_last": True})
    assert v == Verdict.CONTRADICTED and "arrives last" in reason
    assert verdict("compute", IncidentClass.ARRIVAL_STRAGGLER, True)[0] == Verdict.SUPPORTED
