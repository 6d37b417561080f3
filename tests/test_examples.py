"""The runnable examples in the modules' docstrings run and say what they show.

Detectors, scorers and core modules carry a small example in their docstring (the
river style); an example that no longer runs misleads the next reader more than
none, so every one is run here with :mod:`doctest`.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rankscope", "collector", "analyzer", "dashboards", "events", "simulator", "evaluation")
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if ">>> " in p.read_text(encoding="utf-8"))


def test_examples_are_found() -> None:
    assert {"rankscope.hostnames", "analyzer.diagnosis.event_verdicts"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_module_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has '>>> ' but no example doctest can run"
    assert result.failed == 0, f"{result.failed} example(s) of {name} fail"
