"""Files from the cluster are data, never code, and never unbounded (issue 29, item 1).

A Flight Recorder dump crafted to run code on unpickling is refused by name and runs nothing;
a gzip bomb and a file larger than ``--max-file-mb`` are refused quickly with bounded memory,
naming the file and the flag; a symlink out of a given folder is refused by name.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shlex
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from collector import nccl_import as ni
from collector.kineto import TraceError, load_trace
from collector.nccl_cli import Follower
from collector.untrusted.bounded_read import FileLimit, read_bounded
from collector.untrusted.folder_files import files_in
from collector.untrusted.plain_unpickle import RefusedPickle, loads_plain
from rankscope.cli import main as cli_main
from tests import nccl_records as nr

MB = 1 << 20
#: Runs ``rankscope ARGS...`` in a fresh interpreter and reports its peak memory on stderr.
_PEAK = textwrap.dedent("""
    import resource, sys
    from rankscope.cli import main
    try:
        rc = main(sys.argv[1:])
    finally:
        print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
    sys.exit(rc)
""")


def peak_run(*args: object) -> tuple[int, str, float, float]:
    """``(exit status, stderr, peak memory in MB, seconds)`` of ``rankscope ARGS`` in a subprocess."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", _PEAK, *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    seconds = time.monotonic() - t0
    peak = [ln for ln in p.stderr.splitlines() if ln.startswith("PEAK_KB")]
    assert peak, p.stderr
    return p.returncode, p.stderr, int(peak[-1].split()[1]) / 1024, seconds


