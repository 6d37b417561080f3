"""Link degradation names the node behind the slow NIC, not its whole collective group."""

import numpy as np
import pytest

from analyzer.job_analyzer import JobAnalyzer
from evaluation.accuracy import result_cube
from rankscope.frames import LatencyCube
from rankscope.incident import IncidentClass
from rankscope.schema import DEFAULT_STAGES, StageSet
from simulator.cluster import ClusterSimulator
from simulator.scenario import Scenario


def _incidents(topology: dict, node: int, factor: float, iterations: int = 40, seed: int = 5,
               without: tuple[str, ...] = ()):
    """The incidents of a NIC fault; ``without``: stages the collector does not time."""
    sc = Scenario.from_dict({"topology": topology, "run": {"job": "lk", "iterations": iterations, "seed": seed},
                             "fault": [{"kind": "link_degradation", "node": node, "factor": factor,
                                        "start": 25 if iterations > 30 else 18}]})
    sim = ClusterSimulator(sc)
    stages = StageSet(tuple(s for s in DEFAULT_STAGES if s.name not in without))
    keep = [sim.stages.names.index(n) for n in stages.names]
    ja = JobAnalyzer("lk", sc.topology, stages)
    latest = {}
    for _ in range(iterations):
        cube = result_cube(sim.step(), sim.stages.names)
        cube = LatencyCube(cube.iterations, cube.times, list(stages.names), cube.values[:, :, keep],
                           cube.iteration_ms)
        for inc in ja.feed(cube).incidents:
            latest[inc.id] = inc
    return sc.topology, list(latest.values())


@pytest.mark.slow
def test_il0477_shaped_nic_degradation_names_exactly_its_node():
    """tp=1 pp=9 dp=1440 ep=32, 8 GPUs a node, the NIC of one node x4 from iteration 25: the
    node's 8 ranks, not the 32 of its EP group (their own pipeline hops are what is slow)."""
    topo, incidents = _incidents({"tp": 1, "pp": 9, "dp": 1440, "ep": 32, "gpus_per_node": 8}, 1294, 4.0)
    (inc,) = incidents
    assert inc.cls == IncidentClass.LINK_DEGRADATION
    assert inc.ranks == list(range(10352, 10360)) and inc.nodes == [1294]
    assert inc.hosts == ["gpu-node-01294"] and inc.evidence["ambiguous"] is False


@pytest.mark.parametrize("topology", [
    {"tp": 1, "pp": 4, "dp": 64, "ep": 16, "gpus_per_node": 8},    # EP group spans two nodes
    {"tp": 2, "pp": 4, "dp": 32, "ep": 8, "gpus_per_node": 8},     # a node holds both TP ranks
    {"tp": 1, "pp": 8, "dp": 32, "ep": 4, "gpus_per_node": 8},     # a node holds two whole EP groups
])
def test_small_shapes_name_the_node(topology):
    world = topology["tp"] * topology["pp"] * topology["dp"]
    node = world // topology["gpus_per_node"] // 2 + 1
    topo, incidents = _incidents(topology, node, 4.0, iterations=35)
    (inc,) = incidents
    assert inc.cls == IncidentClass.LINK_DEGRADATION
    assert inc.ranks == topo.node_ranks([node]).tolist()
    assert not inc.evidence["ambiguous"]


def test_without_pipeline_hops_the_expert_reduce_separates_the_node_from_its_ep_group():
    """pp=1 and EP groups wider than a node: the all-to-alls and the DP ring hold nodes 8 and 9
    alike, but the expert gradients of node 8's ranks are reduced with other nodes than node
    9's (one rank per EP group holds the same experts), so only node 8's expert groups slow."""
    topology = {"tp": 1, "pp": 1, "dp": 128, "ep": 16, "gpus_per_node": 8}
    topo, incidents = _incidents(topology, 8, 5.0, iterations=35)
    (inc,) = incidents
    assert inc.ranks == topo.node_ranks([8]).tolist() and inc.evidence["ambiguous"] is False
    assert "expert_reduce (edp)" in inc.evidence["summary"]
    assert "expert-data-parallel" in inc.evidence["summary"]


def test_without_a_timing_that_separates_the_smallest_supported_set_is_flagged_ambiguous():
    """The same fault timed by a collector that cannot tell the expert reduce from the dense one:
    every collective of node 8 also holds node 9; both are named, flagged ambiguous."""
    topology = {"tp": 1, "pp": 1, "dp": 128, "ep": 16, "gpus_per_node": 8}
    topo, incidents = _incidents(topology, 8, 5.0, iterations=35, without=("expert_reduce",))
    (inc,) = incidents
    ep_group = topo.group_ranks("ep", 64)
    assert set(topo.node_ranks([8]).tolist()) <= set(inc.ranks) <= set(ep_group.tolist())
    assert inc.evidence["ambiguous"] is True
    assert "smallest set the data supports" in inc.evidence["summary"]
    assert np.array_equal(topo.nodes_of(inc.ranks), [8, 9])


def test_a_second_nic_fault_during_an_open_one_is_a_second_incident():
    sc = Scenario.from_dict({"topology": {"tp": 1, "pp": 4, "dp": 64, "ep": 16, "gpus_per_node": 8},
                             "run": {"job": "two", "iterations": 50, "seed": 3},
                             "fault": [{"kind": "link_degradation", "node": 17, "factor": 5.0, "start": 20},
                                       {"kind": "link_degradation", "node": 5, "factor": 5.0, "start": 32}]})
    sim = ClusterSimulator(sc)
    ja = JobAnalyzer("two", sc.topology, DEFAULT_STAGES)
    for _ in range(sc.iterations):
        ja.feed(result_cube(sim.step(), sim.stages.names))
    by_node = sorted((inc.nodes, inc.onset_iteration) for inc in ja.incidents())
    assert [n for n, _ in by_node] == [[5], [17]]
    assert dict((n[0], o) for n, o in by_node) == {17: 20, 5: 32}
    for inc in ja.incidents():   # the excess is the link's: fixed, the job is back where it was
        assert inc.impact.iteration_s_if_restored == pytest.approx(inc.impact.iteration_s_before, rel=0.01)
