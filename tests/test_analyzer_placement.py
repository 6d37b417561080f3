"""The node grouping follows the hosts the ranks report, not ``rank // gpus_per_node``."""

from __future__ import annotations

import numpy as np

from analyzer.service.analyzer_service import AnalyzerService
from rankscope.store import EmbeddedStore
from simulator.cluster import ClusterSimulator
from simulator.scenario import load_scenario

START = 1_770_000_000_000


def _run(tmp_path, host_of, iterations=32):
    """compute-slowdown (rank 1379 x2.5 from iteration 20) with the host tags ``host_of(it, ranks)``."""
    store = EmbeddedStore(tmp_path / "s.db")
    scenario = load_scenario("compute-slowdown").with_overrides(iterations=iterations)
    sim = ClusterSimulator(scenario)
    for _ in range(iterations):
        res = sim.step()
        frame = sim.frame(res, time_ms=START + 30_000 * res.iteration)
        frame["host"] = host_of(res.iteration, frame["rank"].to_numpy())
        store.write_stage_latency(frame)
    svc = AnalyzerService(store)
    svc.cycle(final=True)
    return svc, scenario


def test_a_scheduler_placement_that_is_not_rank_blocks(tmp_path):
    """Ranks spread over hosts by a permutation (as SLURM's or torchrun's placement may): the
    incident names the host rank 1379 really ran on, and its node is that host's."""
    perm = np.random.default_rng(5).permutation(2048)
    names = np.array([f"sched-host-{i:03d}" for i in range(256)], dtype=object)

    def host_of(_it, ranks):
        return names[perm[ranks] // 8]

    svc, scenario = _run(tmp_path, host_of)
    (inc,) = svc.incidents()
    assert inc.ranks == [1379]
    assert inc.hosts == [names[perm[1379] // 8]]
    topo = svc.analyzers[scenario.job].topo
    same_host = np.flatnonzero(perm // 8 == perm[1379] // 8)
    assert topo.node_ranks(inc.nodes).tolist() == same_host.tolist()     # the node is the host's ranks


def test_a_node_replaced_before_the_fault_is_named_by_its_new_host(tmp_path):
    """From iteration 10 the ranks of node 172 run on a spare (an elastic restart): the analyzer
    follows the reported hosts, and the straggler found later is on the spare."""
    def host_of(it, ranks):
        hosts = np.array([f"gpu-node-{r // 8:05d}" for r in ranks], dtype=object)
        if it >= 10:
            hosts[ranks // 8 == 172] = "spare-0001"
        return hosts

    svc, _ = _run(tmp_path, host_of)
    (inc,) = svc.incidents()
    assert inc.ranks == [1379] and inc.hosts == ["spare-0001"]
