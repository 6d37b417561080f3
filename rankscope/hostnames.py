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


class HostIndex:
    """The job's host names, and the names monitoring may know each by: the full name, its short
    name (first label), and a ``host_map`` entry (job name -> monitoring's name), in that order.

    Example::

        >>> idx = HostIndex(["gpu-node-01.dc1.example.com", "n2"], {"n2": "rack3-n2"})
        >>> idx.aliases("gpu-node-01.dc1.example.com"), idx.job_host("GPU-NODE-01"), idx.job_host("rack3-n2")
        (['gpu-node-01.dc1.example.com', 'gpu-node-01'], 'gpu-node-01.dc1.example.com', 'n2')
    """

    def __init__(self, hosts: Iterable[str], host_map: dict[str, str] | None = None):
        self.hosts = list(dict.fromkeys(hosts))
        self.host_map = dict(host_map or {})
        self._names: dict[str, str] = {}
        for rank in range(3):   # full names first, then short ones, then the map: the first claim wins
            for h in self.hosts:
                for name in self._claims(h, rank):
                    self._names.setdefault(_canonical(name), h)

    def _claims(self, host: str, rank: int) -> list[str]:
        if rank == 0:
            return [host]
        if rank == 1:
            return [host.split(".", 1)[0]] if "." in host and not _is_address(host) else []
        return [self.host_map[host]] if host in self.host_map else []

    def aliases(self, host: str) -> list[str]:
        """The names to ask monitoring for ``host`` by (its own first)."""
        out = [n for r in range(3) for n in self._claims(host, r)]
        return list(dict.fromkeys(out))

    def job_host(self, name: str) -> str | None:
        """The job's host monitoring's ``name`` stands for (None: none of them)."""
        c = _canonical(name)
        hit = self._names.get(c)
        if hit is None and "." in c and not _is_address(c):
            hit = self._names.get(c.split(".", 1)[0])
        return hit
