"""NCCL Inspector's Prometheus samples -> the record table, every label checked.

The per-collective Prometheus output of NCCL Inspector (NVIDIA/nccl
``ext-profiler/inspector/inspector_prom.cc``) writes, per communicator of a GPU and dump, its
latest completed collective as three samples: ``nccl_collective_exec_time_microseconds``
(read here), ``nccl_bus_bandwidth_gbs`` and ``nccl_algorithm_bandwidth_gbs`` (not used: a rank
that waits shows a low bandwidth exactly where it shows a long time), labelled:

=================  =====================================================================
``comm_id``        the communicator's hash (the same on every member)
``hostname``       the process's host
``rank``           the rank *in that communicator*; ``nranks`` its size, ``n_nodes`` its nodes
``gpu_device_id``  ``GPU<cuda device>``: with the host, which process (one GPU each) wrote it
``collective``     ``AllReduce``, ``AllGather``, ``ReduceScatter``, ``Broadcast``, ``Reduce``,
                   ``Send``, ``Recv``, ``SendRecv``
``coll_sn``        the communicator's collective sequence number
``timestamp``      the dump's UTC second (``2025-10-17T03:31:47Z``): the record's time
``slurm_job``,     ``slurm_job_id``, ``message_size`` (``2.00GB``): not used (select a job's
                   series with them: ``--selector``)
=================  =====================================================================

A process is a host's GPU; its global rank is its ``rank`` in the job-wide communicator (the
largest ``nranks``), as for the JSON logs (:func:`~collector.nccl_import.inspector.inspector_records`).

Each sample is checked, vectorised: the labels present, ``rank`` below ``nranks`` and
``nranks`` at most 2^20, ``coll_sn`` below 2^62, ``collective`` one of the above, ``timestamp``
a UTC second (a series pulled from Prometheus whose ``timestamp`` is not one is placed at the
first scrape that saw it), the value a finite time of at most 10^9 ms. A bad sample is refused
and counted, the first named; the others are kept (a snapshot left out moves nothing else: the
snapshots are placed by time, not by counting). A collective seen again (the same series in a
later scrape, the same file read again) counts once, with its last value (a scrape may have
caught the file half written).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from collector.nccl_import.inspector import INSPECTOR_OPS
from collector.nccl_import.prom_text import SEEN_MS, VALUE, WHERE
from collector.nccl_import.records import MAX_DURATION_MS, MAX_RANKS, MAX_SEQ, MAX_TIME_US

#: The metric read, and the labels every sample of it must carry.
EXEC_METRIC = "nccl_collective_exec_time_microseconds"
REQUIRED_LABELS = ("comm_id", "hostname", "rank", "nranks", "gpu_device_id", "collective", "coll_sn",
                   "timestamp")
#: The plugin's ``timestamp`` label: the dump's UTC second.
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_MAX_TEXT = 256


@dataclass
class Refusals:
    """Samples refused for bad labels or values: how many of how many, and the first."""

    count: int = 0
    total: int = 0
    first: str = ""

    def __str__(self) -> str:
        return f"refused {self.count} of {self.total} sample(s) with bad labels or values (first: {self.first})"


def _digits(s: pd.Series, most_digits: int) -> tuple[np.ndarray, np.ndarray]:
    """(ok, value): ``s`` as non-negative integers written in at most ``most_digits`` digits."""
    text = s.astype(str)
    ok = (text.str.fullmatch(rf"\d{{1,{most_digits}}}") & s.notna()).to_numpy(dtype=bool)
    value = np.zeros(len(s), dtype=np.uint64)
    value[ok] = text[ok].astype(np.uint64).to_numpy()
    return ok, value


def _first_failure(checks: list[tuple[np.ndarray, str]], n: int) -> np.ndarray:
    """Per sample, the reason of the first check it fails (None when it passes them all)."""
    reason = np.full(n, None, dtype=object)
    for bad, why in checks:
        reason[bad & pd.isna(reason)] = why
    return reason


def _checks(s: pd.DataFrame) -> tuple[list[tuple[np.ndarray, str]], dict[str, np.ndarray]]:
    """Every check of the samples' labels and values, and the values they give."""
    checks = [(s[k].isna().to_numpy(), f"missing label {k!r}") for k in REQUIRED_LABELS]
    for k in ("comm_id", "hostname"):
        text = s[k].astype(str)
        checks.append((((text.str.len() > _MAX_TEXT) | (text == "")).to_numpy(),
                       f"label {k!r} is empty or longer than {_MAX_TEXT} characters"))
    rank_ok, rank = _digits(s["rank"], 7)
    size_ok, size = _digits(s["nranks"], 7)
    sn_ok, sn = _digits(s["coll_sn"], 19)
    gpu_ok, gpu = _digits(s["gpu_device_id"].astype(str).str.removeprefix("GPU"), 5)
    sizes_ok = size_ok & (size >= 1) & (size <= MAX_RANKS)
    checks += [(~sizes_ok, f"label 'nranks' is not a communicator size (1..{MAX_RANKS})"),
               (~rank_ok | (rank >= np.where(sizes_ok, size, 0)), "label 'rank' is not a rank below 'nranks'"),
               (~sn_ok | (sn >= MAX_SEQ), "label 'coll_sn' is not a sequence number below 2^62"),
               (~gpu_ok, "label 'gpu_device_id' is not GPU<device>"),
               (~s["collective"].isin(list(INSPECTOR_OPS)).to_numpy(),
                f"label 'collective' is not one of {', '.join(INSPECTOR_OPS)}")]
    stamp = pd.to_datetime(s["timestamp"], format=TIMESTAMP_FORMAT, utc=True, errors="coerce")
    end_us = stamp.dt.tz_convert(None).to_numpy().astype("datetime64[us]").astype(np.int64).astype(np.float64)
    end_us = np.where(stamp.notna().to_numpy(), end_us, s[SEEN_MS].to_numpy(np.float64) * 1000.0)
    checks.append((~(np.isfinite(end_us) & (end_us >= 0) & (end_us <= MAX_TIME_US)),
                   f"label 'timestamp' is not a UTC second ({TIMESTAMP_FORMAT}) up to 2262"))
    us = s[VALUE].to_numpy(np.float64)
    checks.append((~(np.isfinite(us) & (us >= 0) & (us <= MAX_DURATION_MS * 1000)),
                   f"value is not a finite time of 0..{MAX_DURATION_MS * 1000:g} us"))
    return checks, {"rank": rank, "n_ranks": size, "sn": sn, "gpu": gpu, "end_us": end_us, "us": us}


