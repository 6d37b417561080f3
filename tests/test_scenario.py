"""Scenario files: the built-ins load, every kind of bad input is refused naming the key and line."""

import numpy as np
import pytest

from simulator.scenario import (
    EventSpec,
    Fault,
    Scenario,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
)

TOPO = {"tp": 1, "pp": 4, "dp": 64, "ep": 8, "gpus_per_node": 8}


def test_builtins_cover_every_fault_kind_and_load():
    names = builtin_scenarios()
    for required in ["healthy", "il-0477", "compute-slowdown", "link-degradation", "stage-imbalance",
                     "transient-stall", "host-stall", "silent-rank"]:
        assert required in names
    kinds = set()
    for name in names:
        sc = load_scenario(name)
        assert sc.name == name and sc.description
        for f in sc.faults:
            kinds.add(f.kind)
            # a fair test: culprits are not simply the first ranks of the job
            assert f.ranks.min() > 0
    assert kinds == {"compute_slowdown", "link_degradation", "stage_imbalance", "transient_stall",
                     "host_stall", "silent_rank"}


def test_il0477_builtin_is_the_incident():
    sc = load_scenario("il-0477")
    assert sc.topology.world == 12960 and (sc.topology.pp, sc.topology.dp, sc.topology.ep) == (9, 1440, 32)
    (f,) = sc.faults
    assert f.kind == "compute_slowdown" and f.stage == "mlp" and f.factor == 5.7 and f.start == 30
    assert f.ranks.tolist() == list(range(10352, 10360))
    (ev,) = sc.events
    assert ev == EventSpec(name="server port down", at=31, node=1294, severity="critical",
                           source="noc-monitor", text=ev.text)


def test_selectors_resolve_ranks_nodes_and_stages():
    sc = Scenario.from_dict({
        "topology": TOPO,
        "fault": [
            {"kind": "compute_slowdown", "ranks": [3, "10-12"], "factor": 2, "stage": "mlp"},
            {"kind": "link_degradation", "node": "5-6", "factor": 3},
            {"kind": "stage_imbalance", "pp": 2, "factor": 1.5},
            {"kind": "transient_stall", "ranks": 7, "factor": 10, "start": 4},
            {"kind": "host_stall", "node": 1, "factor": 4},
            {"kind": "silent_rank", "ranks": 9, "start": 2, "end": 5},
        ],
    })
    f = sc.faults
    assert f[0].ranks.tolist() == [3, 10, 11, 12] and f[0].factor == 2.0
    assert f[1].ranks.tolist() == list(range(40, 56)) and f[1].stage is None
    assert f[2].ranks.tolist() == list(range(128, 192)) and f[2].stage is None
    assert (f[3].stage, f[3].start, f[3].end) == ("attention", 4, 7)  # default length 3
    assert f[4].stage == "dataloader" and f[4].ranks.tolist() == list(range(8, 16))
    assert f[5].active(2) and f[5].active(4) and not f[5].active(5) and not f[5].active(1)
    assert isinstance(f[0], Fault) and f[0].ranks.dtype == np.int64


def test_with_overrides_copies():
    sc = load_scenario("compute-slowdown")
    other = sc.with_overrides(iterations=5, seed=99, job="x")
    assert (other.iterations, other.seed, other.job) == (5, 99, "x")
    assert (sc.iterations, sc.seed, sc.job) == (40, 3, "compute-slowdown")
    assert other.faults == sc.faults
    with pytest.raises(ScenarioError, match="iterations"):
        sc.with_overrides(iterations=0)


GOOD = """\
description = "test"

[topology]
tp = 1
pp = 4
dp = 64
ep = 8
gpus_per_node = 8

[run]
job = "t"
iterations = 10

[[fault]]
kind = "compute_slowdown"
ranks = "10-12"
stage = "mlp"
factor = 2.0

[[fault]]
kind = "host_stall"
node = 3
factor = 4.0
"""


