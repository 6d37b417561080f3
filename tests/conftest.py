"""Shared fixtures: a real InfluxDB server for the session, a fresh database per test, and the
big datasets, each built once per test run and read by every test that needs it:

- ``il0477_incident``: IL-0477 at full scale (12,960 ranks, 40 iterations) simulated into the
  real InfluxDB and analyzed once (:mod:`tests.il0477_store`): the analyzer's acceptance, the
  simulator's checks at full scale, the dashboard queries and the report read it.
- ``compute_slowdown_influx``: the ``compute-slowdown`` built-in (2,048 ranks, 40 iterations)
  simulated into the real InfluxDB, not yet analyzed: the built-in's diagnosis, the idempotent
  rewrite and ``analyze --once --json`` analyze it (the analyzer's writes are idempotent, so
  each sees what a first analysis would).

Run in parallel (``make test``: ``pytest -n 2 --dist loadfile``), the files that read one of
these datasets run on one worker, so that each is still built once; every other test file is
kept on one worker too (its module fixtures are built once and its tests run in order).
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path

import pytest

from rankscope.store import EmbeddedStore, InfluxStore
from tests.influx_server import InfluxServer, external_url

#: The datasets built once per run: the tests that read one run on one worker (in parallel).
SHARED_DATASETS = ("il0477_incident", "compute_slowdown_influx")
#: Start of the compute-slowdown data (any fixed time: the analysis does not depend on it).
COMPUTE_SLOWDOWN_START_MS = 1_750_000_000_000


@functools.cache
def _work_unit(root: Path, path: str) -> str:
    """The test file ``path``, or one unit for every file that reads a shared dataset."""
    try:
        text = (root / path).read_text()
    except OSError:
        return path
    return "tests reading shared datasets" if any(n in text for n in SHARED_DATASETS) else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n N --dist loadfile`` (``make test``): each test file on one worker, and every
    file that reads a shared dataset on the same one, so that each dataset is built once.

    (xdist's own ``loadgroup`` cannot be used: it renames test ids in a way pytest 9 ignores.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    root = Path(str(config.rootpath))

    class DatasetScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(root, nodeid.split("::", 1)[0])

    return DatasetScheduling(config, log)


@pytest.fixture(scope="session")
def influx_url():
    """URL of a real InfluxDB: started here, or RANKSCOPE_TEST_INFLUX_URL."""
    url = external_url()
    if url:
        yield url
        return
    server = InfluxServer().start()
    try:
        yield server.url
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def influx_server():
    """A private influxd this test may stop and start (for outage tests)."""
    server = InfluxServer().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def influx_store(influx_url):
    """An InfluxStore on a fresh database, dropped afterwards."""
    store = InfluxStore(influx_url, bucket=f"test_{uuid.uuid4().hex[:10]}", api="v1")
    try:
        yield store
    finally:
        try:
            store.drop_database()
        finally:
            store.close()


@pytest.fixture
def embedded_store(tmp_path):
    store = EmbeddedStore(tmp_path / "store.db")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(params=["influx", "embedded"])
def any_store(request):
    """Both backends, for tests of the store contract."""
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture(scope="session")
def il0477_incident(influx_url, request):
    """IL-0477 in the real InfluxDB (a :class:`tests.il0477_store.IncidentData`), simulated and
    analyzed once for the whole run. A failure to build it fails every test that asks for it
    (there is no fallback); imported here, not at the top, so that it fails only those."""
    from tests.il0477_store import shared_incident

    return shared_incident(influx_url, request.addfinalizer)


@pytest.fixture(scope="session")
def compute_slowdown_influx(influx_url):
    """(store, scenario, truth): the compute-slowdown built-in in a database of its own."""
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    scenario = load_scenario("compute-slowdown")
    store = InfluxStore(influx_url, bucket=f"test_cs_{uuid.uuid4().hex[:10]}", api="v1")
    try:
        truth = simulate(scenario, store, start_ms=COMPUTE_SLOWDOWN_START_MS, progress=False)
        yield store, scenario, truth
    finally:
        try:
            store.drop_database()
        finally:
            store.close()
