"""Read-only commands refuse a store that does not exist instead of reading an empty one."""

import json

import pytest

from rankscope.cli import main


@pytest.mark.parametrize("argv", [
    ["analyze", "--once"],
    ["analyze", "--once", "--json"],
    ["store"],
    ["report", "--out", "REPORT"],
])
def test_a_mistyped_store_path_is_an_error(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANKSCOPE_STORE", raising=False)
    missing = tmp_path / "no" / "such" / "store.db"
    argv = [a.replace("REPORT", str(tmp_path / "report")) for a in argv]
    code = main([*argv, "--store", str(missing)])
    err = capsys.readouterr().err
    assert code != 0
    assert f"no store at {missing}" in err
    assert not missing.exists() and not missing.parent.exists()   # nothing was created


def test_writers_still_create_their_store(tmp_path, monkeypatch):
    monkeypatch.delenv("RANKSCOPE_STORE", raising=False)
    path = tmp_path / "new" / "store.db"
    assert main(["simulate", "healthy", "--iterations", "1", "--store", str(path), "-q",
                 "--truth", str(tmp_path / "t.json")]) == 0
    assert path.exists()


def test_a_url_that_is_not_http_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANKSCOPE_STORE", raising=False)
    assert main(["event", "add", "--name", "port down", "--host", "h", "--store", "htp://127.0.0.1:8086"]) != 0
    assert "not http:// or https://" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())                              # no file named like the URL


def _store_with_a_job(tmp_path):
    path = tmp_path / "s.db"
    assert main(["simulate", "compute-slowdown", "--iterations", "30", "--store", str(path), "-q",
                 "--truth", str(tmp_path / "t.json")]) == 0
    return path


def test_analyze_once_briefs_the_operator_and_refuses_unknown_jobs(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANKSCOPE_STORE", raising=False)
    path = _store_with_a_job(tmp_path)
    capsys.readouterr()
    assert main(["analyze", "--once", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "[open] cs-20-r1379 compute straggler: rank 1379 on gpu-node-00172" in out
    assert "Action: Drain and replace gpu-node-00172" in out and "GPU-hours lost so far" in out
    assert main(["analyze", "--once", "--json", "--store", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out)["incidents"][0]["evidence"]["summary"]
    assert summary.startswith("Rank 1379 (gpu-node-00172) takes ")          # one rank: singular
    assert main(["analyze", "--once", "--job", "nosuchjob", "--store", str(path)]) != 0
    err = capsys.readouterr().err
    assert "no job 'nosuchjob'" in err and "jobs there: compute-slowdown" in err
    assert main(["analyze", "--once", "--bucket", "typo", "--store", str(path)]) == 1
    assert "no stage_latency data" in capsys.readouterr().err
    assert main(["analyze", "--json", "--store", str(path)]) != 0          # --json needs --once
    assert main(["analyze", "--once", "--every", "5s", "--store", str(path)]) != 0


def test_event_add_names_the_store_and_warns_of_an_unknown_host(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANKSCOPE_STORE", raising=False)
    path = _store_with_a_job(tmp_path)
    capsys.readouterr()
    # the same machine in monitoring's spelling: no warning
    assert main(["event", "add", "--name", "port down", "--host", "GPU-NODE-00172.dc1.example.com",
                 "--store", str(path)]) == 0
    captured = capsys.readouterr()
    assert str(path) in captured.out and "warning" not in captured.err
    assert main(["event", "add", "--name", "port down", "--host", "gpu-node-99999", "--store", str(path)]) == 0
    captured = capsys.readouterr()
    assert "no job has reported host 'gpu-node-99999'" in captured.err and "gpu-node-0" in captured.err
    assert main(["event", "add", "--name", "port down", "--host", "h", "--store",
                 str(tmp_path / "other.db")]) != 0                   # no store there: refused, not made
    assert not (tmp_path / "other.db").exists()


def test_rollup_and_report_refuse_unknown_jobs_and_impossible_arguments(tmp_path, capsys, monkeypatch):
    """A typo in a job name, a range that ends before it starts, a report folder that is a file:
    each refused with what was wrong, not read as "nothing there"."""
    monkeypatch.delenv("RANKSCOPE_STORE", raising=False)
    path = _store_with_a_job(tmp_path)
    store = ["--store", str(path)]
    capsys.readouterr()
    assert main(["rollup", "--since", "7d", "--job", "nosuchjob", *store]) == 1
    assert "no job 'nosuchjob'" in (err := capsys.readouterr().err) and "jobs there: compute-slowdown" in err
    assert main(["rollup", "--since", "1h", "--until", "2h", *store]) == 1
    assert "--until 2h" in (err := capsys.readouterr().err) and "is before --since 1h" in err
    assert main(["report", "--job", "nosuchjob", "--out", str(tmp_path / "r"), *store]) == 1
    assert "no job 'nosuchjob'" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    assert main(["report", "--out", str(tmp_path / "afile"), *store]) == 1
    assert "--out" in (err := capsys.readouterr().err) and "is a file" in err


def test_the_demo_names_its_own_default_store(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default .rankscope/demo.db" in text and "default .rankscope/store.db" not in text


def test_a_missing_store_points_at_the_stores_beside_it(tmp_path, capsys, monkeypatch):
    """After `make demo` the data is in .rankscope/demo.db; a command run without --store is told."""
    monkeypatch.delenv("RANKSCOPE_STORE", raising=False)
    path = _store_with_a_job(tmp_path)
    capsys.readouterr()
    assert main(["store", "--store", str(tmp_path / "store.db")]) == 1
    assert f"no store at {tmp_path / 'store.db'} (stores there: {path})" in capsys.readouterr().err
