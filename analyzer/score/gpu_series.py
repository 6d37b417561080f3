"""One query's GPU telemetry laid out once for every incident compared against it: pure, numpy.

A source answers one long frame (:mod:`analyzer.read.gpu_samples`) for all the incidents of a job
checked in a cycle; each incident then compares its own GPUs in its own onset window
(:mod:`analyzer.score.gpu_signals`). What does not depend on the window is done here, once: each
GPU numbered (``key``, host/gpu), duplicate samples dropped, the clock-event reasons decoded into
bits and OR-ed over the samples of one GPU and time (field 112 and the exporter's counts together),
the counters' increments (a counter that went back was reset: it counts as the value it restarted
from), the samples that show an error. Every array is a column over samples sorted by GPU, so an
incident's samples are a span per GPU (:meth:`ByGpu.span`) and a mask by time, and its statistics
are ``bincount`` s, never a group-by per incident.

Example::

    >>> f = pd.DataFrame({"host": ["a"] * 2, "gpu": [0, 0], "uuid": ["", ""], "signal": ["pcie_replays"] * 2,
    ...                   "time": [0, 1000], "value": [5.0, 2.0]})
    >>> prepare(f).counters.inc.tolist()    # reset from 5 to 2: 2 more
    [2.0]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope import gpu_health as gh

#: The reasons' names, in the order of :attr:`Events.bits`' columns.
REASON_NAMES = list(gh.CLOCK_EVENT_BITS)
#: Level and counter signals, in the order of their ``signal`` codes.
LEVELS = list(gh.LEVELS)
COUNTERS = list(gh.COUNTERS)


class ByGpu:
    """Samples sorted by GPU: ``span(keys)`` is where the samples of ``keys`` lie, without a mask
    over every sample of the query."""

    key: np.ndarray

    def span(self, keys: np.ndarray) -> np.ndarray:
        """The positions of the samples of ``keys`` (GPU numbers), GPU by GPU."""
        lo = np.searchsorted(self.key, keys, side="left")
        n = np.searchsorted(self.key, keys, side="right") - lo
        return np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))


@dataclass(frozen=True)
class Times(ByGpu):
    """Each GPU's distinct sample times (of any signal)."""

    key: np.ndarray
    time: np.ndarray


@dataclass(frozen=True)
class Events(ByGpu):
    """Per GPU and sample time: which reasons were set (``bits``, samples x reasons)."""

    key: np.ndarray
    time: np.ndarray
    bits: np.ndarray


@dataclass(frozen=True)
class Values(ByGpu):
    """Samples of the level signals (``signal`` indexes :data:`LEVELS`), in order of GPU, signal
    and value."""

    key: np.ndarray
    signal: np.ndarray
    time: np.ndarray
    value: np.ndarray


@dataclass(frozen=True)
class Increments(ByGpu):
    """Counter samples with the increase and seconds since the GPU's previous one (``signal`` indexes
    :data:`COUNTERS`; a series' first sample has none and is left out)."""

    key: np.ndarray
    signal: np.ndarray
    time: np.ndarray
    inc: np.ndarray
    dt: np.ndarray
    since: np.ndarray   # the previous sample's time: an increase counts in a window it began in


@dataclass(frozen=True)
class GpuSeries:
    """A query's samples, per kind, as columns over samples; ``gpus`` (one row per ``key``: ``key``
    text, ``host``, ``gpu``, ``uuid``) names the numbers; ``seen`` holds each GPU's distinct sample
    times (``key``, ``time``); ``errors`` the samples that show an error (``key``, ``signal``,
    ``time``, ``since``: when the growth began, ``value``: the XID code, 1 for a remap failure, the
    growth of a memory-error count)."""

    gpus: pd.DataFrame
    seen: Times
    events: Events
    levels: Values
    counters: Increments
    errors: pd.DataFrame

    def __post_init__(self) -> None:   # asked for by every incident: the columns as arrays, the names indexed
        for c in ("key", "host", "uuid", "gpu"):
            object.__setattr__(self, f"_{c}", self.gpus[c].to_numpy(dtype=np.int64 if c == "gpu" else object))
        index: dict[str, dict[str, list[int]]] = {"key": {}, "host": {}, "uuid": {}}
        for c, names in index.items():
            for i, name in enumerate(getattr(self, f"_{c}").tolist()):
                if name:
                    names.setdefault(name, []).append(i)
        object.__setattr__(self, "_index", index)

    @property
    def keys(self) -> np.ndarray:
        return self._key

    def _mask(self, column: str, names: Iterable[str]) -> np.ndarray:
        at = [i for n in names for i in self._index[column].get(str(n), ())]
        mask = np.zeros(len(self._key), bool)
        mask[at] = True
        return mask

    def of_hosts(self, hosts: Iterable[str]) -> np.ndarray:
        """Whether each GPU is on one of ``hosts``."""
        return self._mask("host", hosts)

    def named(self, culprits: pd.DataFrame) -> np.ndarray:
        """Whether each GPU is one of ``culprits`` (host, gpu, uuid; gpu -1: every GPU of the host):
        by UUID where both sides know it, else by host and index (a lookup per culprit, not a
        comparison of every GPU's names)."""
        hosts, gpus = culprits["host"].tolist(), [int(g) for g in culprits["gpu"].tolist()]
        return (self._mask("uuid", [u for u in culprits["uuid"].tolist() if str(u)])
                | self._mask("key", [f"{h}/{i}" for h, i in zip(hosts, gpus, strict=True)])
                | self._mask("host", [h for h, i in zip(hosts, gpus, strict=True) if i < 0]))

    def gpu_columns(self, at: np.ndarray) -> dict[str, np.ndarray]:
        """``gpus``' rows ``at`` as columns (``key``, ``host``, ``gpu``, ``uuid``)."""
        return {"key": self._key[at], "host": self._host[at], "gpu": self._gpu[at], "uuid": self._uuid[at]}


