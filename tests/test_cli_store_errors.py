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