def gzip_bomb(path: Path, mib: int, head: bytes = b"", fill: bytes = b"\0") -> Path:
    """``mib`` MiB after decompression in a file of about ``mib`` KB: gzip members of 1 MiB each."""
    member = gzip.compress(fill * MB, compresslevel=9)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(head + fill * (MB - len(head))))
        for _ in range(mib - 1):
            fh.write(member)
    return path


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` zero bytes that takes no space on disk."""
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


# ------------------------------------------------------------------ a dump never runs code
class _Touch:
    """Unpickled by ``pickle.loads``, runs ``touch PATH``."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.path)}",))


class _Open(_Touch):
    """Unpickled by ``pickle.loads``, creates PATH."""

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def recs():
    return nr.simulate(iterations=6, slow_rank=None)


def crafted_dump(recs, gadget, target: Path) -> bytes:
    dump = nr.flight_recorder_dump(recs, 0)
    dump["entries"][2]["frames"] = [gadget(target)]
    return pickle.dumps(dump)


def test_the_crafted_dump_would_run_code_under_pickle_loads(recs, tmp_path):
    target = tmp_path / "pwned"
    pickle.loads(crafted_dump(recs, _Touch, target))  # noqa: S301 - proving the gadget works
    assert target.exists()


@pytest.mark.parametrize("gadget, name", [(_Touch, "posix.system"), (_Open, "io.open")])
@pytest.mark.parametrize("how", ["--format flight-recorder", "auto, by name", "auto, by content", "directory"])
def test_a_crafted_dump_is_refused_by_name_and_runs_nothing(recs, tmp_path, capsys, gadget, name, how):
    target = tmp_path / "pwned"
    folder = tmp_path / "dumps"
    folder.mkdir()
    dump = folder / ("rank_dump_0" if how == "auto, by content" else "nccl_trace_rank_0")
    dump.write_bytes(crafted_dump(recs, gadget, target))
    fmt = ["--format", "flight-recorder"] if how.startswith("--format") else []
    given = folder if how == "directory" else dump
    rc = cli_main(["import-nccl", str(given), "--job", "x", "--store", str(tmp_path / "s.db"), *fmt])
    err = capsys.readouterr().err
    assert rc == 1 and not target.exists()
    assert f"refused to unpickle '{name}' in {dump}: Flight Recorder dumps hold plain data only" in err
    assert "Traceback" not in err


def test_plain_data_and_numpy_numbers_load_anything_else_is_refused():
    data = {"a": [1, 2.5, None, True, "x", b"y", (3, 4)], "s": {1, 2}, "f": frozenset({3}),
            "np": [np.float64(1.5), np.int64(-3), np.bool_(True), np.uint8(7), np.float32(0.25)]}
    want = {**data, "np": [1.5, -3, True, 7, 0.25]}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        got = loads_plain(pickle.dumps(data, protocol=protocol), "d")
        assert got == want and all(type(v) in (float, int, bool) for v in got["np"])
    for bad, named in [(np.array([1, 2]), "_reconstruct"), (np.str_("a"), "numpy.dtype('U1')"),
                       (np.complex128(1j), "numpy.dtype('c16')"), (print, "builtins.print"),
                       (bytearray(b"x"), "builtins.bytearray")]:
        with pytest.raises(RefusedPickle) as refused:
            loads_plain(pickle.dumps(bad), "d")
        assert str(refused.value).startswith("refused to unpickle ") and named in str(refused.value)


_REAL_DUMP = textwrap.dedent("""
    import os, sys
    os.environ.update(TORCH_FR_BUFFER_SIZE="64", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    import torch, torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
        dist.all_gather([torch.zeros(4)], t)
    dist.barrier()
    open(sys.argv[1], "wb").write(_dump_fr_trace())
    dist.destroy_process_group()
""")


def test_a_real_torch_flight_recorder_dump_is_plain_data(tmp_path):
    """torch's own dump (a gloo run: the CPU build has no NCCL) names no global."""
    pytest.importorskip("torch")
    path = tmp_path / "nccl_trace_rank_0"
    port = str(20000 + os.getpid() % 20000)
    p = subprocess.run([sys.executable, "-c", _REAL_DUMP, str(path), port], capture_output=True, text=True,
                       timeout=180)
    if p.returncode != 0 and "_dump_fr_trace" in p.stderr:
        pytest.skip("this torch build has no Flight Recorder dump")
    assert p.returncode == 0, p.stderr[-2000:]
    data = path.read_bytes()
    dump = loads_plain(data, str(path))
    assert dump == pickle.loads(data) and len(dump["entries"]) >= 6  # noqa: S301 - torch's own file
    assert {"version", "pg_config", "entries"} <= set(dump)
    # gloo records no duration: every entry is read, with its rank's arrival to time it by
    rows = ni.read_flight_recorder(path)
    assert len(rows) == len(dump["entries"]) and rows["ms"].isna().all() and rows["start_us"].notna().all()


# ------------------------------------------------------------------ reads are bounded
def test_a_gzip_bomb_is_refused_quickly_with_bounded_memory(tmp_path):
    """1 GiB of zeros in a 1 MB file (it took 2.2 GB): refused at its first bytes."""
    tiny = tmp_path / "rank0.json"
    tiny.write_text("nope")
    rc, err, base_mb, _ = peak_run("import-trace", tiny, "--job", "x", "--store", tmp_path / "s.db")
    assert rc == 1 and "not a JSON trace" in err
    bomb = gzip_bomb(tmp_path / "rank0.pt.trace.json.gz", 1024)
    assert bomb.stat().st_size < 2 * MB
    rc, err, peak_mb, seconds = peak_run("import-trace", bomb, "--job", "x", "--store", tmp_path / "s.db")
    assert rc == 1 and f"{bomb} is not a JSON trace" in err and "Traceback" not in err
    assert peak_mb < base_mb + 64 and seconds < 60, (peak_mb, base_mb, seconds)


def test_a_json_bomb_over_the_limit_is_refused_naming_the_file_and_the_flag(tmp_path):
    tiny = tmp_path / "rank0.json"
    tiny.write_text("nope")
    _, _, base_mb, _ = peak_run("import-trace", tiny, "--job", "x", "--store", tmp_path / "s.db")
    bomb = gzip_bomb(tmp_path / "rank0.json.gz", 256, head=b'{"traceEvents": [', fill=b" ")
    rc, err, peak_mb, _ = peak_run("import-trace", bomb, "--job", "x", "--store", tmp_path / "s.db",
                                   "--max-file-mb", "8")
    assert rc == 1 and "Traceback" not in err
    assert f"{bomb}: more than 8 MB of input (counted after decompression)" in err and "--max-file-mb" in err
    assert peak_mb < base_mb + 64, (peak_mb, base_mb)


def test_the_limit_streams_and_the_flag_raises_it(tmp_path):
    bomb = gzip_bomb(tmp_path / "rank0.json.gz", 16, head=b'{"traceEvents": [', fill=b" ")
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="more than 4 MB of input.*--max-file-mb"):
            load_trace(bomb, FileLimit.mb(4))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * MB, peak / MB
    with pytest.raises(TraceError, match="not a JSON trace: JSONDecodeError"):   # read whole, then parsed
        load_trace(bomb, FileLimit.mb(32))
    with pytest.raises(ValueError, match="--max-file-mb must be a positive number"):
        FileLimit.mb(float("nan"))


@pytest.mark.parametrize("command, name, more", [
    ("import-trace", "rank0.json", []), ("import-ops", "ops.csv", []),
    ("import-nccl", "h-pid1.log", ["--format", "inspector"]), ("import-nccl", "nccl_trace_rank_0", [])])
def test_a_file_over_the_limit_is_refused_at_once(tmp_path, capsys, command, name, more):
    """A 2 GiB file (it took 2.2-2.75 GB): refused from its size, before a byte is read."""
    big = sparse(tmp_path / name, 2 << 30)
    t0 = time.monotonic()
    rc = cli_main([command, str(big), "--job", "x", "--store", str(tmp_path / "s.db"), *more])
    err = capsys.readouterr().err
    assert rc == 1 and time.monotonic() - t0 < 10
    assert f"{big}: more than 1024 MB of input" in err and "--max-file-mb" in err


def test_a_parquet_bomb_is_refused_from_its_footer(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    import pandas as pd

    n = 600_000   # 7 columns x 8 bytes: 32 MB unpacked, from a file of a few KB
    cols = {c: np.zeros(n, np.int64) for c in ("rank", "dp_rank", "stage", "step")}
    path = tmp_path / "ops.parquet"
    pd.DataFrame({**cols, "optype": "gc", "start_ts": 0.0, "duration": 0.0}).to_parquet(path)
    assert path.stat().st_size < MB
    rc = cli_main(["import-ops", str(path), "--job", "x", "--store", str(tmp_path / "s.db"), "--max-file-mb", "16"])
    err = capsys.readouterr().err
    assert rc == 1 and f"{path}: more than 16 MB of input" in err and "(600000 rows, about 32 MB unpacked)" in err


def test_a_growing_file_and_a_device_are_bounded_too(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        read_bounded("/dev/zero", FileLimit.mb(1))
    log = tmp_path / "h-pid1.log"
    log.write_bytes(b"x" * (3 * MB))
    with pytest.raises(ni.NcclError, match="more than 2 MB"):
        ni.read_inspector(log, limit=FileLimit.mb(2))
    # --follow reads what a log grew by: 1 MB from byte 2 MB is within the limit (no line yet)
    assert ni.read_inspector(log, 7, 2 * MB, FileLimit.mb(2)) == ([], 7, 2 * MB)


# ------------------------------------------------------------------ symlinks stay in their folder
def test_import_nccl_refuses_symlinks_out_of_the_folder_by_name(recs, tmp_path, capsys):
    folder = tmp_path / "insp"
    nr.inspector_files(recs, folder)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.log").write_text(nr.inspector_line(recs[0]) + "\n")
    (folder / "evil.log").symlink_to(outside / "secret.log")
    (folder / "nccl_trace_rank_9").symlink_to("/etc/hostname")
    rc = cli_main(["import-nccl", str(folder), "--job", "x", "--store", str(tmp_path / "s.db")])
    err = capsys.readouterr().err
    assert rc == 1 and "refused 2 symlink(s) pointing outside the folder" in err
    assert f"{folder / 'evil.log'} -> {outside / 'secret.log'}" in err
    assert f"{folder / 'nccl_trace_rank_9'} -> /etc/hostname" in err
    with pytest.raises(ni.NcclError, match="evil.log -> "):   # --follow lists its folders the same way
        Follower([str(folder)]).files()
    # the user's own choice: a file named on the command line is read wherever it lies
    assert ni.expand([folder / "evil.log"]) == [folder / "evil.log"]


def test_symlinks_inside_the_folder_are_read_and_folder_links_not_followed(tmp_path):
    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.log").write_text("x\n")
    (folder / "sub" / "b.log").symlink_to(folder / "a.log")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "c.log").write_text("x\n")
    (folder / "linked").symlink_to(tmp_path / "out", target_is_directory=True)
    (folder / "loop.log").symlink_to(folder / "loop.log")
    with pytest.raises(ValueError, match="loop.log -> .a symlink loop."):
        files_in(folder, lambda f: f.suffix == ".log")
    (folder / "loop.log").unlink()
    assert files_in(folder, lambda f: f.suffix == ".log") == [folder / "a.log", folder / "sub" / "b.log"]


def test_the_inspector_reader_streams_complete_lines_only(recs, tmp_path):
    log = tmp_path / "h-pid1000.log"
    lines = [nr.inspector_line(r) for r in recs if r["rank"] == 0][:3]
    log.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:20])
    got, line, offset = ni.read_inspector(log)
    assert [g["line"] for g in got] == [1, 2] and line == 3
    assert offset == len(lines[0]) + len(lines[1]) + 2
    with open(log, "a") as fh:
        fh.write(lines[2][20:] + "\n")
    got, line, offset = ni.read_inspector(log, line, offset)
    assert [g["line"] for g in got] == [3] and offset == log.stat().st_size
    assert json.loads(lines[2])["coll_perf"]["coll_sn"] == got[0]["sn"]
