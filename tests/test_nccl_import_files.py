"""``rankscope import-nccl DIR`` keeps what is good: files still being written are skipped with
a warning, a file that cannot be read is refused by name and the rest imported, and the exit
status says whether anything was refused (0 all imported, 3 some refused, 1 nothing)."""

from __future__ import annotations

import json
import pickle

import pytest

from collector import nccl_import as ni
from rankscope.cli import main as cli_main
from rankscope.store import EmbeddedStore
from tests import nccl_records as nr

LAYOUT = ["--pp", "2", "--dp", "4", "--gpus-per-node", "4"]


@pytest.fixture(scope="module")
def recs():
    return nr.simulate(iterations=6, slow_rank=None)


def run(folder, tmp_path, capsys, *more) -> tuple[int, str, str, int]:
    """The command's exit status, stdout, stderr and the points stored."""
    store = tmp_path / "s.db"
    rc = cli_main(["import-nccl", str(folder), "--job", "d", "--store", str(store), *LAYOUT, *more])
    cap = capsys.readouterr()
    n = 0
    if store.exists():
        with EmbeddedStore(store) as s:
            n = len(s.read_stage_latency("d"))
    return rc, cap.out, cap.err, n


def test_empty_and_half_written_logs_are_skipped_with_a_warning(recs, tmp_path, capsys):
    folder = tmp_path / "insp"
    paths = nr.inspector_files(recs, folder)
    (folder / "gpu-node-002-pid2000.log").write_text("")                       # a process just started
    (folder / "gpu-node-002-pid2001.log").write_text('{"header": {"id": "0x')  # its first line half written
    with open(paths[3], "a") as fh:                                               # rank 3 writing a line
        fh.write(nr.inspector_line(recs[0])[:50])
    rc, out, err, n = run(folder, tmp_path, capsys)
    assert rc == 0 and n == 48 and out.startswith("imported 48 point(s)")
    assert f"warning: {folder / 'gpu-node-002-pid2000.log'}: empty (what a process that has just started " \
           f"leaves); skipped" in err
    assert f"warning: {folder / 'gpu-node-002-pid2001.log'}: no complete record yet" in err
    assert f"warning: {paths[3]}: its last line (50 bytes, no newline yet) is being written; left out" in err
    assert "refused" not in err


def test_dumps_cut_short_or_empty_are_skipped(recs, tmp_path, capsys):
    folder = tmp_path / "fr"
    paths = nr.flight_recorder_files(recs, folder)
    data = paths[7].read_bytes()
    paths[7].write_bytes(data[: len(data) // 2])                        # rank 7 still writing its pickle
    (folder / "nccl_trace_rank_8").write_text(json.dumps(nr.flight_recorder_dump(recs, 0))[:300])  # JSON
    (folder / "nccl_trace_rank_9").write_bytes(b"")
    rc, out, err, n = run(folder, tmp_path, capsys)
    assert rc == 0 and n == 6 * 7   # the seven complete dumps, timed by their durations
    assert "timed by duration_ms" in out
    assert f"warning: {paths[7]}: cut short (UnpicklingError: pickle data was truncated): a dump still " \
           f"being written; skipped" in err
    assert f"warning: {folder / 'nccl_trace_rank_8'}: cut short (JSONDecodeError" in err
    assert f"warning: {folder / 'nccl_trace_rank_9'}: empty (a dump still being written); skipped" in err


def test_a_file_that_cannot_be_read_is_named_and_the_rest_imported(recs, tmp_path, capsys):
    folder = tmp_path / "insp"
    paths = nr.inspector_files(recs, folder)
    lines = paths[7].read_text().splitlines()
    paths[7].write_text("\n".join(lines[:3] + ["{not json"] + lines[4:]) + "\n")   # a bad record
    big = folder / "huge-pid9.log"
    with open(big, "wb") as fh:                                                      # over --max-file-mb
        fh.write(b"{")
        fh.truncate(3 << 20)
    rc, out, err, n = run(folder, tmp_path, capsys, "--max-file-mb", "2")
    assert rc == 3 and n == 6 * 7 and out.startswith("imported 42 point(s)")
    assert f"refused: {paths[7]}:4: not a JSON record" in err
    assert f"refused: {big}: more than 2 MB of input" in err
    assert "2 file(s) refused (named above); the others imported" in err
    with EmbeddedStore(tmp_path / "s.db") as s:
        assert set(s.read_stage_latency("d")["rank"]) == set(range(7))   # the last rank's file refused
    # the library's strict form raises on the first, counting the others
    with pytest.raises(ni.NcclError, match=r"pid1007.log:4: not a JSON record .*\(and 1 more file\(s\) refused\)"):
        ni.load([folder], limit=ni.parse.FileLimit.mb(2))


def test_a_dump_that_cannot_be_read_is_named(recs, tmp_path, capsys):
    folder = tmp_path / "fr"
    nr.flight_recorder_files(recs, folder)
    (folder / "nccl_trace_rank_9").write_bytes(b"\x80garbage")
    dump = nr.flight_recorder_dump(recs, 0)
    dump["entries"][2]["time_created_ns"] = -5
    (folder / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump))
    rc, out, err, n = run(folder, tmp_path, capsys)
    assert rc == 3 and n == 6 * 7
    assert f"refused: {folder / 'nccl_trace_rank_9'}: not a Flight Recorder dump (pickle or JSON)" in err
    assert f"refused: {folder / 'nccl_trace_rank_0'}: entry 2: field 'time_created_ns' must be a " \
           f"non-negative number, got -5" in err


def test_nothing_to_import_is_an_error_naming_every_file(tmp_path, capsys):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "a-pid1.log").write_text("")
    (folder / "b-pid2.log").write_text("{not json\n")
    rc, out, err, n = run(folder, tmp_path, capsys)
    assert rc == 1 and n == 0 and out == ""
    assert "nothing to import: 1 file(s) refused, 1 skipped: " in err
    assert f"{folder / 'b-pid2.log'}:1: not a JSON record" in err and f"{folder / 'a-pid1.log'}: empty" in err


def test_the_help_documents_the_exit_status(capsys):
    with pytest.raises(SystemExit):
        cli_main(["import-nccl", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 every file imported (skipped ones warned about); 3 points written, but some " \
           "file(s) refused; 1 nothing imported (or the import failed); 2 bad arguments." in text
