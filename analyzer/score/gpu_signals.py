"""The culprit GPUs' telemetry against their own past and against the job's other GPUs: pure,
over the long frame every source reads into (:mod:`analyzer.read.gpu_samples`), vectorised over
all GPUs and signals at once.

Each sample is placed in a *phase*: ``before`` (the baseline window before the onset) or
``after`` (the onset window), and each GPU has a *role*: ``culprit`` (one of the incident's) or
``peer``. Then, per culprit GPU and signal:

- **events** (each clock-event reason bit of field 112): the share of its samples with the bit
  set before and after the onset, and the share of the peers' samples after (pooled);
- **levels** (SM clock, temperature, power): the median before and after, and the peers' median after;
- **counters** (PCIe replays, NVLink traffic): the rate (per second, summed increments, a reset
  counted as the value it restarts from) before, after, and the peers' median rate after;
- **errors** (XID codes, row-remap failures, uncorrectable remapped rows, double-bit ECC): what
  appears after the onset that the GPU did not show before, and on how many of the peers.

:func:`compare` says which of them set the GPU apart (``fault``), by :class:`SignalRules`: a
share ``min_share_gap`` above both its own baseline and its peers, a clock ``clock_drop`` below
both, and so on. A reason every GPU shows is ``context``, never a fault; where the GPU has no
baseline (or the job no peers) it is compared with what there is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzer.score.gpu_series import COUNTERS, LEVELS, REASON_NAMES, ByGpu, GpuSeries
from rankscope import gpu_health as gh

BEFORE, AFTER = "before", "after"
#: Reasons with a fault's meaning (the benign ones are context only).
FAULT_REASONS = [r for r in gh.CLOCK_EVENT_BITS if r not in gh.BENIGN_REASONS]
#: What each class of incident is checked against, besides the errors.
COMPUTE_SIGNALS = (*gh.CLOCK_EVENT_BITS, gh.SM_CLOCK, gh.TEMPERATURE, gh.POWER)
LINK_SIGNALS = (gh.PCIE_REPLAYS, gh.NVLINK_BANDWIDTH)


@dataclass(frozen=True)
class SignalRules:
    """How far a culprit GPU must stand from its baseline and its peers for a signal to count."""

    min_share_gap: float = 0.3    # a reason set in this much more of the samples than before and on the peers
    clock_drop: float = 0.10      # SM clock this much lower than before and than the peers
    temp_rise_c: float = 8.0      # temperature this many degrees above both
    power_change: float = 0.15    # power this much lower than both
    rate_ratio: float = 3.0       # PCIe replays this many times the rate of both ...
    min_rate: float = 0.05        # ... and at least this many per second
    nvlink_drop: float = 0.3      # NVLink traffic this much lower than both
    min_samples: int = 3          # samples a GPU needs in a phase for it to count
    peer_share: float = 0.5       # an error on this share of the peers is the job's, not the GPU's


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` found: ``table`` (per culprit GPU and signal), ``gpus`` (the culprit GPUs
    with samples in the window: ``key``, ``host``, ``gpu``, ``uuid``, and how many sample times
    ``before`` and ``after``) and ``peer_gpus`` (the peer GPUs with samples in the window); the
    table and the GPUs are kept as columns (arrays) and made frames only when asked for."""

    columns: dict[str, np.ndarray]
    gpu_columns: dict[str, np.ndarray]
    peer_gpus: int

    @property
    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.columns)

    @property
    def gpus(self) -> pd.DataFrame:
        return pd.DataFrame(self.gpu_columns)

    def rows(self) -> list[dict]:
        """The table's rows as records (without building the frame: one incident's few hundred)."""
        return records(self.columns)

    def gpu_rows(self) -> list[dict]:
        """:attr:`gpus` as records."""
        return records(self.gpu_columns)


def records(columns: dict[str, np.ndarray]) -> list[dict]:
    """Rows of equal-length columns as dicts of Python values (faster than a frame's ``to_dict``)."""
    names = list(columns)
    return [dict(zip(names, r, strict=True)) for r in zip(*(columns[c].tolist() for c in names), strict=True)]


