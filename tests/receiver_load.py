"""A bounded load on the events receiver over loopback: ``clients`` threads post ``posts``
Alertmanager payloads (one alert each, on distinct hosts and times, so every one is its own
point), each on a new connection, all released at once. Shared by the receiver's load test
(tests/test_receiver_load.py) and ``python -m benchmarks.run receiver``.

Only loopback addresses are accepted: this is a load generator, not a tool to aim elsewhere.
"""

from __future__ import annotations

import base64
import http.client
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.test_event_payloads import am_alert, am_payload

#: The issue's load: 500 posts from 20 concurrent clients.
POSTS = 500
CLIENTS = 20
#: Most seconds one post may take before the client gives up on it.
POST_TIMEOUT_S = 30.0
START_MS = 1_783_500_000_000   # 2026-07-08T08:40:00Z


@dataclass
class LoadResult:
    """What the clients saw: the seconds each answered post took, the statuses, and the
    posts that got no answer (refused or reset connections, timeouts) with why."""

    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def quantile_ms(self, q: float) -> float:
        """The ``q`` quantile of the answered posts' times, in ms (nearest rank)."""
        ordered = sorted(self.latencies_s)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] * 1000

    @property
    def answered(self) -> int:
        return len(self.latencies_s)

    def summary(self) -> str:
        mean = statistics.fmean(self.latencies_s) * 1000 if self.latencies_s else float("nan")
        return (f"{self.answered} answered {dict(sorted(self.statuses.items()))}, "
                f"{len(self.failures)} failed; p50 {self.quantile_ms(0.5):.1f} ms, "
                f"p99 {self.quantile_ms(0.99):.1f} ms, mean {mean:.1f} ms, "
                f"max {self.quantile_ms(1.0):.1f} ms; {self.wall_s:.2f} s in all")


def load_alert(i: int) -> dict:
    """Post ``i``'s payload: alert ``LoadTest`` on host ``load-host-<i>`` starting at
    ``START_MS + i`` seconds."""
    starts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(START_MS / 1000 + i))
    return am_payload([am_alert("LoadTest", {"instance": f"load-host-{i:05d}:9100",
                                             "severity": "warning"}, starts,
                                summary="bounded load test")], receiver="load")


def basic_auth(user: str, password: str) -> str:
    """The ``Authorization`` header value of HTTP basic auth."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def run_load(url: str, authorization: str | None = None, posts: int = POSTS,
             clients: int = CLIENTS) -> LoadResult:
    """Post ``posts`` payloads to ``url`` (``http://127.0.0.1:PORT/alertmanager``) from
    ``clients`` threads; returns what they saw."""
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"load only goes to loopback, not {parts.hostname!r}")
    if not 1 <= clients <= 64 or not 1 <= posts <= 10_000:
        raise ValueError("at most 64 clients and 10,000 posts")
    headers = {"Content-Type": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    bodies = [json.dumps(load_alert(i)).encode() for i in range(posts)]
    result = LoadResult()
    lock = threading.Lock()
    gate = threading.Barrier(clients)

    def client(k: int) -> None:
        gate.wait()
        for i in range(k, posts, clients):
            t0 = time.perf_counter()
            try:
                status = _post(parts.hostname or "", parts.port or 80, parts.path, bodies[i], headers)
            except OSError as exc:    # refused, reset, timed out
                with lock:
                    result.failures.append(f"post {i}: {type(exc).__name__}: {exc}")
                continue
            took = time.perf_counter() - t0
            with lock:
                result.latencies_s.append(took)
                result.statuses[status] = result.statuses.get(status, 0) + 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(POST_TIMEOUT_S * posts / clients + 30)
    result.wall_s = time.perf_counter() - t0
    return result


def warm_up(url: str, authorization: str | None = None) -> int:
    """One post of an alert on host ``load-warm-up`` (not one of the load's); its status."""
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"load only goes to loopback, not {parts.hostname!r}")
    payload = am_payload([am_alert("LoadTest", {"instance": "load-warm-up:9100"},
                                   "2026-07-08T08:00:00Z")], receiver="load")
    headers = {"Content-Type": "application/json", **({"Authorization": authorization}
                                                       if authorization else {})}
    return _post(parts.hostname or "", parts.port or 80, parts.path, json.dumps(payload).encode(),
                 headers)


def _post(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> int:
    """One post on a new connection (as a sender that does not keep connections open)."""
    conn = http.client.HTTPConnection(host, port, timeout=POST_TIMEOUT_S)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()
