"""The culprit GPUs against their past and their peers, computed from one query's samples laid out
once (analyzer/score/gpu_series.py) and each incident's window (analyzer/score/gpu_signals.py):
pure, on frames built here, with every statistic checked against a direct computation."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.score.gpu_series import prepare
from analyzer.score.gpu_signals import COMPUTE_SIGNALS, LINK_SIGNALS, SignalRules, compare
from rankscope import gpu_health as gh

MIN = 60_000
ONSET = 40 * MIN


def _frame(hosts: int = 4, gpus: int = 2, n: int = 55, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = np.arange(n) * MIN
    parts = []
    for h in range(hosts):
        for g in range(gpus):
            slow = h == 0 and g == 1
            clock = 1980 + rng.normal(0, 5, n) - np.where(slow & (t >= ONSET), 600, 0)
            reasons = np.where(slow & (t >= ONSET), 0x40 | 0x4, 0x4)         # power cap everywhere: context
            replays = np.cumsum(rng.poisson(0.2, n)).astype(float)
            if h == 2:
                replays[30:] -= replays[29]          # a counter reset on every GPU of host 2
                replays = np.abs(replays)
            for signal, v in ((gh.SM_CLOCK, clock), (gh.REASONS, reasons), (gh.PCIE_REPLAYS, replays)):
                parts.append(pd.DataFrame({"host": f"h{h}", "gpu": g, "uuid": f"GPU-{h}-{g}", "signal": signal,
                                           "time": t, "value": v.astype(float)}))
    return pd.concat(parts, ignore_index=True)


def _culprit(host: str = "h0", gpu: int = 1, uuid: str = "") -> pd.DataFrame:
    return pd.DataFrame([{"host": host, "gpu": gpu, "uuid": uuid}])


def test_levels_and_shares_match_a_direct_computation():
    f = _frame()
    found = compare(prepare(f), _culprit(), ONSET, 40 * MIN, 15 * MIN, SignalRules(), COMPUTE_SIGNALS)
    row = found.table.set_index("signal").loc[gh.SM_CLOCK]
    clock = f[f["signal"] == gh.SM_CLOCK]
    mine = clock[(clock["host"] == "h0") & (clock["gpu"] == 1)]
    assert row["before"] == np.median(mine.loc[mine["time"] < ONSET, "value"])
    assert row["after"] == np.median(mine.loc[(mine["time"] >= ONSET) & (mine["time"] <= ONSET + 15 * MIN), "value"])
    peers = clock[~((clock["host"] == "h0") & (clock["gpu"] == 1)) & (clock["time"] >= ONSET)
                  & (clock["time"] <= ONSET + 15 * MIN)]
    assert row["peers"] == np.median(peers.groupby(["host", "gpu"])["value"].median())
    assert bool(row["fault"]) and row["peer_gpus"] == 7
    thermal = found.table.set_index("signal").loc["hw_thermal_slowdown"]
    assert (thermal["before"], thermal["after"], thermal["peers"], bool(thermal["fault"])) == (0.0, 1.0, 0.0, True)
    cap = found.table.set_index("signal").loc["sw_power_cap"]
    assert not cap["fault"] and cap["context"]          # every GPU shows it
    assert found.gpus[["host", "gpu", "before", "after"]].values.tolist() == [["h0", 1, 40, 15]]
    assert found.peer_gpus == 7


def test_a_counter_reset_counts_as_the_value_it_restarted_from():
    f = _frame()
    s = prepare(f)
    mine = f[(f["host"] == "h2") & (f["gpu"] == 0) & (f["signal"] == gh.PCIE_REPLAYS)].sort_values("time")
    v = mine["value"].to_numpy()
    expect = np.where(np.diff(v) < 0, v[1:], np.diff(v))
    key = int(np.flatnonzero(s.gpus["key"] == "h2/0")[0])
    got = s.counters.inc[s.counters.key == key]
    assert (got >= 0).all() and np.array_equal(got, expect)


def test_duplicate_samples_count_once_and_uuid_names_the_gpu():
    f = _frame()
    doubled = pd.concat([f, f], ignore_index=True)
    rules = SignalRules()
    a = compare(prepare(f), _culprit(), ONSET, 40 * MIN, 15 * MIN, rules, COMPUTE_SIGNALS)
    b = compare(prepare(doubled), _culprit("elsewhere", 9, "GPU-0-1"), ONSET, 40 * MIN, 15 * MIN, rules, COMPUTE_SIGNALS)
    pd.testing.assert_frame_equal(a.table, b.table)
    assert b.gpus["key"].tolist() == ["h0/1"]


def test_peers_are_only_the_hosts_given_and_a_link_check_ignores_clocks():
    s = prepare(_frame())
    few = compare(s, _culprit(), ONSET, 40 * MIN, 15 * MIN, SignalRules(), COMPUTE_SIGNALS, hosts={"h0", "h3"})
    assert few.peer_gpus == 3                    # h0's other GPU and h3's two
    link = compare(s, _culprit(), ONSET, 40 * MIN, 15 * MIN, SignalRules(), LINK_SIGNALS)
    assert not link.table["fault"].any()         # the clock drop is not what a link is checked on
    assert set(link.table.loc[link.table["kind"] == "rate", "signal"]) == {gh.PCIE_REPLAYS}


def test_no_samples_and_no_culprit_samples_give_empty_answers():
    empty = compare(prepare(_frame().iloc[:0]), _culprit(), ONSET, MIN, MIN, SignalRules(), COMPUTE_SIGNALS)
    assert len(empty.table) == 0 and len(empty.gpus) == 0 and empty.peer_gpus == 0
    other = compare(prepare(_frame()), _culprit("h9"), ONSET, 40 * MIN, 15 * MIN, SignalRules(), COMPUTE_SIGNALS)
    assert len(other.table) == 0 and other.peer_gpus == 8


def test_gpus_without_an_index_are_told_apart_by_uuid():
    """A source that knows no index (Telegraf without ``index``, a rank with no ``gpu``) keeps a
    host's GPUs apart by UUID: the culprit is found by it and the host's other GPUs are peers."""
    f = _frame(hosts=1, gpus=3)
    f["gpu"] = -1
    found = compare(prepare(f), _culprit("h0", 7, "GPU-0-1"), ONSET, 40 * MIN, 15 * MIN, SignalRules(), COMPUTE_SIGNALS)
    assert found.gpus["uuid"].tolist() == ["GPU-0-1"] and found.peer_gpus == 2
    assert found.table.set_index("signal").loc[gh.SM_CLOCK, "fault"]


def test_an_increase_that_began_before_the_window_is_not_the_windows():
    """A double-bit ECC count that grew somewhere in a gap reaching back before the window is no
    error after the onset (it may have grown in the baseline or before it), nor part of a rate."""
    t = np.r_[np.arange(0, 6) * MIN, np.arange(61, 76) * MIN]
    rows = [pd.DataFrame({"host": f"h{h}", "gpu": 0, "uuid": "", "signal": gh.ECC_DBE, "time": t,
                          "value": np.where((t >= 61 * MIN) & (h == 0), 1.0, 0.0)}) for h in range(3)]
    s = prepare(pd.concat(rows, ignore_index=True))
    found = compare(s, _culprit("h0", 0), 60 * MIN, 40 * MIN, 15 * MIN, SignalRules(), COMPUTE_SIGNALS)
    assert not (found.table["kind"] == "error").any()
    # the same growth between two samples inside the window is an error after the onset
    t2 = np.arange(15, 76) * MIN
    rows = [pd.DataFrame({"host": f"h{h}", "gpu": 0, "uuid": "", "signal": gh.ECC_DBE, "time": t2,
                          "value": np.where((t2 >= 61 * MIN) & (h == 0), 1.0, 0.0)}) for h in range(3)]
    found = compare(prepare(pd.concat(rows, ignore_index=True)), _culprit("h0", 0), 60 * MIN, 40 * MIN, 15 * MIN,
                    SignalRules(), COMPUTE_SIGNALS)
    err = found.table[found.table["kind"] == "error"]
    assert err["signal"].tolist() == [gh.ECC_DBE] and bool(err["fault"].iloc[0])


def test_shuffled_samples_and_unequal_counts_give_the_same_numbers():
    f = _frame()
    f = f.drop(f[(f["host"] == "h3") & (f["time"] % (2 * MIN) == 0)].index)   # h3 sampled half as often
    a = compare(prepare(f), _culprit(), ONSET, 40 * MIN, 15 * MIN, SignalRules(), COMPUTE_SIGNALS)
    b = compare(prepare(f.sample(frac=1.0, random_state=3)), _culprit(), ONSET, 40 * MIN, 15 * MIN, SignalRules(),
                COMPUTE_SIGNALS)
    pd.testing.assert_frame_equal(a.table, b.table)
    cap = a.table.set_index("signal").loc["sw_power_cap"]
    assert cap["peers"] == 1.0   # pooled over every peer sample, whatever each GPU's count
