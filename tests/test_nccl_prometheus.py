"""NCCL Inspector's Prometheus output -> ``stage_latency`` -> the slow rank named.

The whole chain as clusters run it: ``.prom`` files written as the plugin writes them (16 ranks
on 2 nodes, rank 11 on node-b computing 3x slower from the middle of the run, one dump every
30 s of the job's time), two real node_exporters (Debian's prometheus-node-exporter 1.5)
serving them with their textfile collector, a real Prometheus scraping both, then
``rankscope import-nccl --prometheus URL`` into the real InfluxDB and ``rankscope analyze
--once --json``. Then the same files read directly, followed as they are rewritten, and
the files' and the API's bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.service.run_once import run_once
from rankscope.cli import main as cli_main
from rankscope.store import EmbeddedStore, Store
from tests import inspector_prom_files as ipf
from tests.alertmanager_server import wait_for
from tests.influx_server import free_port
from tests.node_exporter_server import NodeExporter, ScrapingPrometheus

#: Dumps written: the first half healthy, rank 11 slow in the second.
DUMPS = 12
EXEC = "nccl_collective_exec_time_microseconds"
RANKSCOPE = Path(sys.executable).with_name("rankscope")


@pytest.fixture(scope="module")
def run() -> ipf.Run:
    return ipf.simulate(duration_s=ipf.INTERVAL_S * (DUMPS + 2), onset_s=ipf.INTERVAL_S * (DUMPS // 2 + 1))


def host_dirs(root: Path) -> dict[str, Path]:
    dirs = {h: root / h for h in ipf.HOSTS}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def archived(run: ipf.Run, root: Path, dumps: int = DUMPS) -> Path:
    """Every dump's files kept, one folder per dump (as a cron job copying the folder would)."""
    for k in range(dumps):
        ipf.write_snapshot(run, host_dirs(root / f"dump-{k:03d}"), k)
    return root


def assert_names_rank_11(incidents: list[dict]) -> dict:
    assert [(i["class"], i["ranks"]) for i in incidents] == [("arrival_straggler", [ipf.SLOW_RANK])]
    inc = incidents[0]
    assert inc["hosts"] == ["node-b"]
    ev = json.loads(inc["evidence"]) if isinstance(inc["evidence"], str) else inc["evidence"]
    assert ev["summary"].startswith("From communication alone: rank 11 (node-b) arrives last.")
    return inc


def rankscope(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "RANKSCOPE_INFLUX_API": "v1"}
    return subprocess.run([str(RANKSCOPE), *args], capture_output=True, text=True, timeout=timeout, env=env)


# ------------------------------------------------------------------------------ the whole chain
def test_node_exporter_prometheus_import_analyze(run, influx_store, tmp_path):
    dirs = host_dirs(tmp_path / "textfiles")
    exporters = [NodeExporter(dirs[h], tmp_path / f"{h}.log").start() for h in ipf.HOSTS]
    (tmp_path / "prom").mkdir()
    prom = ScrapingPrometheus([e.address for e in exporters], tmp_path / "prom").start()
    follower = None
    try:
        follower = subprocess.Popen(   # --follow: polls the Prometheus while the job runs
            [str(RANKSCOPE), "import-nccl", "--prometheus", prom.url, "--since", "10m", "--follow", "--interval",
             "0.5", "--job", "followed", *ipf.LAYOUT, "--store", influx_store.url, "--bucket", influx_store.bucket],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "RANKSCOPE_INFLUX_API": "v1", "PYTHONFAULTHANDLER": "1"})
        written, early = 0, None
        for k in range(DUMPS):   # each dump scraped before the next overwrites it
            written += ipf.write_snapshot(run, dirs, k)
            wait_for(lambda n=written: n if _series(prom) == n else None, 20, f"Prometheus holding dump {k}",
                     prom.log_text)
            if k == DUMPS // 2:   # the dumps every rank has made are written while the job runs
                early = wait_for(lambda: _points(influx_store, "followed"), 30, "the follower's first points")
        assert "node_textfile_scrape_error 0" in exporters[1].metrics()
        out = rankscope("import-nccl", "--prometheus", prom.url, "--since", "10m", "--selector",
                        'slurm_job_id="4711"', "--job", "chain", *ipf.LAYOUT, "--store", influx_store.url,
                        "--bucket", influx_store.bucket)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"imported {16 * DUMPS} point(s): 16 rank(s)"), out.stdout
        assert f"snapshots: {DUMPS} per rank, every 30 s" in out.stdout
        points = influx_store.read_stage_latency("chain")
        assert len(points) == 16 * DUMPS and set(points["host"]) == {"node-a", "node-b"}
        assert set(points.loc[points["rank"] == 11, "host"]) == {"node-b"}
        out = rankscope("analyze", "--once", "--json", "--store", influx_store.url, "--bucket",
                        influx_store.bucket, "--job", "chain")
        assert out.returncode == 0, out.stderr
        inc = assert_names_rank_11(json.loads(out.stdout)["incidents"])
        assert inc["onset_iteration"] > points["iteration"].min()
        _follower_wrote_each_dump_once(follower, influx_store, early)
        _api_edges(prom, exporters[0], tmp_path)
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
        prom.stop()
        for e in exporters:
            e.stop()


