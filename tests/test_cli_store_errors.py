"""Read-only commands refuse a store that does not exist instead of reading an empty one."""

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
    assert "[open] cs-20-r1379 compute straggler: ranks 1379 on gpu-node-00172" in out
    assert "Action: Drain and replace gpu-node-00172" in out and "GPU-hours lost so far" in out
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
