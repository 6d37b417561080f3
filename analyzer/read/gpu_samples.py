"""The one shape every GPU-telemetry source reads into, and what a source promises.

A source (DCGM in Prometheus, Telegraf's ``nvidia_smi`` in InfluxDB, the store's own
``gpu_health``) answers :meth:`TelemetrySource.samples` with a long frame of :data:`COLUMNS`:
``host`` (the job's name of the machine, whatever monitoring calls it), ``gpu`` (the device index,
-1 where unknown), ``uuid`` ("" where unknown), ``signal`` (one of
:data:`rankscope.gpu_health.SIGNALS`), ``time`` (epoch ms) and ``value``. A source that cannot
answer (down, slow, an error status, an answer over its limit) raises :class:`SourceUnavailable`
with one line saying why; one with nothing for those hosts answers an empty frame and says in
``note`` what it looked for.

A check says three more things a source may use to read less: ``onset_ms``, before which only the
baseline's statistics are taken (medians, shares, rates over half an hour: a coarser step serves
them); ``baseline_hosts``, the only hosts whose samples before ``onset_ms`` it compares (the
culprits' own past: the peers are compared after the onset only; ``None``: every host); and
``signals``, the only signals it compares (``None``: every one).

Example::

    >>> f = clean(pd.DataFrame({"host": ["a"] * 3, "gpu": [0] * 3, "uuid": [""] * 3, "signal": ["temperature_c"] * 3,
    ...                         "time": [1, 2, 3], "value": [60.0, float("nan"), 9.2e18]}))
    >>> f["value"].tolist()
    [60.0]
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pandas as pd

from rankscope.gpu_health import DCGM_BLANK_MIN, REASONS

COLUMNS = ["host", "gpu", "uuid", "signal", "time", "value"]


class SourceUnavailable(RuntimeError):
    """The source gave no answer to use this cycle (tried again next cycle)."""


class TelemetrySource(Protocol):
    """A place the GPUs' telemetry is read from."""

    name: str
    note: str   # what the last call looked for, for a summary that found nothing

    def samples(self, job: str, hosts: list[str], start_ms: int, end_ms: int, *, onset_ms: int | None = None,
                baseline_hosts: frozenset[str] | None = None,
                signals: frozenset[str] | None = None) -> pd.DataFrame: ...


def empty() -> pd.DataFrame:
    return pd.DataFrame({"host": pd.Series(dtype=object), "gpu": pd.Series(dtype=np.int64),
                         "uuid": pd.Series(dtype=object), "signal": pd.Series(dtype=object),
                         "time": pd.Series(dtype=np.int64), "value": pd.Series(dtype=float)})


def clean(frame: pd.DataFrame) -> pd.DataFrame:
    """Only usable samples: a finite, non-negative value below DCGM's blank sentinels (a bitmask
    too: field 112 has 8 bits of meaning), a time, a host; types as :data:`COLUMNS` says."""
    if not len(frame):
        return empty()
    v = pd.to_numeric(frame["value"], errors="coerce").to_numpy(dtype=float)
    t = pd.to_numeric(frame["time"], errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(v) & (v >= 0) & (v < DCGM_BLANK_MIN) & np.isfinite(t) & frame["host"].notna().to_numpy()
    out = frame.loc[ok, COLUMNS].copy()
    out["time"] = t[ok].astype(np.int64)
    out["value"] = v[ok]
    if out["gpu"].dtype != np.int64:
        out["gpu"] = pd.to_numeric(out["gpu"], errors="coerce").fillna(-1).astype(np.int64)
    if not isinstance(out["uuid"].dtype, pd.CategoricalDtype):   # a source's categories hold no NaN
        out["uuid"] = out["uuid"].fillna("").astype(str)
    reasons = (out["signal"] == REASONS).to_numpy()
    if reasons.any():   # a bitmask is an integer
        out.loc[reasons, "value"] = np.floor(out.loc[reasons, "value"].to_numpy())
    return out.reset_index(drop=True)