def _points(store: Store, job: str) -> pd.DataFrame | None:
    points = store.read_stage_latency(job)
    return points if len(points) else None


def _series(prom: ScrapingPrometheus) -> int:
    """Exec-time series Prometheus holds (every collective sampled is a series of its own)."""
    result = prom.query(f"count(count_over_time({EXEC}[1h]))")
    return int(result[0]["value"][1]) if result else 0


def _follower_wrote_each_dump_once(follower: subprocess.Popen, influx_store: Store, early: pd.DataFrame) -> None:
    """The follower, stopped with Ctrl-C once every dump is in Prometheus, wrote each point once,
    each dump once every rank had dumped past it (``early``: what it had written half-way)."""
    time.sleep(1.5)
    follower.send_signal(signal.SIGINT)
    try:
        out, err = follower.communicate(timeout=60)
    except subprocess.TimeoutExpired:   # once seen on a loaded machine: say where it was
        follower.send_signal(signal.SIGABRT)   # PYTHONFAULTHANDLER: every thread's stack on stderr
        out, err = follower.communicate(timeout=15)
        raise AssertionError(f"the follower did not stop within 60 s of Ctrl-C; its output:\n{out[-1500:]}\n"
                             f"where it was:\n{err[-4000:]}") from None
    assert follower.returncode == 0, err
    assert out.startswith("wrote ") and out.rstrip().endswith(f"{16 * DUMPS} point(s) written"), out
    assert early is not None and len(early) < 16 * DUMPS
    points = influx_store.read_stage_latency("followed")
    assert len(points) == 16 * DUMPS and not points.duplicated(["rank", "iteration"]).any()


def _api_edges(prom: ScrapingPrometheus, exporter: NodeExporter, tmp_path: Path) -> None:
    """Answers over the limit split into shorter windows (the same points), and what the importer
    says of a bad selector, a server that is not Prometheus, an answer over the limit even for a
    second, no server, and a selector that matches nothing."""
    store = ["--job", "x", "--store", str(tmp_path / "x.db"), *ipf.LAYOUT]
    out = rankscope("import-nccl", "--prometheus", prom.url, "--since", "10m", "--max-response-mb", "0.2", *store)
    assert out.returncode == 0 and out.stdout.startswith(f"imported {16 * DUMPS} point(s)"), out.stderr
    out = rankscope("import-nccl", "--prometheus", prom.url, "--selector", 'slurm_job_id="4711', *store)
    assert out.returncode == 1 and f"{prom.url}: Prometheus answered 400: bad_data:" in out.stderr
    out = rankscope("import-nccl", "--prometheus", f"http://{exporter.address}", *store)
    assert out.returncode == 1 and f"http://{exporter.address}: the answer is not JSON, so not Prometheus" in out.stderr
    out = rankscope("import-nccl", "--prometheus", prom.url, "--since", "5m", "--max-response-mb", "0.001", *store)
    assert out.returncode == 1 and "is more than 0.001 MB even for" in out.stderr, out.stderr
    assert "raise --max-response-mb" in out.stderr
    out = rankscope("import-nccl", "--prometheus", f"http://127.0.0.1:{free_port()}", *store)
    assert out.returncode == 1 and "cannot reach Prometheus" in out.stderr and "Traceback" not in out.stderr
    out = rankscope("import-nccl", "--prometheus", prom.url, "--selector", 'slurm_job_id="0"', *store)
    assert out.returncode == 1 and f"no {EXEC} sample to import" in out.stderr


