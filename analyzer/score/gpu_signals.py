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

from rankscope import gpu_health as gh

BEFORE, AFTER = "before", "after"
CULPRIT, PEER = "culprit", "peer"
#: Reasons with a fault's meaning (the benign ones are context only).
FAULT_REASONS = [r for r in gh.CLOCK_EVENT_BITS if r not in gh.BENIGN_REASONS]
#: Error signals and the sample test that makes one "seen".
ERRORS = (gh.XID, gh.ROW_REMAP_FAILURE, gh.REMAPPED_ROWS, gh.ECC_DBE)
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


def keyed(samples: pd.DataFrame) -> pd.DataFrame:
    """``samples`` with ``key`` (host/gpu), one sample each, and the text columns as categories: done
    once per query, so that each incident's :func:`phased` groups integers, not text."""
    s = samples.assign(key=samples["host"].astype(str) + "/" + samples["gpu"].astype(str))
    s = s.drop_duplicates(["key", "signal", "time", "value"])
    return s.astype({c: "category" for c in ("host", "uuid", "signal", "key")}).reset_index(drop=True)


def phased(samples: pd.DataFrame, culprits: pd.DataFrame, onset_ms: int, before_ms: int,
           after_ms: int) -> pd.DataFrame:
    """``samples`` in ``[onset - before_ms, onset)`` (before) and ``[onset, onset + after_ms]`` (after),
    with ``key`` (host/gpu, :func:`keyed`) and ``role``. ``culprits`` (host, gpu, uuid; gpu -1: every GPU
    of the host) name the incident's GPUs: by UUID where both sides know it, else by host and index."""
    if "key" not in samples.columns:
        samples = keyed(samples)
    t = samples["time"].to_numpy()
    keep = (t >= onset_ms - before_ms) & (t <= onset_ms + after_ms)
    s = samples.loc[keep]
    uuids = set(culprits.loc[culprits["uuid"].astype(str) != "", "uuid"].astype(str))
    by_index = set((culprits["host"].astype(str) + "/" + culprits["gpu"].astype(str)).tolist())
    whole_hosts = set(culprits.loc[culprits["gpu"] < 0, "host"].astype(str))
    hit = s["uuid"].isin(uuids).to_numpy() | s["key"].isin(by_index).to_numpy() | s["host"].isin(whole_hosts).to_numpy()
    return s.assign(phase=pd.Categorical.from_codes((t[keep] >= onset_ms).astype(np.int8), [BEFORE, AFTER]),
                    role=pd.Categorical.from_codes(hit.astype(np.int8), [PEER, CULPRIT])).reset_index(drop=True)


