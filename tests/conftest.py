"""Shared fixtures: a real InfluxDB server for the session, a fresh database per test."""

from __future__ import annotations

import uuid

import pytest

from rankscope.store import EmbeddedStore, InfluxStore
from tests.influx_server import InfluxServer, external_url


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
