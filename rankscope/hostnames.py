"""When two names are one machine: how monitoring's host names meet the job's.

A collector records ``socket.gethostname()``, which on most clusters is the short
name (``gpu-node-01294``); node_exporter's ``instance`` label, Grafana alerts and
runbooks often say the fully qualified one (``gpu-node-01294.dc1.example.com``), in
any case. DNS names ignore case, and a short name is the first label of the FQDN
it stands for, so:

- names are compared without case and without a trailing dot;
- a short name (no dot) matches an FQDN whose first label it is;
- two FQDNs must agree whole (``a.dc1`` is not ``a.dc2``), and an IP address matches
  only itself (its first octet is not a short name).

Example::

    >>> same_host("gpu-node-01294", "GPU-NODE-01294.dc1.example.com")
    True
    >>> same_host("gpu-node-01294.dc1", "gpu-node-01294.dc2"), same_host("10.0.3.17", "10")
    (False, False)
"""

from __future__ import annotations

from collections.abc import Iterable


def _canonical(name: str) -> str:
    return name.strip().rstrip(".").lower()


def _is_address(name: str) -> bool:
    """An IPv4 address (all labels digits) or an IPv6 one (has a colon)."""
    return ":" in name or all(part.isdigit() for part in name.split("."))


def same_host(a: str, b: str) -> bool:
    """Whether host names ``a`` and ``b`` name the same machine (rules in the module doc)."""
    a, b = _canonical(a), _canonical(b)
    if not a or not b:
        return False
    if a == b:
        return True
    if ("." in a) == ("." in b) or _is_address(a) or _is_address(b):
        return False
    return a.split(".", 1)[0] == b.split(".", 1)[0]


def matching_hosts(name: str, hosts: Iterable[str]) -> list[str]:
    """The names of ``hosts`` that are the same machine as ``name``, in their order."""
    return [h for h in hosts if same_host(name, h)]
