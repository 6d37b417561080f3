"""Values from files are checked column by column (issue 29, item 1): a bad row is refused with a
count and an example naming the file, the row and the column; the good rows are imported; no
traceback reaches the user of import-ops, import-trace or import-nccl."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collector import nccl_import as ni
from collector.ops_import import OpsError, read_ops, stage_frame
from collector.ops_import.values import checked_rows
from collector.untrusted.clear_errors import clear_errors
from rankscope.cli import main as cli_main
from rankscope.store import EmbeddedStore
from tests import nccl_records as nr

pytest.importorskip("pyarrow")

DATA = Path(__file__).parent / "data" / "stragglers"
START = "2026-07-08T09:30:00Z"
START_MS = 1_783_503_000_000
RANKSCOPE = Path(sys.executable).with_name("rankscope")


def rankscope(*args: object) -> subprocess.CompletedProcess:
    """The installed command, as a user runs it."""
    p = subprocess.run([str(RANKSCOPE), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.fixture(scope="module")
def st() -> pd.DataFrame:
    return read_ops(DATA / "trace-ST.parquet")


def stored(path: Path, job: str) -> pd.DataFrame:
    s = EmbeddedStore(path)
    try:
        return s.read_stage_latency(job)
    finally:
        s.close()


# ------------------------------------------------------------------ import-ops
def test_nan_huge_and_overflowing_values_are_refused_and_the_rest_imported(st, tmp_path):
    """A step of NaN, a start_ts of 1e300, a step of 2^62 (they became a time of
    -9223370240328514353 and an iteration of INT64_MIN)."""
    bad = st.astype({"step": object, "start_ts": object})
    rows = {10: ("step", float("nan")), 20: ("start_ts", 1e300), 30: ("step", 2**62)}
    for i, (col, value) in rows.items():
        bad.loc[bad.index[i], col] = value
    csv = tmp_path / "ops.csv"
    bad.to_csv(csv, index=False)
    p = rankscope("import-ops", csv, "--job", "st", "--store", tmp_path / "s.db", "--start", START)
    assert p.returncode == 0 and "imported 256 point(s)" in p.stdout
    assert f"{csv}: refused 3 of {len(st)} row(s) with bad values (first: row 11, column 'step': nan " \
           f"is missing or not finite); importing the rest" in p.stderr
    got = stored(tmp_path / "s.db", "st")
    assert got["iteration"].between(st["step"].min(), st["step"].max()).all()
    assert got["time"].between(START_MS, START_MS + 86_400_000 * 30).all()
    # the good rows, every one of them: the points equal an import of the file without the bad rows
    want, _ = stage_frame(st.drop(index=st.index[list(rows)]), "st", START_MS)
    assert sorted(got["time"]) == sorted(want["time"])
    assert sorted(got["iteration"]) == sorted(want["iteration"])


def test_text_in_rank_is_refused_by_row_and_column(st, tmp_path):
    """It gave "invalid literal for int()" naming neither the column nor the file."""
    bad = st.astype({"rank": object})
    bad.loc[bad.index[4], "rank"] = "rank-four"
    bad.loc[bad.index[5], "rank"] = f" {st['rank'].iloc[5]} "   # a number written as text is a number
    csv = tmp_path / "ops.csv"
    bad.to_csv(csv, index=False)
    p = rankscope("import-ops", csv, "--job", "st", "--store", tmp_path / "s.db", "--start", START)
    assert p.returncode == 0, p.stderr
    assert "refused 1 of" in p.stderr and "(first: row 5, column 'rank': 'rank-four' is not a number)" in p.stderr


@pytest.mark.parametrize("column", ["rank", "stage"])
def test_lists_in_rank_or_stage_leave_nothing_usable_and_exit_1(st, tmp_path, column):
    """They gave TypeError tracebacks."""
    bad = st.copy()
    bad[column] = [[int(v), 1] for v in bad[column]]
    path = tmp_path / "ops.parquet"
    bad.to_parquet(path)
    p = rankscope("import-ops", path, "--job", "st", "--store", tmp_path / "s.db")
    assert p.returncode == 1 and "no usable row to import" in p.stderr
    assert f"{path}: refused {len(st)} of {len(st)} row(s)" in p.stderr
    assert f"column {column!r}: array([" in p.stderr and "is not a number" in p.stderr
    assert not (tmp_path / "s.db").exists()


def test_every_rule_of_every_column(st):
    cases = [("rank", True, "is not a number"), ("dp_rank", -1, "is outside 0..1048575"),
             ("stage", 2.5, "is not an integer"), ("step", 2**31, "is outside 0..2147483647"),
             ("step", None, "is missing or not finite"), ("start_ts", "soon", "is not a number"),
             ("duration", float("inf"), "is missing or not finite"), ("duration", -0.5, "is outside 0..1e+06"),
             ("start_ts", 2e6, "is outside 0..1e+06"), ("optype", 7, "is not text"),
             ("optype", None, "is not text"), ("rank", [1], "is not a number"), ("rank", 10**400, "is outside")]
    for col, value, rule in cases:
        bad = st.astype({col: object})
        bad.at[bad.index[3], col] = value
        good, refused = checked_rows(bad, "f.csv")
        assert refused.refused == 1 and len(good) == len(st) - 1, (col, value)
        assert refused.first.startswith(f"row 4, column {col!r}: ") and rule in refused.first, refused.first
    good, refused = checked_rows(st, "f.csv")
    assert refused.refused == 0 and good.dtypes["step"] == np.int64
    pd.testing.assert_frame_equal(stage_frame(good, "st", START_MS)[0], stage_frame(st, "st", START_MS)[0])


def test_steps_whose_points_a_store_cannot_hold_are_refused(st, tmp_path, capsys):
    far = st.copy()
    far.loc[far.index[0], "step"] = 2**31 - 1   # in range, but 2^31 steps of 3 s from 2128 reach past 2262
    with pytest.raises(OpsError, match=r"steps 23-2147483647, one every 3 s, would place points outside"):
        stage_frame(far, "st", 5_000_000_000_000)
    path = tmp_path / "far.parquet"
    far.to_parquet(path)
    assert cli_main(["import-ops", str(path), "--job", "x", "--store", str(tmp_path / "s.db")]) == 1
    assert "would place points outside the times a store holds" in capsys.readouterr().err


# ------------------------------------------------------------------ import-trace
def test_bad_trace_events_are_refused_and_counted(tmp_path):
    base = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1}
    ev = []
    for k in range(4):
        ev.append({**base, "cat": "user_annotation", "name": f"ProfilerStep#{k}", "ts": k * 1000, "dur": 900})
        ev.append({**base, "name": "aten::mm", "ts": k * 1000 + 10, "dur": 100})
    ev += [{**base, "name": "aten::mm", "ts": [5], "dur": 1}, "not an event", {**base, "name": {"x": 1}},
           {**base, "name": "aten::mm", "ts": 1, "dur": float("nan")}, {**base, "ts": 1e300},
           {**base, "name": "ProfilerStep#99999999999", "ts": 1}, {**base, "args": {"correlation": [1]}},
           {**base, "cat": "kernel", "ts": 1, "args": {"device": "gpu0"}}, {**base, "pid": [1], "ts": 1}]
    trace = {"traceEvents": ev, "baseTimeNanoseconds": START_MS * 10**6,
             "distributedInfo": {"rank": 0, "world_size": 1}}
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(trace))
    p = rankscope("import-trace", path, "--job", "t", "--store", tmp_path / "s.db")
    assert p.returncode == 0 and "imported 4 point(s)" in p.stdout and "refused 9 event(s)" in p.stdout
    assert f"refused 9 event(s) with bad values (first: {path} event 8, field 'ts': [5] is not a number)" \
        in p.stderr
    trace["distributedInfo"]["rank"] = "zero"
    path.write_text(json.dumps(trace))
    p = rankscope("import-trace", path, "--job", "t", "--store", tmp_path / "s.db")
    assert p.returncode == 1 and f"{path}: field 'distributedInfo.rank': 'zero' is not an integer" in p.stderr
    trace["distributedInfo"]["rank"], trace["baseTimeNanoseconds"] = 0, "now"
    path.write_text(json.dumps(trace))
    p = rankscope("import-trace", path, "--job", "t", "--store", tmp_path / "s.db")
    assert p.returncode == 1 and "field 'baseTimeNanoseconds': 'now'" in p.stderr


# ------------------------------------------------------------------ import-nccl
def test_bad_inspector_values_refuse_their_file_naming_field_and_count(tmp_path):
    recs = nr.simulate(iterations=4, slow_rank=None)
    folder = tmp_path / "insp"
    paths = nr.inspector_files(recs, folder)
    lines = paths[0].read_text().splitlines()
    hostile = []
    for i, change in enumerate([("coll_perf", "coll_sn", 1e300), ("header", "rank", [0]),
                                ("coll_perf", "event_trace_ts", {"kernel_events": 7}),
                                ("metadata", "dump_timestamp_us", 1e300), ("coll_perf", "coll", ["AllReduce"])]):
        rec = json.loads(lines[i])
        rec[change[0]][change[1]] = change[2]
        hostile.append(json.dumps(rec))
    paths[0].write_text("\n".join(hostile + lines[len(hostile):]) + "\n")
    p = rankscope("import-nccl", folder, "--job", "n", "--store", tmp_path / "s.db")
    assert p.returncode == 3   # the file is refused, the other ranks' files imported
    assert f"{paths[0]}:1: field 'coll_perf.coll_sn' must be at most 4.61169e+18, got 1e+300 " \
           f"(4 bad records in all; the first is shown)" in p.stderr
    assert p.stdout.startswith("imported 28 point(s)")


def test_bad_flight_recorder_values_are_named(tmp_path):
    recs = nr.simulate(iterations=4, slow_rank=None)
    dump = nr.flight_recorder_dump(recs, 0)
    dump["entries"][1]["time_created_ns"] = 1e300
    dump["entries"][2]["duration_ms"] = "slow"
    dump["pg_config"]["0"]["ranks"] = "[0, 1, 99999999]"
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(dump))
    with pytest.raises(ni.NcclError, match=r"pg_config\['0'\]: ranks '\[0, 1, 99999999\]' is not a list"):
        ni.load([path])
    dump["pg_config"]["0"]["ranks"] = "[0, 1]"
    path.write_bytes(pickle.dumps(dump))
    with pytest.raises(ni.NcclError, match=r"entry 1: field 'time_created_ns' must be at most .* "
                                           r"\(2 bad entries in all"):
        ni.load([path])
    big = tmp_path / f"nccl_trace_rank_{10**30}"
    big.write_bytes(pickle.dumps(nr.flight_recorder_dump(recs, 0)))
    with pytest.raises(ni.NcclError, match="in the file name is not below"):
        ni.load([big])


# ------------------------------------------------------------------ the last line of defence
def test_an_unforeseen_error_becomes_a_clear_one():
    @clear_errors(OpsError, "files")
    def run(args):
        raise args.boom

    class Args:
        files = ["a.csv", "b.csv"]

    for boom, said in [(TypeError("unhashable type: 'list'"), "a.csv, b.csv: cannot import: TypeError: "
                                                               "unhashable type: 'list'"),
                       (MemoryError(), "a.csv, b.csv: ran out of memory; lower --max-file-mb"),
                       (RecursionError(), "a.csv, b.csv: nested too deeply to read")]:
        Args.boom = boom
        with pytest.raises(OpsError, match=said.replace("(", r"\(")):
            run(Args)
    Args.boom = OpsError("its own error")
    with pytest.raises(OpsError, match="^its own error$"):
        run(Args)
