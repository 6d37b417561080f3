"""Telegraf's ``nvidia_smi`` input from InfluxDB: measurement ``nvidia_smi`` (configurable), tags
``host``, ``index``, ``uuid``, fields ``clocks_current_sm``, ``temperature_gpu``, ``power_draw``,
``utilization_gpu`` (Telegraf reports no clock-event reasons), in a database of the store's server
(``telegraf`` by default), with the store's credentials. One InfluxQL query for the hosts asked
about, thinned to at most ``max_points`` windows a series::

    SELECT mean("clocks_current_sm") AS "clocks_current_sm", ... FROM "nvidia_smi"
    WHERE "host" =~ /(?i)^(a|b)(\\..+)?$/ AND time >= ...ms AND time <= ...ms
    GROUP BY time(15s), "host", "index", "uuid" fill(none)

The answer is read within ``timeout_s`` and ``max_bytes``; a database or measurement that does
not exist is no data (``note`` says which), a server that does not answer is
:class:`SourceUnavailable`.
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd

from analyzer.read.gpu_samples import SourceUnavailable, clean, empty
from rankscope import gpu_health as gh
from rankscope.bounded_http import HttpAuth, HttpFailure, bounded_get
from rankscope.hostnames import HostIndex
from rankscope.lineprotocol import quote_ident

#: Telegraf's field -> the signal it is read into.
FIELDS: dict[str, str] = {"clocks_current_sm": gh.SM_CLOCK, "temperature_gpu": gh.TEMPERATURE,
                          "power_draw": gh.POWER, "utilization_gpu": gh.UTILIZATION}
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


class TelegrafNvidiaSmi:
    """``nvidia_smi`` points of some hosts from the InfluxDB at ``url``, database ``database``."""

    name = "nvidia_smi"

    def __init__(self, url: str, database: str = "telegraf", *, measurement: str = "nvidia_smi",
                 auth: HttpAuth | None = None, influx_token: str | None = None, timeout_s: float = 5.0,
                 max_bytes: int = 16 << 20, host_map: dict[str, str] | None = None, max_points: int = 240):
        self.url, self.database, self.measurement = url.rstrip("/"), database, measurement
        self.auth, self._token = auth, influx_token
        self.timeout_s, self.max_bytes, self.max_points = float(timeout_s), int(max_bytes), int(max_points)
        self.host_map = dict(host_map or {})
        self.note = ""

    def __repr__(self) -> str:
        return f"TelegrafNvidiaSmi({self.url!r}, database={self.database!r})"

    def query(self, hosts: list[str], start_ms: int, end_ms: int) -> str:
        idx = HostIndex(hosts, self.host_map)
        names = sorted({a for h in hosts for a in idx.aliases(h) if _HOST_NAME.fullmatch(a)})
        step = max(10, math.ceil((end_ms - start_ms) / 1000 / self.max_points))
        fields = ", ".join(f"mean({quote_ident(f)}) AS {quote_ident(f)}" for f in FIELDS)
        alternatives = "|".join(re.escape(n) for n in names)
        return (f"SELECT {fields} FROM {quote_ident(self.measurement)} WHERE \"host\" =~ /(?i)^({alternatives})"
                f"(\\..+)?$/ AND time >= {int(start_ms)}ms AND time <= {int(end_ms)}ms "
                f"GROUP BY time({step}s), \"host\", \"index\", \"uuid\" fill(none)")

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Token {self._token}"} if self._token else {}

    def samples(self, job: str, hosts: list[str], start_ms: int, end_ms: int, *, onset_ms: int | None = None,
                baseline_hosts: frozenset[str] | None = None,
                signals: frozenset[str] | None = None) -> pd.DataFrame:
        """Every sample of ``hosts`` in ``start_ms`` .. ``end_ms`` (one query at one step: ``onset_ms``,
        ``baseline_hosts`` and ``signals`` are not used; see :class:`~analyzer.read.gpu_samples.TelemetrySource`)."""
        self.note = f"measurement {self.measurement} in database {self.database}"
        if not hosts or end_ms <= start_ms:
            return empty()
        try:
            body = bounded_get(f"{self.url}/query", {"db": self.database, "q": self.query(hosts, start_ms, end_ms),
                                                     "epoch": "ms"},
                               timeout_s=self.timeout_s, max_bytes=self.max_bytes, auth=self.auth,
                               headers=self._headers())
        except HttpFailure as exc:
            if exc.kind == "status" and "database not found" in str(exc):
                self.note = f"no database {self.database} on {self.url}"
                return empty()
            raise SourceUnavailable(f"InfluxDB {exc}") from None
        return self.parse(body, HostIndex(hosts, self.host_map))

    def parse(self, body: bytes, idx: HostIndex) -> pd.DataFrame:
        try:
            answer = json.loads(body or b"{}")
        except (ValueError, RecursionError):
            raise SourceUnavailable(f"InfluxDB {self.url}: the answer to the nvidia_smi query is not JSON") from None
        frames = []
        for res in answer.get("results", []) if isinstance(answer, dict) else []:
            if "error" in res:
                if "database not found" in str(res["error"]):
                    self.note = f"no database {self.database} on {self.url}"
                    return empty()
                raise SourceUnavailable(f"InfluxDB {self.url} refused the nvidia_smi query: {str(res['error'])[:300]}")
            for s in res.get("series", []):
                frames.append(self._series(s, idx))
        frames = [f for f in frames if len(f)]
        return clean(pd.concat(frames, ignore_index=True)) if frames else empty()

    def _series(self, s: dict, idx: HostIndex) -> pd.DataFrame:
        tags = s.get("tags") or {}
        host = idx.job_host(str(tags.get("host", "")))
        if host is None or not isinstance(s.get("values"), list):
            return empty()
        wide = pd.DataFrame(s["values"], columns=s.get("columns"))
        long = wide.melt(id_vars=["time"], value_vars=[c for c in FIELDS if c in wide.columns],
                         var_name="field", value_name="value")
        return long.assign(host=host, gpu=tags.get("index", "-1"), uuid=tags.get("uuid", ""),
                           signal=long["field"].map(FIELDS))