# ------------------------------------------------------------------------------ files read directly
def test_textfiles_kept_per_dump_name_the_slow_rank(run, tmp_path, embedded_store):
    root = archived(run, tmp_path / "kept")
    store = tmp_path / "s.db"
    assert cli_main(["import-nccl", str(root), "--job", "files", "--store", str(store), *ipf.LAYOUT]) == 0
    with EmbeddedStore(store) as s:
        points = s.read_stage_latency("files")
        incidents = run_once(s, "files")
    assert len(points) == 16 * DUMPS and not points.duplicated(["rank", "iteration"]).any()
    assert set(points.columns) >= {"reduce_scatter", "comm_other", "iteration_ms"}
    assert_names_rank_11(incidents)
    # iteration_ms from the anchor's coll_sn progress between dumps (the dumps' whole seconds)
    per_dump = points.groupby("iteration")["iteration_ms"].median().to_numpy()
    before, after = run.iteration_s
    assert np.allclose(per_dump[:DUMPS // 2], before * 1000, rtol=0.03)
    assert np.allclose(per_dump[-3:], after * 1000, rtol=0.03)


def test_one_dump_is_one_point_per_rank(run, tmp_path):
    dirs = host_dirs(tmp_path / "now")
    ipf.write_snapshot(run, dirs, 3)
    store = tmp_path / "s.db"
    assert cli_main(["import-nccl", str(tmp_path / "now"), "--job", "one", "--store", str(store), *ipf.LAYOUT]) == 0
    with EmbeddedStore(store) as s:
        points = s.read_stage_latency("one")
    assert len(points) == 16 and points["iteration"].nunique() == 1
    assert dict(zip(points["rank"], points["host"], strict=True)) == {r: ipf.host_of(r) for r in range(16)}
    assert "iteration_ms" not in points or points["iteration_ms"].isna().all()   # one dump: no rate


def test_bad_samples_are_refused_by_file_and_line_and_the_rest_imported(run, tmp_path, capsys):
    dirs = host_dirs(tmp_path / "bad")
    ipf.write_snapshot(run, dirs, 5)
    f3, f4, f5 = (ipf.file_of(dirs["node-a"], r) for r in (3, 4, 5))
    f3.write_text(f3.read_text().replace('rank="3",slurm_job="pretrain",slurm_job_id="4711",nranks="8"',
                                         'rank="99",slurm_job="pretrain",slurm_job_id="4711",nranks="8"'))
    f4.write_text(f4.read_text() + 'nccl_collective_exec_time_microseconds{comm_id="0x1" 12\n')
    f5.write_text(f5.read_text()[:-30])    # caught half written
    (dirs["node-a"] / "nccl_inspector_metrics_new-gpu.prom").write_text("")   # a process just started
    (dirs["node-b"] / "nccl_inspector_metrics_huge.prom").write_text("# padding\n" * 200_000)
    store = tmp_path / "s.db"
    rc = cli_main(["import-nccl", str(tmp_path / "bad"), "--job", "b", "--store", str(store), "--max-file-mb", "1",
                   *ipf.LAYOUT])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert f"refused: refused 1 of 31 sample(s) with bad labels or values (first: {f3}:6: " in err
    assert "label 'rank' is not a rank below 'nranks'" in err
    assert f"refused: {f4}:7: not a sample" in err
    assert "nccl_inspector_metrics_huge.prom: more than 1 MB of input" in err
    assert f"warning: {f5}: its last line (no newline yet) is being written; left out" in err
    assert "nccl_inspector_metrics_new-gpu.prom: no sample (what a process that has just started leaves)" in err
    with EmbeddedStore(store) as s:
        points = s.read_stage_latency("b")
    assert len(points) == 16   # rank 3 keeps its job-wide record; rank 5 its first lines
    assert points.loc[points["rank"] == 3, "comm_other"].isna().all()


def test_symlink_out_of_the_folder_is_refused(run, tmp_path, capsys):
    dirs = host_dirs(tmp_path / "in")
    ipf.write_snapshot(run, dirs, 0)
    (dirs["node-a"] / "nccl_inspector_metrics_x.prom").symlink_to("/etc/passwd")
    assert cli_main(["import-nccl", str(tmp_path / "in"), "--job", "s", "--store", str(tmp_path / "s.db")]) == 1
    assert "refused 1 symlink(s) pointing outside the folder" in capsys.readouterr().err


def test_follow_writes_each_dump_once_as_the_files_are_rewritten(run, tmp_path):
    dirs = host_dirs(tmp_path / "live")
    store = tmp_path / "s.db"
    rc: list[int] = []
    follower = threading.Thread(target=lambda: rc.append(cli_main(
        ["import-nccl", str(tmp_path / "live"), "--job", "f", "--store", str(store), "--follow",
         "--interval", "0.1", "--max-seconds", "9", *ipf.LAYOUT])))
    follower.start()
    early = None
    for k in range(6):
        ipf.write_snapshot(run, dirs, k)
        time.sleep(1.2)
        if k == 3:
            with EmbeddedStore(store) as s:
                early = s.read_stage_latency("f")
    follower.join(30)
    assert rc == [0]
    assert early is not None and 0 < len(early) < 16 * 6
    with EmbeddedStore(store) as s:
        points = s.read_stage_latency("f")
    assert len(points) == 16 * 6 and not points.duplicated(["rank", "iteration"]).any()


def test_text_exposition_format():
    from collector.nccl_import.prom_text import parse_sample

    assert parse_sample('m{a="x\\"y\\\\z\\nw",b="1",} 1.5e+06') == ("m", {"a": 'x"y\\z\nw', "b": "1"}, 1.5e6)
    assert parse_sample("m 12") == ("m", {}, 12.0)
    assert parse_sample('m{a="1"} +Inf 1700000000000')[2] == float("inf")
    assert np.isnan(parse_sample("m{} NaN")[2])
    for bad, why in [('m{a=1} 2', "bad label"), ('m{a="1"}', "not a sample"), ('m{a="1",a="2"} 3', "given twice"),
                     ("1m 2", "not a sample"), ("m 1_000", "not a sample")]:
        with pytest.raises(ValueError, match=why):
            parse_sample(bad)


def test_a_folder_of_logs_and_prom_files_asks_which(run, tmp_path, capsys):
    dirs = host_dirs(tmp_path / "mixed")
    ipf.write_snapshot(run, dirs, 0)
    (dirs["node-a"] / "node-a-pid1.log").write_text("")
    assert cli_main(["import-nccl", str(tmp_path / "mixed"), "--job", "m", "--store", str(tmp_path / "s.db")]) == 1
    assert "holds Inspector logs (*.log) and Prometheus files (*.prom): give --format" in capsys.readouterr().err
    assert cli_main(["import-nccl", str(tmp_path / "mixed"), "--job", "m", "--store", str(tmp_path / "s.db"),
                     "--format", "inspector-prom", *ipf.LAYOUT]) == 0
