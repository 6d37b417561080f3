"""``rankscope analyze --shard K/N``: the shards partition the jobs, by a hash every process agrees
on, and a bad spec is refused with a clear message (exit 2, no traceback).

The analysis of a shard runs on the real InfluxDB: ``analyze --once --shard K/3`` over six jobs
analyzes exactly the jobs whose hash mod 3 is K.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from analyzer.service.shards import SHARD_ENV, Shard, ShardSpecError, job_hash, shard_of
from rankscope import schema
from rankscope.cli import main
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario

#: Job names as a cluster has them: numbered runs, model names, user prefixes, restarts.
NAMES = ([f"job-{i:05d}" for i in range(4000)] + [f"llama-{s}b-pretrain-{i}" for s in (7, 13, 70) for i in range(1000)]
         + [f"user{i % 97}/sweep-{i}" for i in range(2000)] + [f"il-{i:04d}-restart-{i % 5}" for i in range(1000)])


def test_the_hash_is_prometheus_hashmod_pinned():
    """The last 8 bytes of the name's MD5, big-endian (what Prometheus' ``hashmod`` sums), pinned
    so that a change of algorithm cannot move every job to another replica unnoticed."""
    assert job_hash("il-0477") == 8774194593743831053
    assert job_hash("compute-slowdown") == 7589930742119315140
    for name in NAMES[::997]:
        assert job_hash(name) == int(hashlib.md5(name.encode()).hexdigest()[16:], 16)
    assert [shard_of("il-0477", n) for n in (1, 2, 3, 4, 16)] == [0, 1, 1, 1, 13]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 16])
def test_the_shards_partition_the_jobs_and_are_balanced(count):
    shards = [Shard(k, count) for k in range(count)]
    owners = {name: [s for s in shards if s.owns(name)] for name in NAMES}
    assert all(len(o) == 1 for o in owners.values())               # every job in exactly one shard
    picked = [name for s in shards for name in s.select(NAMES)]
    assert sorted(picked) == sorted(NAMES)                         # select(): the same partition
    sizes = Counter(o[0].index for o in owners.values())
    mean = len(NAMES) / count
    assert set(sizes) == set(range(count))
    assert max(abs(n - mean) for n in sizes.values()) <= 0.1 * mean, sizes   # within 10% of even


def test_every_process_puts_a_job_in_the_same_shard():
    """Python's str hash is salted per process; the shard must not be."""
    sample = NAMES[::250]
    code = ("import sys; from analyzer.service.shards import shard_of; "
            "print(' '.join(str(shard_of(j, 7)) for j in sys.argv[1:]))")
    seen = set()
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code, *sample], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60).stdout.split()
        seen.add(tuple(int(x) for x in out))
    assert seen == {tuple(shard_of(j, 7) for j in sample)}


@pytest.mark.parametrize("text,index,count", [("0/1", 0, 1), ("1/2", 1, 2), (" 3 / 4 ", 3, 4), ("15/16", 15, 16)])
def test_good_specs(text, index, count):
    shard = Shard.parse(text)
    assert (shard.index, shard.count, str(shard)) == (index, count, f"{index}/{count}")


@pytest.mark.parametrize("text,says", [
    ("3/2", "K must be in 0..1"), ("2/2", "the last of 2 is 1/2"), ("0/0", "must be 1 or more"),
    ("a/b", "expected K/N, two whole numbers"), ("1/2/3", "expected K/N"), ("-1/2", "expected K/N"),
    ("", "expected K/N"), ("1", "expected K/N"), ("1.0/2", "expected K/N"),
])
def test_bad_specs_name_the_value_and_the_rule(text, says):
    with pytest.raises(ShardSpecError) as err:
        Shard.parse(text)
    assert says in str(err.value) and repr(text).strip("'") in str(err.value)


@pytest.mark.parametrize("argv,env,says", [
    (["--shard", "3/2"], {}, "argument --shard: shard '3/2': K must be in 0..1"),
    (["--shard=0/0"], {}, "shard '0/0': N, the number of shards, must be 1 or more"),
    (["--shard", "a/b"], {}, "shard 'a/b': expected K/N"),
    ([], {SHARD_ENV: "$(SHARD_INDEX)/4"}, f"{SHARD_ENV}: shard '$(SHARD_INDEX)/4': expected K/N"),
    ([], {SHARD_ENV: "4/4"}, f"{SHARD_ENV}: shard '4/4': K must be in 0..3"),
    (["--shard", "0/2", "--job", "il-0477"], {}, "job 'il-0477' is in shard 1/2, not in 0/2"),
])
def test_the_command_refuses_a_bad_shard_with_exit_2_and_no_traceback(argv, env, says, tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    proc = subprocess.run([sys.executable, "-m", "rankscope.cli", "analyze", "--once", *argv,
                           "--store", str(tmp_path / "none.db")],
                          capture_output=True, text=True, env={**clean, **env}, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("rankscope analyze: error: ")


def _write_job(store, job: str, iterations: int = 12) -> None:
    sim = ClusterSimulator(Scenario.from_dict({
        "topology": {"tp": 1, "pp": 2, "dp": 8, "ep": 4, "gpus_per_node": 4},
        "run": {"job": job, "iterations": iterations, "seed": 5}}, name=job))
    for _ in range(iterations):
        res = sim.step()
        store.write_stage_latency(sim.frame(res, time_ms=1_760_000_000_000 + 30_000 * res.iteration))


def test_analyze_once_with_a_shard_analyzes_exactly_its_jobs(influx_store, capsys, monkeypatch):
    jobs = [f"fleet-{i}" for i in range(6)]
    for job in jobs:
        _write_job(influx_store, job)
    assert sorted({shard_of(j, 3) for j in jobs}) == [0, 1, 2]        # each shard has some
    for key in [k for k in os.environ if k.startswith("RANKSCOPE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("RANKSCOPE_INFLUX_API", "v1")
    seen: dict[int, set[str]] = {}
    argv = ["analyze", "--once", "--store", influx_store.url, "--bucket", influx_store.bucket]
    for k in range(3):
        if k == 2:   # the last one from the environment, as a StatefulSet gives it
            monkeypatch.setenv(SHARD_ENV, f"{k}/3")
        assert main(argv + ([] if k == 2 else ["--shard", f"{k}/3"])) == 0
        out = capsys.readouterr().out
        seen[k] = set(re.findall(r"^(\S+): analyzed 12 iteration\(s\)$", out, re.M))
        assert seen[k] == {j for j in jobs if shard_of(j, 3) == k}, out
    assert sorted(j for s in seen.values() for j in s) == sorted(jobs)   # all, each once
    for job in jobs:   # each analyzed by its shard's run only: one health point, of its last iteration
        health = influx_store.read(schema.JOB_HEALTH, job)
        assert len(health) == 1 and health["iteration"].tolist() == [11], job
