"""Every benchmark module imports against the current tree.

`make bench` is not run by CI (it takes the better part of an hour), so a module
left pointing at a moved or removed name would only be found by the next person
who runs it. Importing each one is cheap and catches exactly that; the optional
peer packages (ruptures, river, HTA, nvidia-resiliency-ext) are imported inside
the functions that use them, so CI needs none of them here.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

MODULES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "benchmarks").glob("bench_*.py"))


def test_there_are_benchmarks() -> None:
    assert {"bench_analyzer", "bench_dashboards", "bench_simulator", "bench_soak"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_benchmark_module_imports(name: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    assert callable(getattr(module, "run", None)), f"benchmarks/{name}.py has no run(ctx)"


def test_the_dashboards_benchmark_generates_every_default_stage() -> None:
    """The 6-hour wall's points (tests/il0477_store.py, outside the pipeline) cover the schema's
    stage set: a stage added to it must get a healthy level there too."""
    import numpy as np

    from rankscope import schema
    from tests.il0477_store import ONSET, TOPOLOGY, stage_cube

    values, it_ms = stage_cube(np.random.default_rng(0), np.array([ONSET - 1, ONSET]))
    assert values.shape == (2, TOPOLOGY.world, len(schema.DEFAULT_STAGES))
    assert np.isfinite(values).all() and (values > 0).all() and it_ms.shape == (2, TOPOLOGY.world)
