"""The simulator's truth file stays in its folder whatever the job name: ``--job ../../x``
once wrote two folders up. The name is kept as the job's name in the store; only the file's
name is made safe (see :func:`simulator.truth.truth_file_name`)."""

from __future__ import annotations

import pytest

from rankscope import cli
from rankscope.store import EmbeddedStore
from simulator.simulate import default_truth_path
from simulator.truth import Truth, truth_file_name

SCENARIO = """
[topology]
dp = 4
gpus_per_node = 2
[run]
job = "paths"
iterations = 2
"""


@pytest.mark.parametrize("job", ["../../x", "/etc/passwd", "..", ".", "a/../../b", "..\\..\\x",
                                 ".hidden", "two words", "x" * 300, "ünïcode/../y", "/"])
def test_a_job_name_never_leads_the_truth_file_out_of_its_folder(job, tmp_path):
    name = truth_file_name(job)
    assert "/" not in name and "\\" not in name and not name.startswith(".")
    assert name.endswith(".truth.json") and len(name) <= 120
    folder = tmp_path / "store"
    assert (folder / name).resolve().parent == folder.resolve()


def test_plain_names_are_kept_and_made_ones_stay_apart():
    assert truth_file_name("il-0477") == "il-0477.truth.json"
    assert truth_file_name("run_7.b") == "run_7.b.truth.json"
    assert truth_file_name("a/b") != truth_file_name("a_b") and truth_file_name("a/b") != truth_file_name("a:b")


def test_simulate_with_job_dot_dot_writes_its_truth_in_the_store_folder(tmp_path, monkeypatch, capsys):
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    scenario = tmp_path / "s.toml"
    scenario.write_text(SCENARIO)
    monkeypatch.chdir(deep)
    store = deep / "store.db"
    assert cli.main(["simulate", str(scenario), "--store", str(store), "--job", "../../x", "-q"]) == 0
    [truth_file] = deep.glob("*.truth.json")
    assert truth_file.name == truth_file_name("../../x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "s.toml"]   # nothing two folders up
    assert not (tmp_path / "x.truth.json").exists() and not (deep.parent / "x.truth.json").exists()
    assert f"ground truth: {truth_file}" in capsys.readouterr().out
    assert Truth.read(truth_file).job == "../../x"                          # the name is kept
    with EmbeddedStore(store) as s:
        assert len(s.read_stage_latency("../../x")) == 2 * 4


def test_the_default_for_a_remote_store_is_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    class Remote:
        pass
    assert default_truth_path(Remote(), "../../x").parent == tmp_path
