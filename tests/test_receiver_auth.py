"""Who may post to the events receiver, and what: bearer and basic auth as Alertmanager and
Grafana send them, no open receiver off loopback, JSON only. Each refusal of issue 29."""

from __future__ import annotations

import logging

import pytest

from events.receiver import EventReceiver, ReceiverConfig
from rankscope.cli import main
from rankscope.http_credentials import (
    PASSWORD_ENV,
    TOKEN_ENV,
    USER_ENV,
    Credentials,
    ExposureError,
    check_exposure,
    is_loopback,
)
from tests.receiver_load import basic_auth
from tests.test_event_payloads import am_alert, am_payload
from tests.test_events_receiver import STARTS, call

USER, PASSWORD, TOKEN = "alertmanager", "pa:ss wörd-for-tests", "t0ken-for-tests"
XID = am_payload([am_alert("GPU Xid 79", {"instance": "gpu-node-00172:9100", "severity": "critical"},
                           STARTS, summary="GPU has fallen off the bus")], receiver="noc")


@pytest.fixture
def start_receiver(influx_store):
    """Start receivers on 127.0.0.1:0 over the test's InfluxDB; all stopped afterwards."""
    started: list[EventReceiver] = []

    def start(**config) -> EventReceiver:
        started.append(EventReceiver(influx_store, ("127.0.0.1", 0), ReceiverConfig(**config)).start())
        return started[-1]

    yield start
    for receiver in started:
        receiver.shutdown()


def posted(receiver: EventReceiver, authorization: str | None, body: object = XID,
           content_type: str | None = "application/json") -> tuple[int, object, dict[str, str]]:
    headers = {} if authorization is None else {"Authorization": authorization}
    if content_type is None:
        headers["Content-Type"] = ""
    else:
        headers["Content-Type"] = content_type
    return call(receiver, "POST", "/alertmanager", body, headers)


def test_basic_auth_as_alertmanager_and_grafana_send_it(influx_store, start_receiver, caplog):
    receiver = start_receiver(user=USER, password=PASSWORD)
    caplog.set_level(logging.DEBUG, logger="events")
    for bad in (None, basic_auth(USER, PASSWORD + "x"), basic_auth("grafana", PASSWORD),
                "Basic not-base64!", "Basic " + "YWxlcnRtYW5hZ2Vy",   # no ':'
                f"Bearer {PASSWORD}", PASSWORD):
        status, answer, headers = posted(receiver, bad)
        assert status == 401, bad
        assert answer == {"error": "missing or wrong credentials: send Authorization: Basic"}
        assert headers["WWW-Authenticate"] == 'Basic realm="rankscope-events"'
    assert len(influx_store.read_events()) == 0          # the forged Xid never got in
    status, answer, _ = posted(receiver, basic_auth(USER, PASSWORD))
    assert (status, answer["written"]) == (200, 1)
    assert influx_store.read_events()["source"].tolist() == ["alertmanager/noc"]
    assert any(f"(basic user {USER}): 1 alert(s), 1 written" in r.getMessage() for r in caplog.records)
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)
    assert PASSWORD not in repr(receiver) and PASSWORD not in repr(receiver.config)


def test_bearer_or_basic_when_both_are_configured(influx_store, start_receiver):
    receiver = start_receiver(token=TOKEN, user=USER, password=PASSWORD)
    assert posted(receiver, f"Bearer {TOKEN}")[0] == 200
    assert posted(receiver, f"bearer {TOKEN}")[0] == 200      # the scheme is case-insensitive
    assert posted(receiver, basic_auth(USER, PASSWORD))[0] == 200
    status, answer, headers = posted(receiver, basic_auth(USER, TOKEN))
    assert status == 401 and answer["error"].endswith("Bearer or Basic")
    assert TOKEN not in repr(receiver) and "bearer token or basic auth as 'alertmanager'" in repr(receiver)


def test_json_only(influx_store, start_receiver):
    receiver = start_receiver(token=TOKEN)
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        status, answer, _ = posted(receiver, f"Bearer {TOKEN}", content_type=ctype)
        assert status == 415 and answer["error"].startswith("Content-Type must be application/json")
    assert len(influx_store.read_events()) == 0
    assert posted(receiver, f"Bearer {TOKEN}", content_type="Application/JSON; charset=utf-8")[0] == 200
    # no credentials, no hint: the content type is checked only once the sender is known
    assert posted(receiver, None, content_type="text/plain")[0] == 401


def test_no_credentials_on_loopback_accepts_anyone(influx_store, start_receiver):
    """Documented: the default, for the machine's own processes."""
    receiver = start_receiver()
    assert posted(receiver, None)[0] == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "gpu-node-00172", "::"])
def test_a_non_loopback_address_without_credentials_is_refused(host, embedded_store):
    with pytest.raises(ExposureError, match=f"refusing to listen on {host} without credentials"):
        EventReceiver(embedded_store, (host, 0))
    check_exposure(host, Credentials(), insecure=True)          # said so: allowed
    check_exposure(host, Credentials(token=TOKEN))              # credentials: allowed
    assert not is_loopback(host)


def test_loopback_addresses():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.1.1", "localhost", "::1", "[::1]"))


def test_the_serve_command_refuses_an_open_address_and_half_credentials(monkeypatch, capsys, tmp_path):
    for var in (TOKEN_ENV, USER_ENV, PASSWORD_ENV):
        monkeypatch.delenv(var, raising=False)
    store = ["--store", str(tmp_path / "store.db")]
    assert main(["events", "serve", "--listen", "0.0.0.0:9095", *store]) == 1
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0 without credentials" in err and "--insecure" in err
    assert not (tmp_path / "store.db").exists()                  # refused before anything opened
    monkeypatch.setenv(USER_ENV, USER)
    assert main(["events", "serve", "--listen", "0.0.0.0:9095", *store]) == 1
    err = capsys.readouterr().err
    assert f"{USER_ENV} is set, {PASSWORD_ENV} is not" in err
    with pytest.raises(ValueError, match="cannot contain ':'"):
        ReceiverConfig(user="a:b", password="x")


def test_credentials_from_the_environment():
    creds = Credentials.from_env({TOKEN_ENV: TOKEN, USER_ENV: USER, PASSWORD_ENV: PASSWORD})
    assert creds.schemes == ("Bearer", "Basic") and creds.principal(f"Bearer {TOKEN}") == "bearer token"
    assert Credentials.from_env({TOKEN_ENV: ""}).required is False   # empty is unset
    assert creds.principal(basic_auth(USER, PASSWORD)) == f"basic user {USER}"
    assert TOKEN not in repr(creds) and PASSWORD not in repr(creds)