@pytest.mark.parametrize("old,new,line,words", [
    ('ranks = "10-12"', 'ranks = "10-9999"', 16, ["fault[0].ranks", "outside the world"]),
    ('ranks = "10-12"', 'ranks = "12-10"', 16, ["fault[0].ranks", "backwards"]),
    ('ranks = "10-12"', 'ranks = "ten"', 16, ["fault[0].ranks", "'ten'"]),
    ('stage = "mlp"', 'stage = "mlpp"', 17, ["fault[0].stage", "unknown stage 'mlpp'"]),
    ('stage = "mlp"', 'stage = "dispatch"', 17, ["fault[0].stage", "comm stage"]),
    ("node = 3", "node = 400", 22, ["fault[1].node", "node 400 is outside"]),
    ("factor = 4.0", "factor = -1", 23, ["fault[1].factor", "positive"]),
    ("factor = 4.0", "factor = 4.0\nspeed = 3", 24, ["fault[1].speed", "unknown key 'speed'"]),
    ('kind = "host_stall"', 'kind = "gremlins"', 21, ["fault[1].kind", "unknown fault kind"]),
    ("iterations = 10", "iterations = 0", 12, ["run.iterations", "positive"]),
    ("iterations = 10", "iterations = 10\nbogus = 1", 13, ["run.bogus", "unknown key"]),
    ("ep = 8", "ep = 7", 3, ["topology", "does not divide"]),
])
def test_bad_files_name_key_and_line(tmp_path, old, new, line, words):
    path = tmp_path / "bad.toml"
    assert old in GOOD
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    msg = str(exc.value)
    assert f"line {line}:" in msg, msg
    for w in words:
        assert w in msg, msg
    assert str(path) in msg


def test_good_file_loads(tmp_path):
    path = tmp_path / "good.toml"
    path.write_text(GOOD)
    sc = load_scenario(path)
    assert sc.job == "t" and sc.iterations == 10 and len(sc.faults) == 2
    assert sc.faults[1].ranks.tolist() == list(range(24, 32))


@pytest.mark.parametrize("fault,words", [
    ({"kind": "stage_imbalance", "ranks": 3, "factor": 2}, ["pp = N"]),
    ({"kind": "stage_imbalance", "pp": 4, "factor": 2}, ["pipeline stage 4 is outside 0..3"]),
    ({"kind": "silent_rank", "ranks": 3, "factor": 2}, ["takes no factor"]),
    ({"kind": "link_degradation", "ranks": 3, "factor": 2, "stage": "mlp"}, ["takes no stage"]),
    ({"kind": "host_stall", "ranks": 3, "factor": 2, "stage": "mlp"}, ["host stage", "compute stage"]),
    ({"kind": "compute_slowdown", "ranks": 3}, ["needs a factor"]),
    ({"kind": "compute_slowdown", "ranks": 3, "node": 1, "factor": 2}, ["exactly one of"]),
    ({"kind": "compute_slowdown", "ranks": 3, "factor": 2, "start": 5, "end": 5}, ["end (5) must be after"]),
])
def test_bad_faults_are_refused(fault, words):
    with pytest.raises(ScenarioError) as exc:
        Scenario.from_dict({"topology": TOPO, "fault": [fault]})
    for w in words:
        assert w in str(exc.value)


def test_bad_events_and_tables_are_refused():
    with pytest.raises(ScenarioError, match=r"event\[0\]\.at.*missing"):
        Scenario.from_dict({"topology": TOPO, "event": [{"name": "x"}]})
    with pytest.raises(ScenarioError, match=r"rank 3 is on node 0, not 2"):
        Scenario.from_dict({"topology": TOPO, "event": [{"name": "x", "at": 1, "node": 2, "rank": 3}]})
    with pytest.raises(ScenarioError, match="missing: a scenario needs a \\[topology\\]"):
        Scenario.from_dict({"run": {"iterations": 3}})
    with pytest.raises(ScenarioError, match="model.*mlp_ms"):
        Scenario.from_dict({"topology": TOPO, "model": {"mlp_ms": -1}})
    with pytest.raises(ScenarioError, match="no scenario 'nope'.*built-ins: .*il-0477"):
        load_scenario("nope")
    ev = Scenario.from_dict({"topology": TOPO, "event": [{"name": "x", "at": 1, "rank": 17}]}).events[0]
    assert ev.node == 2 and ev.rank == 17


def test_invalid_toml_is_reported(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[topology\npp = 1\n")
    with pytest.raises(ScenarioError, match="invalid TOML"):
        load_scenario(path)


def test_programmatic_scenarios_accept_numpy_values():
    sc = Scenario.from_dict({"topology": TOPO, "run": {"iterations": np.int64(3), "seed": np.int64(4)},
                             "fault": [{"kind": "compute_slowdown", "ranks": np.array([9, 5]),
                                        "factor": np.float64(2.0), "start": np.int64(1)}]})
    assert sc.iterations == 3 and sc.faults[0].ranks.tolist() == [5, 9] and sc.faults[0].start == 1


def test_faults_compare_by_value():
    a = Scenario.from_dict({"topology": TOPO, "fault": [{"kind": "host_stall", "node": 2, "factor": 3}]})
    b = Scenario.from_dict({"topology": TOPO, "fault": [{"kind": "host_stall", "ranks": "16-23", "factor": 3}]})
    c = Scenario.from_dict({"topology": TOPO, "fault": [{"kind": "host_stall", "ranks": "16-22", "factor": 3}]})
    assert a.faults == b.faults and a.faults != c.faults
