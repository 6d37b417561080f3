"""A real 4-process torch.distributed gloo job, its Flight Recorder dumped by torch itself with
timing off (PyTorch's default: no durations), imported with ``rankscope import-nccl`` and
analyzed: the rank that sleeps 4x before each all-reduce from iteration 15 on is named, with
its host, from who arrives last (tests/fr_gloo_job.py runs the job: ranks 0-1 on ``node-a``,
2-3 on ``node-b``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.service.run_once import run_once
from collector.untrusted.plain_unpickle import loads_plain
from rankscope.cli import main as cli_main
from rankscope.store import EmbeddedStore
from tests.torch_alone import alone

ROOT = Path(__file__).resolve().parents[1]
WORLD, ITERATIONS, SLOW_RANK, SLOW_FROM = 4, 40, 2, 15


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fr_gloo")
    with alone():
        p = subprocess.run([sys.executable, "-m", "tests.fr_gloo_job", str(folder), "--world", str(WORLD),
                            "--hosts", "2", "--iterations", str(ITERATIONS), "--slow-rank", str(SLOW_RANK),
                            "--slow-from", str(SLOW_FROM), "--step-ms", "20", "--factor", "4"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return folder


def test_torch_dumps_gloo_entries_without_durations(dumps):
    names = sorted(f.name for f in dumps.iterdir() if "nccl_trace_rank_" in f.name)
    assert names == ["node-a.nccl_trace_rank_0", "node-a.nccl_trace_rank_1",
                     "node-b.nccl_trace_rank_2", "node-b.nccl_trace_rank_3"]
    dump = loads_plain((dumps / names[0]).read_bytes(), names[0])   # plain data, as the importer reads it
    entries = dump["entries"]
    assert len(entries) == ITERATIONS and {e["profiling_name"] for e in entries} == {"gloo:all_reduce"}
    assert {e["state"] for e in entries} == {"scheduled"} and not any("duration_ms" in e for e in entries)


def test_import_and_analyze_name_the_slow_rank_and_its_host(dumps, tmp_path, capsys):
    store = tmp_path / "s.db"
    assert cli_main(["import-nccl", str(dumps), "--job", "gloo", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"imported {WORLD * ITERATIONS} point(s): {WORLD} rank(s)")
    assert f"timed by arrival (no duration_ms: each rank's wait for the last to arrive, from " \
           f"time_created_ns) in {ITERATIONS} collective(s), {ITERATIONS} of them across hosts" in out
    with EmbeddedStore(store) as s:
        pts = s.read_stage_latency("gloo")
        incidents = run_once(s, "gloo")
    late = pts[pts["iteration"] >= SLOW_FROM + 1].groupby("rank")["reduce_scatter"].median()
    # the slow rank waits for nobody; its host-mate waits 3 steps' difference, the other host 1 ms less
    assert late[SLOW_RANK] < 1 and late.drop(SLOW_RANK).min() > 40
    assert [(i["class"], i["ranks"], i["hosts"]) for i in incidents] == [("arrival_straggler", [SLOW_RANK], ["node-b"])]
    inc = incidents[0]
    assert SLOW_FROM <= inc["onset_iteration"] <= SLOW_FROM + 2
    # the title gives the lead, not a ratio to the culprit's own (near-zero) wait
    # timed by arrival every wait is near 0 before the onset: no ratio, the lead in ms instead
    assert inc["title"].endswith(f"rank {SLOW_RANK} on node-b in reduce_scatter "
                                 f"(last by {inc['evidence']['lead_ms']:.1f} ms)"), inc["title"]
    assert 40 < inc["evidence"]["lead_ms"] < 200 and inc["ratio"] == 1.0
    summary = inc["evidence"]["summary"]
    assert summary.startswith(f"From communication alone: rank {SLOW_RANK} (node-b) arrives last.")
    assert "The group spans hosts (node-a, node-b), whose clocks agree only within 1 ms" in summary
