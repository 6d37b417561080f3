"""The house's measured targets, as a check anyone can run.

    .venv/bin/python -m pytest tests/test_house.py

In the product packages (rankscope/, collector/, analyzer/, dashboards/, events/,
simulator/, actions/): no function is longer than 60 lines and no file longer than 400; analyzer/
has at most 10 entries at its top level; one module of analyzer/ reads ``stage_latency``;
every package folder's ``__init__.py`` has a docstring. Each failure lists every offender.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rankscope", "collector", "analyzer", "dashboards", "events", "simulator", "actions")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
MAX_ANALYZER_ENTRIES = 10
#: Store calls that read points: ``read_stage_latency`` always reads stage_latency; the others
#: do when they are given the measurement (``schema.STAGE_LATENCY`` or ``"stage_latency"``).
STAGE_LATENCY_READERS = {"read_stage_latency"}
MEASUREMENT_READERS = {"read", "next_times", "latest_times", "tag_values"}
SKIP_DIRS = {"__pycache__"}


def _files() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not SKIP_DIRS & set(path.relative_to(ROOT).parts):
                yield path


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """Every function and method with its qualified name (nested ones too)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _length(node: ast.AST) -> int:
    """Lines from ``def`` (decorators not counted) to the last line of the body."""
    return node.end_lineno - node.lineno + 1


def test_no_function_is_longer_than_60_lines() -> None:
    long = [(_length(node), f"{_rel(path)}:{node.lineno} {name}")
            for path in _files() for name, node in _functions(_tree(path))
            if _length(node) > MAX_FUNCTION_LINES]
    long.sort(reverse=True)
    if long:
        pytest.fail(f"{len(long)} function(s) longer than {MAX_FUNCTION_LINES} lines:\n"
                    + "\n".join(f"  {n} lines  {where}" for n, where in long), pytrace=False)


def test_no_file_is_longer_than_400_lines() -> None:
    long = sorted(((len(path.read_text().splitlines()), _rel(path)) for path in _files()), reverse=True)
    long = [(n, where) for n, where in long if n > MAX_FILE_LINES]
    if long:
        pytest.fail(f"{len(long)} file(s) longer than {MAX_FILE_LINES} lines:\n"
                    + "\n".join(f"  {n} lines  {where}" for n, where in long), pytrace=False)


def test_analyzer_has_at_most_10_entries_at_its_top_level() -> None:
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in (ROOT / "analyzer").iterdir()
                     if p.name not in SKIP_DIRS)
    if len(entries) > MAX_ANALYZER_ENTRIES:
        pytest.fail(f"analyzer/ has {len(entries)} entries at its top level (at most {MAX_ANALYZER_ENTRIES}):\n  "
                    + "\n  ".join(entries), pytrace=False)


def _names_stage_latency(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == "STAGE_LATENCY":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "STAGE_LATENCY":
            return True
        if isinstance(sub, ast.Constant) and sub.value == "stage_latency":
            return True
    return False


def stage_latency_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, method) of each store call in ``tree`` that reads stage_latency."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        args = [*node.args, *(k.value for k in node.keywords)]
        if name in STAGE_LATENCY_READERS or (
                name in MEASUREMENT_READERS and any(_names_stage_latency(a) for a in args)):
            found.append((node.lineno, name))
    return found


def test_stage_latency_reads_are_found() -> None:
    """The search below finds the calls it is meant to find (and no write)."""
    tree = ast.parse("store.next_times(schema.STAGE_LATENCY, job, c, n)\n"
                     "s.read_stage_latency(job)\n"
                     "s.latest_times(STAGE_LATENCY, job, 1)\n"
                     "s.read('stage_latency', job)\n"
                     "s.read(schema.INCIDENT, job)\n"
                     "s.write_measurement(schema.STAGE_LATENCY, f)\n")
    assert [name for _, name in stage_latency_reads(tree)] == [
        "next_times", "read_stage_latency", "latest_times", "read"]


def test_stage_latency_is_read_by_one_module_of_the_analyzer() -> None:
    readers = {}
    for path in sorted((ROOT / "analyzer").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        calls = stage_latency_reads(_tree(path))
        if calls:
            readers[_rel(path)] = calls
    if len(readers) != 1:
        pytest.fail(f"stage_latency is read by {len(readers)} modules of analyzer/ (one reader expected):\n"
                    + "\n".join(f"  {where}: " + ", ".join(f"line {line} {name}()" for line, name in sorted(calls))
                                for where, calls in readers.items()), pytrace=False)


def _package_dirs() -> list[Path]:
    dirs = set()
    for path in _files():
        dirs.add(path.parent)
    return sorted(dirs)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_folder_says_what_it_owns_in_its_init_docstring(package: str) -> None:
    missing = []
    for folder in _package_dirs():
        if folder.relative_to(ROOT).parts[0] != package:
            continue
        init = folder / "__init__.py"
        if not init.exists():
            missing.append(f"{_rel(folder)}/ (no __init__.py)")
        elif not (ast.get_docstring(_tree(init)) or "").strip():
            missing.append(f"{_rel(init)} (no docstring)")
    if missing:
        pytest.fail(f"{len(missing)} package folder(s) without a docstring:\n  " + "\n  ".join(missing),
                    pytrace=False)