def _events(s: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU, sample time and reason bit: whether it was set (bits OR-ed over the
    samples of that time: field 112 and the exporter's counts together)."""
    r = s[s["signal"] == gh.REASONS]
    if not len(r):
        return pd.DataFrame(columns=["key", "role", "phase", "time", "signal", "active"])
    bits = gh.reason_bits(r["value"].to_numpy())
    wide = r[["key", "role", "phase", "time"]].assign(**bits)
    wide = wide.groupby(["key", "role", "phase", "time"], sort=False).max().reset_index()
    return wide.melt(id_vars=["key", "role", "phase", "time"], var_name="signal", value_name="active")


def event_shares(s: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, phase and reason: the share of samples it was set in, and how many samples."""
    ev = _events(s)
    return ev.groupby(["key", "role", "phase", "signal"])["active"].agg(share="mean", n="size").reset_index()


def increments(s: pd.DataFrame) -> pd.DataFrame:
    """The counters' samples with ``inc``: the increase since the GPU's previous sample of it (a
    counter that went back was reset: it counts as the value it restarted from)."""
    c = s[s["signal"].isin(gh.COUNTERS)].sort_values(["key", "signal", "time"], kind="stable")
    diff = c.groupby(["key", "signal"], sort=False)["value"].diff()
    inc = np.where(diff.to_numpy() < 0, c["value"].to_numpy(), diff.to_numpy())
    dt = c.groupby(["key", "signal"], sort=False)["time"].diff().to_numpy() / 1000.0
    return c.assign(inc=inc, dt=dt).dropna(subset=["inc", "dt"])


def counter_rates(s: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, phase and counter: its rate (increase per second) and its increase."""
    c = increments(s)
    g = c.groupby(["key", "role", "phase", "signal"])
    out = g.agg(increase=("inc", "sum"), seconds=("dt", "sum"), n=("inc", "size")).reset_index()
    return out.assign(rate=out["increase"] / out["seconds"].where(out["seconds"] > 0))


def level_medians(s: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, phase and level signal: the median and how many samples."""
    lv = s[s["signal"].isin(gh.LEVELS)]
    return lv.groupby(["key", "role", "phase", "signal"])["value"].agg(median="median", n="size").reset_index()


def _by_phase(stat: pd.DataFrame, value: str, rules: SignalRules) -> pd.DataFrame:
    """Culprit rows ``(key, signal)`` with ``before``/``after`` of ``value`` (NaN with too few
    samples) and ``peers`` (pooled for shares, the median over GPUs otherwise)."""
    ok = stat[stat["n"] >= rules.min_samples]
    mine = ok[ok["role"] == CULPRIT].pivot_table(index=["key", "signal"], columns="phase", values=value,
                                                 aggfunc="first")
    mine = mine.reindex(columns=[BEFORE, AFTER])
    peers = ok[(ok["role"] == PEER) & (ok["phase"] == AFTER)]
    if value == "share":
        weighted = (peers["share"] * peers["n"]).groupby(peers["signal"]).sum()
        ref = weighted / peers.groupby("signal")["n"].sum()
    else:
        ref = peers.groupby("signal")[value].median()
    out = mine.reset_index()
    out["peers"] = out["signal"].map(ref).astype(float)
    out["peer_gpus"] = out["signal"].map(peers.groupby("signal")["key"].nunique()).fillna(0).astype(int)
    return out


def _error_seen(s: pd.DataFrame) -> pd.DataFrame:
    """Rows (key, role, phase, signal, value) of every sample that shows an error: a non-zero XID
    (its code the value), a row-remap failure, an increase of a memory-error counter."""
    flags = s[s["signal"].isin([gh.XID, gh.ROW_REMAP_FAILURE]) & (s["value"] > 0)]
    inc = increments(s)
    grown = inc[inc["signal"].isin([gh.REMAPPED_ROWS, gh.ECC_DBE]) & (inc["inc"] > 0)]
    cols = ["key", "role", "phase", "signal", "value"]
    return pd.concat([flags[cols], grown.assign(value=grown["inc"])[cols]], ignore_index=True)


def errors(s: pd.DataFrame, rules: SignalRules) -> pd.DataFrame:
    """Per culprit GPU and error signal it shows after the onset: ``after`` (samples showing it),
    ``before`` (the same before; an XID counts only with a code not seen before), ``peers`` (the
    share of the peer GPUs showing it after), ``codes`` (the new XID codes), ``fault``."""
    seen = _error_seen(s)
    culprit = seen[(seen["role"] == CULPRIT)]
    after, before = culprit[culprit["phase"] == AFTER], culprit[culprit["phase"] == BEFORE]
    if not len(after):
        return pd.DataFrame(columns=["key", "signal", "kind", "before", "after", "peers", "peer_gpus", "codes", "fault"])
    out = after.groupby(["key", "signal"]).agg(after=("value", "size")).reset_index()
    codes_after = after[after["signal"] == gh.XID].groupby("key")["value"].unique()
    codes_before = before[before["signal"] == gh.XID].groupby("key")["value"].unique()
    new = {k: sorted({int(c) for c in v} - {int(c) for c in codes_before.get(k, [])}) for k, v in codes_after.items()}
    out["codes"] = [new.get(k, []) if sig == gh.XID else [] for k, sig in zip(out["key"], out["signal"], strict=True)]
    prior = before.groupby(["key", "signal"]).size()
    out["before"] = [float(prior.get((k, sig), 0)) for k, sig in zip(out["key"], out["signal"], strict=True)]
    peers_all = s.loc[(s["role"] == PEER) & (s["phase"] == AFTER), "key"].nunique()
    peer_seen = seen[(seen["role"] == PEER) & (seen["phase"] == AFTER)].groupby("signal")["key"].nunique()
    out["peers"] = out["signal"].map(peer_seen).fillna(0) / peers_all if peers_all else np.nan
    out["peer_gpus"] = peers_all
    is_xid = out["signal"] == gh.XID
    new_here = np.where(is_xid, out["codes"].map(len) > 0, out["before"] == 0)
    out["fault"] = new_here & ~(out["peers"].fillna(0) >= rules.peer_share)
    return out.assign(kind="error")


def compare(s: pd.DataFrame, rules: SignalRules, signals: tuple[str, ...]) -> pd.DataFrame:
    """Per culprit GPU and signal: ``kind`` (event, level, rate, error), ``before``, ``after``,
    ``peers``, ``peer_gpus``, ``fault`` (it sets the GPU apart; only for ``signals``, what the
    incident's class is checked against, and the errors) and ``context`` (a reason it shows as its
    peers or its past do)."""
    rates = counter_rates(s)
    parts = [_by_phase(event_shares(s), "share", rules).assign(kind="event"),
             _by_phase(level_medians(s), "median", rules).assign(kind="level"),
             _by_phase(rates[rates["signal"].isin(LINK_SIGNALS)], "rate", rules).assign(kind="rate")]
    parts = [p for p in parts if len(p)]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["key", "signal", BEFORE, AFTER, "peers", "peer_gpus", "kind"])
    b, a, p = (out[c].to_numpy(dtype=float) for c in (BEFORE, AFTER, "peers"))
    hi, lo = np.fmax(b, p), np.fmin(b, p)   # NaN-aware: the comparison there is
    sig = out["signal"].to_numpy()
    with np.errstate(invalid="ignore"):
        fault = np.select(
            [np.isin(sig, FAULT_REASONS), sig == gh.SM_CLOCK, sig == gh.TEMPERATURE, sig == gh.POWER,
             sig == gh.PCIE_REPLAYS, sig == gh.NVLINK_BANDWIDTH],
            [a - hi >= rules.min_share_gap, a <= (1 - rules.clock_drop) * lo, a >= hi + rules.temp_rise_c,
             a <= (1 - rules.power_change) * lo, a >= np.maximum(rules.min_rate, rules.rate_ratio * hi),
             (lo > 0) & (a <= (1 - rules.nvlink_drop) * lo)], default=False)
        fault &= np.isfinite(a) & np.isfinite(hi) & np.isin(sig, signals)
        context = (out["kind"].to_numpy() == "event") & ~fault & (a >= 0.1)
    out = out.assign(fault=fault, context=context, codes=[[] for _ in range(len(out))])
    err = errors(s, rules)
    if len(err):
        out = pd.concat([out, err.assign(context=False)], ignore_index=True)
    return out.sort_values(["key", "signal"], kind="stable").reset_index(drop=True)
