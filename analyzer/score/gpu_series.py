"""One query's GPU telemetry laid out once for every incident compared against it: pure, numpy.

A source answers one long frame (:mod:`analyzer.read.gpu_samples`) for all the incidents of a job
checked in a cycle; each incident then compares its own GPUs in its own onset window
(:mod:`analyzer.score.gpu_signals`). What does not depend on the window is done here, once: each
GPU numbered (``key``, host/gpu), duplicate samples dropped, the clock-event reasons decoded into
bits and OR-ed over the samples of one GPU and time (field 112 and the exporter's counts together),
the counters' increments (a counter that went back was reset: it counts as the value it restarted
from), the samples that show an error. Every array is a column over samples, so an incident's
window is a mask and its statistics are ``bincount`` s, never a group-by per incident.

Example::

    >>> f = pd.DataFrame({"host": ["a"] * 2, "gpu": [0, 0], "uuid": ["", ""], "signal": ["pcie_replays"] * 2,
    ...                   "time": [0, 1000], "value": [5.0, 2.0]})
    >>> prepare(f).counters.inc.tolist()    # reset from 5 to 2: 2 more
    [2.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope import gpu_health as gh

#: The reasons' names, in the order of :attr:`Events.bits`' columns.
REASON_NAMES = list(gh.CLOCK_EVENT_BITS)
#: Level and counter signals, in the order of their ``signal`` codes.
LEVELS = list(gh.LEVELS)
COUNTERS = list(gh.COUNTERS)


@dataclass(frozen=True)
class Events:
    """Per GPU and sample time: which reasons were set (``bits``, samples x reasons)."""

    key: np.ndarray
    time: np.ndarray
    bits: np.ndarray


@dataclass(frozen=True)
class Values:
    """Samples of the level signals (``signal`` indexes :data:`LEVELS`), in order of GPU, signal
    and value."""

    key: np.ndarray
    signal: np.ndarray
    time: np.ndarray
    value: np.ndarray


@dataclass(frozen=True)
class Increments:
    """Counter samples with the increase and seconds since the GPU's previous one (``signal`` indexes
    :data:`COUNTERS`; a series' first sample has none and is left out)."""

    key: np.ndarray
    signal: np.ndarray
    time: np.ndarray
    inc: np.ndarray
    dt: np.ndarray


@dataclass(frozen=True)
class GpuSeries:
    """A query's samples, per kind, as columns over samples; ``gpus`` (one row per ``key``: ``key``
    text, ``host``, ``gpu``, ``uuid``) names the numbers; ``seen`` holds each GPU's distinct sample
    times (``key``, ``time``); ``errors`` the samples that show an error (``key``, ``signal``,
    ``time``, ``value``: the XID code, 1 for a remap failure, the growth of a memory-error count)."""

    gpus: pd.DataFrame
    seen: Values
    events: Events
    levels: Values
    counters: Increments
    errors: pd.DataFrame


def _gpus(samples: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """One row per GPU (host/gpu, in text order) and each sample's number of it."""
    text = samples["host"].astype(str) + "/" + samples["gpu"].astype(str)
    codes, names = pd.factorize(text, sort=True)
    _, first = np.unique(codes, return_index=True)
    uuid = samples["uuid"].astype(str).to_numpy()
    known = np.flatnonzero(uuid != "")
    by_code = np.full(len(names), "", dtype=object)
    found, at = np.unique(codes[known], return_index=True)
    by_code[found] = uuid[known[at]]
    gpus = pd.DataFrame({"key": np.asarray(names, dtype=object), "host": samples["host"].astype(str).to_numpy()[first],
                         "gpu": samples["gpu"].to_numpy(dtype=np.int64)[first], "uuid": by_code})
    return gpus, codes.astype(np.int64)


def _runs(key: np.ndarray, time: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order by (key, time) and the start of each run of equal (key, time) in it."""
    order = np.lexsort((time, key))
    k, t = key[order], time[order]
    starts = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (t[1:] != t[:-1])]) if len(order) else np.zeros(0, np.int64)
    return order, starts


def _events(key: np.ndarray, time: np.ndarray, masks: np.ndarray) -> Events:
    bits = np.column_stack([v for v in gh.reason_bits(masks).values()]).astype(np.uint8) if len(masks) \
        else np.zeros((0, len(REASON_NAMES)), np.uint8)
    order, starts = _runs(key, time)
    if not len(order):
        return Events(key, time, bits)
    return Events(key[order][starts], time[order][starts], np.maximum.reduceat(bits[order], starts, axis=0))


def _increments(key: np.ndarray, signal: np.ndarray, time: np.ndarray, value: np.ndarray) -> Increments:
    order = np.lexsort((time, signal, key))
    k, s, t, v = key[order], signal[order], time[order], value[order]
    same = np.r_[False, (k[1:] == k[:-1]) & (s[1:] == s[:-1])][: len(k)]
    diff = np.r_[np.nan, np.diff(v)][: len(k)]
    inc = np.where(diff < 0, v, diff)
    dt = np.r_[np.nan, np.diff(t)][: len(k)] / 1000.0
    return Increments(k[same], s[same], t[same], inc[same], dt[same])


def prepare(samples: pd.DataFrame) -> GpuSeries:
    """``samples`` (the sources' long frame) laid out for :func:`analyzer.score.gpu_signals.compare`."""
    s = samples.drop_duplicates(["host", "gpu", "signal", "time", "value"]).reset_index(drop=True)
    gpus, key = _gpus(s)
    sig = s["signal"].astype(str).to_numpy()
    time = s["time"].to_numpy(dtype=np.int64)
    value = s["value"].to_numpy(dtype=float)
    order, starts = _runs(key, time)
    seen = Values(key[order][starts], np.zeros(len(starts), np.int64), time[order][starts], np.zeros(len(starts)))
    r = sig == gh.REASONS
    lv = np.isin(sig, LEVELS)
    ct = np.isin(sig, COUNTERS)
    lv_code = pd.Categorical(sig[lv], categories=LEVELS).codes.astype(np.int64)
    ct_code = pd.Categorical(sig[ct], categories=COUNTERS).codes.astype(np.int64)
    counters = _increments(key[ct], ct_code, time[ct], value[ct])
    flags = np.isin(sig, [gh.XID, gh.ROW_REMAP_FAILURE]) & (value > 0)
    memory = np.isin(counters.signal, [COUNTERS.index(gh.REMAPPED_ROWS), COUNTERS.index(gh.ECC_DBE)]) \
        & (counters.inc > 0)
    errors = pd.DataFrame({
        "key": np.r_[key[flags], counters.key[memory]],
        "signal": np.r_[sig[flags], np.asarray(COUNTERS, dtype=object)[counters.signal[memory]]].astype(object),
        "time": np.r_[time[flags], counters.time[memory]],
        "value": np.r_[value[flags], counters.inc[memory]]})
    by_value = np.lexsort((value[lv], lv_code, key[lv]))   # each level's values in order: medians by one stable sort
    levels = Values(key[lv][by_value], lv_code[by_value], time[lv][by_value], value[lv][by_value])
    return GpuSeries(gpus=gpus, seen=seen, events=_events(key[r], time[r], value[r]),
                     levels=levels, counters=counters, errors=errors)
