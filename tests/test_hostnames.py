"""Host names from monitoring against the names the collectors report."""

from __future__ import annotations

import pytest

from analyzer.diagnosis.event_verdicts import OutOfBandEvent
from rankscope.hostnames import matching_hosts, same_host


@pytest.mark.parametrize(("a", "b", "same"), [
    ("gpu-node-01294", "gpu-node-01294", True),
    ("gpu-node-01294", "GPU-Node-01294", True),                     # DNS ignores case
    ("gpu-node-01294", "gpu-node-01294.dc1.example.com", True),     # short name ~ its FQDN
    ("gpu-node-01294.dc1.example.com.", "gpu-node-01294", True),    # trailing dot of a rooted name
    ("gpu-node-01294.dc1", "gpu-node-01294.dc2", False),            # two FQDNs must agree whole
    ("gpu-node-01294", "gpu-node-0129", False),
    ("gpu-node-01294", "gpu-node-01294-bmc.dc1", False),            # the BMC is another machine
    ("10.0.3.17", "10", False),                                      # an address is not a name
    ("10.0.3.17", "10.0.3.17", True),
    ("fe80::1", "fe80", False),
    ("", "", False),
    (" ", "gpu-node-01294", False),
])
def test_same_host(a: str, b: str, same: bool) -> None:
    assert same_host(a, b) is same
    assert same_host(b, a) is same


def test_matching_hosts_keeps_order() -> None:
    hosts = ["gpu-node-00002", "gpu-node-00001", "gpu-node-00001.dc1"]
    assert matching_hosts("GPU-NODE-00001", hosts) == ["gpu-node-00001", "gpu-node-00001.dc1"]
    assert matching_hosts("gpu-node-00003", hosts) == []


def test_an_event_on_the_fqdn_names_the_short_host_and_not_its_neighbour() -> None:
    ev = OutOfBandEvent(time_ms=1, name="NodeNetworkDown", host="gpu-node-01294.dc1.example.com")
    assert ev.names(ranks=[10352], nodes=[1294], hosts=["gpu-node-01294"])
    assert not ev.names(ranks=[10360], nodes=[1295], hosts=["gpu-node-01295"])
    assert not OutOfBandEvent(time_ms=1, name="x").names(ranks=[], nodes=[], hosts=[""])