def prom_records(samples: pd.DataFrame) -> tuple[pd.DataFrame, Refusals]:
    """The exec-time samples -> raw records (one per process per collective: ``source`` the
    process, ``host/GPU<n>``, ``comm_rank`` its rank in the communicator, ``gpu`` its device;
    the columns :func:`~collector.nccl_import.inspector.inspector_records` takes), and the
    samples refused."""
    s = samples[samples.get("__name__", pd.Series(dtype=object)) == EXEC_METRIC].reset_index(drop=True)
    for k in REQUIRED_LABELS:
        if k not in s.columns:
            s[k] = pd.Series([None] * len(s), dtype=object)
    checks, v = _checks(s)
    reason = _first_failure(checks, len(s))
    bad = pd.notna(reason)
    refusals = Refusals(int(bad.sum()), len(s))
    if refusals.count:
        i = int(np.flatnonzero(bad)[0])
        refusals.first = f"{s[WHERE].iloc[i]}: {reason[i]}"
    ok = ~bad
    host = s["hostname"].astype(str).to_numpy()[ok]
    gpu = v["gpu"][ok].astype(np.int64)
    raw = pd.DataFrame({
        "source": pd.Series(host, dtype=object) + "/GPU" + pd.Series(gpu).astype(str),
        "line": np.flatnonzero(ok), "comm": s["comm_id"].astype(str).to_numpy()[ok],
        "comm_rank": v["rank"][ok].astype(np.int64), "n_ranks": v["n_ranks"][ok].astype(np.int64),
        "op": s["collective"].map(INSPECTOR_OPS).to_numpy()[ok], "sn": v["sn"][ok].astype(np.int64),
        "ms": v["us"][ok] / 1000.0, "end_us": v["end_us"][ok], "host": host, "gpu": gpu})
    raw = raw.drop_duplicates(["source", "comm", "comm_rank", "sn", "end_us"], keep="last")
    return raw.reset_index(drop=True), refusals