@dataclass(frozen=True)
class _Window:
    """An incident's roles (per GPU: -1 not compared, 0 peer, 1 culprit) and times."""

    role: np.ndarray
    onset: int
    lo: int
    hi: int

    def take(self, samples: ByGpu, time: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The positions of the samples in the window on a compared GPU, and their phase (1: after)."""
        at = samples.span(np.flatnonzero(self.role >= 0))
        t = time[at]
        inside = (t >= self.lo) & (t <= self.hi)
        return at[inside], (t[inside] >= self.onset).astype(np.int64)


def roles(series: GpuSeries, culprits: pd.DataFrame, hosts: set[str] | None = None) -> np.ndarray:
    """Per GPU of ``series``: 1 for one of ``culprits`` (:meth:`GpuSeries.named`), 0 for a peer on
    ``hosts`` (default: every other GPU), -1 for a GPU not compared."""
    hit = series.named(culprits)
    inside = np.ones(len(hit), bool) if hosts is None else series.of_hosts(hosts)
    return np.where(hit, 1, np.where(inside, 0, -1)).astype(np.int64)


def _sums(group: np.ndarray, n_groups: int, weights: np.ndarray | None = None) -> np.ndarray:
    return np.bincount(group, weights=weights, minlength=n_groups).astype(float)


def _medians(group: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """The median of ``values`` per group (NaN for an empty one); ``values`` sorted within each
    group already (:class:`~analyzer.score.gpu_series.Values` are), so one stable sort by group
    keeps them sorted."""
    v = values[np.argsort(group, kind="stable")]
    counts = np.bincount(group, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    out = np.full(n_groups, np.nan)
    has = counts > 0
    out[has] = (v[(starts + (counts - 1) // 2)[has]] + v[(starts + counts // 2)[has]]) / 2
    return out


def _peer_ref(stat: np.ndarray, n: np.ndarray, peers: np.ndarray, pooled: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per signal: the peers' value after the onset (pooled by samples, or the median over GPUs)
    and how many peer GPUs count. ``stat``/``n``: ``[gpu, signal]`` after the onset, NaN where too few."""
    ok = peers[:, None] & np.isfinite(stat)
    count = ok.sum(axis=0)
    if pooled:
        w = np.where(ok, n, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (np.where(ok, stat, 0.0) * w).sum(axis=0) / w.sum(axis=0), count
    ref = np.full(stat.shape[1], np.nan)
    for j in np.flatnonzero(count):   # a handful of signals
        ref[j] = np.median(stat[ok[:, j], j])
    return ref, count


def _by_phase(series: GpuSeries, win: _Window, stat: np.ndarray, n: np.ndarray, names: list[str], kind: str,
              rules: SignalRules, pooled: bool = False) -> dict[str, np.ndarray]:
    """Culprit rows (key, signal) with ``before``/``after`` (NaN with too few samples), the peers'
    reference and count, as columns. ``stat``/``n``: ``[gpu, signal, phase]``."""
    val = np.where(n >= rules.min_samples, stat, np.nan)
    ref, count = _peer_ref(val[:, :, 1], n[:, :, 1], win.role == 0, pooled)
    c, j = np.nonzero((win.role == 1)[:, None] & np.isfinite(val).any(axis=2))
    return {"key": series.keys[c], "signal": np.asarray(names, dtype=object)[j],
            BEFORE: val[c, j, 0], AFTER: val[c, j, 1], "peers": ref[j], "peer_gpus": count[j].astype(int),
            "kind": np.full(len(c), kind, dtype=object)}


def _event_rows(series: GpuSeries, win: _Window, rules: SignalRules) -> dict[str, np.ndarray]:
    ev, k = series.events, len(series.gpus)
    m, phase = win.take(ev, ev.time)
    g = ev.key[m] * 2 + phase
    n = _sums(g, 2 * k).reshape(k, 1, 2)
    bits = ev.bits[m]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.stack([_sums(g, 2 * k, bits[:, b]).reshape(k, 2) for b in range(bits.shape[1])], axis=1) / n
    n = np.broadcast_to(n, share.shape)
    return _by_phase(series, win, share, n, REASON_NAMES, "event", rules, pooled=True)


def _level_rows(series: GpuSeries, win: _Window, rules: SignalRules) -> dict[str, np.ndarray]:
    lv, k, s = series.levels, len(series.gpus), len(LEVELS)
    m, phase = win.take(lv, lv.time)
    g = (lv.key[m] * s + lv.signal[m]) * 2 + phase
    shape = (k, s, 2)
    return _by_phase(series, win, _medians(g, lv.value[m], k * s * 2).reshape(shape),
                     _sums(g, k * s * 2).reshape(shape), LEVELS, "level", rules)


def _rate_rows(series: GpuSeries, win: _Window, rules: SignalRules) -> dict[str, np.ndarray]:
    ct, k, s = series.counters, len(series.gpus), len(COUNTERS)
    m, phase = win.take(ct, ct.time)
    begun = ct.since[m] >= win.lo   # an increase that began before the window is not the window's
    m, phase = m[begun], phase[begun]
    g = (ct.key[m] * s + ct.signal[m]) * 2 + phase
    shape = (k, s, 2)
    inc, dt = _sums(g, k * s * 2, ct.inc[m]).reshape(shape), _sums(g, k * s * 2, ct.dt[m]).reshape(shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(dt > 0, inc / dt, np.nan)
    link = [COUNTERS.index(x) for x in LINK_SIGNALS]
    return _by_phase(series, win, rate[:, link], _sums(g, k * s * 2).reshape(shape)[:, link],
                     list(LINK_SIGNALS), "rate", rules)


def _error_rows(series: GpuSeries, win: _Window, peers_after: int, rules: SignalRules) -> pd.DataFrame:
    """Per culprit GPU and error signal it shows after the onset: ``after`` (samples showing it),
    ``before`` (the same before; an XID counts only with a code not seen before), ``peers`` (the
    share of the ``peers_after`` peer GPUs showing it after), ``codes`` (the new XID codes), ``fault``."""
    e = series.errors
    key, t = e["key"].to_numpy(), e["time"].to_numpy()
    m = np.flatnonzero((e["since"].to_numpy() >= win.lo) & (t <= win.hi) & (win.role[key] >= 0))   # few: errors are rare
    role, phase = win.role[key[m]], (t[m] >= win.onset).astype(np.int64)
    if not ((role == 1) & (phase == 1)).any():
        return pd.DataFrame()
    seen = e.iloc[m].assign(role=role, after=phase == 1)
    culprit = seen[seen["role"] == 1]
    after, before = culprit[culprit["after"]], culprit[~culprit["after"]]
    out = after.groupby(["key", "signal"]).agg(after=("value", "size")).reset_index()
    prior = before.groupby(["key", "signal"]).size()
    codes_before = before[before["signal"] == gh.XID].groupby("key")["value"].agg(lambda v: {int(c) for c in v})
    codes_after = after[after["signal"] == gh.XID].groupby("key")["value"].agg(lambda v: {int(c) for c in v})
    out["codes"] = [sorted(codes_after.get(k, set()) - codes_before.get(k, set())) if sig == gh.XID else []
                    for k, sig in zip(out["key"], out["signal"], strict=True)]
    out["before"] = [float(prior.get((k, sig), 0)) for k, sig in zip(out["key"], out["signal"], strict=True)]
    peer_seen = seen[(seen["role"] == 0) & seen["after"]].groupby("signal")["key"].nunique()
    out["peers"] = out["signal"].map(peer_seen).fillna(0) / peers_after if peers_after else np.nan
    out["peer_gpus"] = peers_after
    new_here = np.where(out["signal"] == gh.XID, out["codes"].map(len) > 0, out["before"] == 0)
    out["fault"] = new_here & ~(out["peers"].fillna(0) >= rules.peer_share)
    out["key"] = series.keys[out["key"].to_numpy()]
    return out.assign(kind="error", context=False)


def _faults(out: dict[str, np.ndarray], rules: SignalRules, signals: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``out`` with ``fault`` (the signal sets the GPU apart from its baseline and its peers; only
    for ``signals``) and ``context`` (a reason it shows as its peers or its past do)."""
    b, a, p = (np.asarray(out[c], dtype=float) for c in (BEFORE, AFTER, "peers"))
    hi, lo = np.fmax(b, p), np.fmin(b, p)   # NaN-aware: the comparison there is
    sig = out["signal"]
    with np.errstate(invalid="ignore"):
        fault = np.select(
            [np.isin(sig, FAULT_REASONS), sig == gh.SM_CLOCK, sig == gh.TEMPERATURE, sig == gh.POWER,
             sig == gh.PCIE_REPLAYS, sig == gh.NVLINK_BANDWIDTH],
            [a - hi >= rules.min_share_gap, a <= (1 - rules.clock_drop) * lo, a >= hi + rules.temp_rise_c,
             a <= (1 - rules.power_change) * lo, a >= np.maximum(rules.min_rate, rules.rate_ratio * hi),
             (lo > 0) & (a <= (1 - rules.nvlink_drop) * lo)], default=False)
        fault &= np.isfinite(a) & np.isfinite(hi) & np.isin(sig, signals)
        context = (out["kind"] == "event") & ~fault & (a >= 0.1)
    codes = np.empty(len(sig), dtype=object)
    codes[:] = [[] for _ in range(len(sig))]
    return {**out, "fault": fault, "context": context, "codes": codes}


def _present(series: GpuSeries, win: _Window) -> tuple[dict[str, np.ndarray], int, int]:
    """The culprit GPUs with samples in the window and their sample times per phase (columns); how
    many peer GPUs have samples in the window, and after the onset."""
    seen, k = series.seen, len(series.gpus)
    m, phase = win.take(seen, seen.time)
    n = _sums(seen.key[m] * 2 + phase, 2 * k).reshape(k, 2).astype(int)
    here = n.sum(axis=1) > 0
    mine = np.flatnonzero(here & (win.role == 1))
    gpus = {**series.gpu_columns(mine), BEFORE: n[mine, 0], AFTER: n[mine, 1]}
    peers = win.role == 0
    return gpus, int((here & peers).sum()), int(((n[:, 1] > 0) & peers).sum())


def compare(series: GpuSeries, culprits: pd.DataFrame, onset_ms: int, before_ms: int, after_ms: int,
            rules: SignalRules, signals: tuple[str, ...], hosts: set[str] | None = None) -> Comparison:
    """``culprits``' GPUs (see :func:`roles`) in ``[onset - before_ms, onset)`` (before) and
    ``[onset, onset + after_ms]`` (after) against their own baseline and the peers on ``hosts``:
    per culprit GPU and signal ``kind`` (event, level, rate, error), ``before``, ``after``,
    ``peers``, ``peer_gpus``, ``fault`` (only for ``signals``, what the incident's class is checked
    against, and the errors), ``context``, ``codes`` (new XID codes)."""
    win = _Window(roles(series, culprits, hosts), int(onset_ms), int(onset_ms - before_ms), int(onset_ms + after_ms))
    parts = [_event_rows(series, win, rules), _level_rows(series, win, rules), _rate_rows(series, win, rules)]
    out = _faults({c: np.concatenate([p[c] for p in parts]) for c in parts[0]}, rules, signals)
    gpus, peer_gpus, peers_after = _present(series, win)
    err = _error_rows(series, win, peers_after, rules)
    if len(err):
        out = {c: np.concatenate([out[c], err[c].to_numpy()]) for c in out}
    order = sorted(range(len(out["key"])), key=lambda i: (out["key"][i], out["signal"][i]))
    return Comparison(columns={c: v[order] for c, v in out.items()}, gpu_columns=gpus, peer_gpus=peer_gpus)