def _codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A text column's integer codes and their texts (a source's categories are taken as they are)."""
    cat = column if isinstance(column.dtype, pd.CategoricalDtype) else column.astype("category")
    return cat.cat.codes.to_numpy().astype(np.int64), np.asarray(cat.cat.categories, dtype=object).astype(str)


def _gpus(samples: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """One row per GPU and each sample's number of it: a GPU is its host and index, or, where the
    source knows no index (-1), its host and UUID (a host's GPUs never merge into one)."""
    host, hosts = _codes(samples["host"])
    gpu = samples["gpu"].to_numpy(dtype=np.int64)
    uuid, uuids = _codes(samples["uuid"])
    named = (uuid >= 0) & (uuids[np.maximum(uuid, 0)] != "") if len(uuids) else np.zeros(len(uuid), bool)
    # the GPU within its host: index + 1 (1..), else -(UUID code + 2) (..-2), else -1 (nothing known)
    within = np.where(gpu >= 0, gpu + 1, np.where(named, -(uuid + 2), -1))
    span = int(within.max(initial=0)) - int(within.min(initial=0)) + 1
    codes, _ = pd.factorize(host * span + (within - int(within.min(initial=0))))
    n = int(codes.max(initial=-1)) + 1
    _, first = np.unique(codes, return_index=True)
    known = np.flatnonzero(named)
    by_code = np.full(n, "", dtype=object)
    found, at = np.unique(codes[known], return_index=True)
    by_code[found] = uuids[uuid[known[at]]]
    host_of, gpu_of = hosts[host[first]], gpu[first]
    key = np.array([f"{h}/{g}" if g >= 0 or not u else f"{h}/{u}"
                    for h, g, u in zip(host_of, gpu_of, by_code, strict=True)], dtype=object)
    return pd.DataFrame({"key": key, "host": host_of, "gpu": gpu_of, "uuid": by_code}), codes.astype(np.int64)


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
    since = np.r_[0, t[:-1]][: len(k)]
    return Increments(k[same], s[same], t[same], inc[same], dt[same], since[same])


def _named(code: np.ndarray, names: list[str], *wanted: str) -> np.ndarray:
    """Whether each sample's signal (``code`` into ``names``) is one of ``wanted``."""
    return np.isin(code, [i for i, n in enumerate(names) if n in wanted])


def prepare(samples: pd.DataFrame) -> GpuSeries:
    """``samples`` (the sources' long frame) laid out for :func:`analyzer.score.gpu_signals.compare`."""
    gpus, key = _gpus(samples)
    code, names = _codes(samples["signal"])
    time = samples["time"].to_numpy(dtype=np.int64)
    value = samples["value"].to_numpy(dtype=float)
    # one sample of each GPU, signal, time and value (a source that answers a series twice)
    order = np.lexsort((value, time, code, key))
    k, c, t, v = key[order], code[order], time[order], value[order]
    first = np.r_[True, (k[1:] != k[:-1]) | (c[1:] != c[:-1]) | (t[1:] != t[:-1]) | (v[1:] != v[:-1])][: len(k)]
    key, time, value, code = k[first], t[first], v[first], c[first]
    order, starts = _runs(key, time)
    seen = Times(key[order][starts], time[order][starts])
    # each signal as its code's place in LEVELS / COUNTERS (-1: not one), compared as integers, not names
    names = [str(n) for n in names]
    level_of, counter_of = (np.array([kind.index(n) if n in kind else -1 for n in names] + [-1], dtype=np.int64)
                            for kind in (LEVELS, COUNTERS))
    r = _named(code, names, gh.REASONS)
    lv, ct = level_of[code] >= 0, counter_of[code] >= 0
    lv_code, ct_code = level_of[code[lv]], counter_of[code[ct]]
    counters = _increments(key[ct], ct_code, time[ct], value[ct])
    flags = _named(code, names, gh.XID, gh.ROW_REMAP_FAILURE) & (value > 0)
    memory = np.isin(counters.signal, [COUNTERS.index(gh.REMAPPED_ROWS), COUNTERS.index(gh.ECC_DBE)]) \
        & (counters.inc > 0)
    errors = pd.DataFrame({
        "key": np.r_[key[flags], counters.key[memory]],
        "signal": np.r_[np.asarray(names + [""], dtype=object)[code[flags]],
                        np.asarray(COUNTERS, dtype=object)[counters.signal[memory]]].astype(object),
        "time": np.r_[time[flags], counters.time[memory]],
        "since": np.r_[time[flags], counters.since[memory]],
        "value": np.r_[value[flags], counters.inc[memory]]})
    by_value = np.lexsort((value[lv], lv_code, key[lv]))   # each level's values in order: medians by one stable sort
    levels = Values(key[lv][by_value], lv_code[by_value], time[lv][by_value], value[lv][by_value])
    return GpuSeries(gpus=gpus, seen=seen, events=_events(key[r], time[r], value[r]),
                     levels=levels, counters=counters, errors=errors)
