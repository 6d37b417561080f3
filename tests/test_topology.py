import numpy as np
import pytest

from rankscope.topology import GROUP_KINDS, Topology, TopologyError, format_ranks, parse_ranks

IL = dict(tp=1, pp=9, dp=1440, ep=32, gpus_per_node=8)


def test_il0477_coordinates():
    t = Topology(**IL)
    assert t.world == 12960
    c = t.coords_of(10352)
    assert (c["pp"], c["dp"], c["node"]) == (7, 272, 1294)
    assert t.group_ranks("ep", 10352).tolist() == list(range(10336, 10368))
    assert t.group_ranks("pipeline", 10352).tolist() == [272 + 1440 * p for p in range(9)]
    assert t.group_ranks("pipeline", 10352)[-1] == 11792
    assert t.node_ranks([1294]).tolist() == list(range(10352, 10360))
    assert t.nodes_of(range(10352, 10360)).tolist() == [1294]
    dp_group = t.group_ranks("dp", 10352)
    assert dp_group.tolist() == list(range(7 * 1440, 8 * 1440))


def test_groups_partition_the_world_and_are_consistent():
    t = Topology(tp=2, pp=3, dp=8, ep=4, gpus_per_node=4)
    for kind in GROUP_KINDS:
        m = t.members(kind)
        assert m.shape == (t.group_count(kind), t.group_size(kind))
        assert np.array_equal(np.sort(m.reshape(-1)), t.ranks)
        ids = t.group_ids(kind)
        # every member of row g carries id g
        assert np.all(ids[m] == np.arange(m.shape[0])[:, None])
    # TP is fastest: ranks 0 and 1 share a TP group; DP group members share pp and tp
    assert t.group_ids("tp")[0] == t.group_ids("tp")[1]
    m = t.members("dp")
    assert np.all(t.pp_index[m] == t.pp_index[m[:, :1]])
    assert np.all(t.tp_index[m] == t.tp_index[m[:, :1]])
    e = t.members("ep")
    assert np.all(t.dp_index[e] // 4 == t.dp_index[e[:, :1]] // 4)
    # expert data parallel: the same position in every EP group of a DP group, one rank from each
    x = t.members("edp")
    assert x.shape == (3 * 2 * 4, 2)
    assert np.all(t.dp_index[x] % 4 == t.dp_index[x[:, :1]] % 4)
    assert np.all(t.group_ids("dp")[x] == t.group_ids("dp")[x[:, :1]])
    assert np.all(np.sort(t.group_ids("ep")[x], axis=1)[:, 1:] != np.sort(t.group_ids("ep")[x], axis=1)[:, :-1])
    assert "edp" in GROUP_KINDS


def test_rank_of_inverts_coordinates_for_every_order():
    for order in ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-dp-tp"):
        t = Topology(tp=2, pp=3, dp=4, ep=2, gpus_per_node=2, order=order)
        back = t.rank_of(tp=t.tp_index, pp=t.pp_index, dp=t.dp_index)
        assert np.array_equal(back, t.ranks)
    t = Topology(tp=2, pp=3, dp=4, order="pp-dp-tp")
    assert t.pp_index[:3].tolist() == [0, 1, 2]


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=1, pp=2, dp=10, ep=3), "ep=3 does not divide dp=10"),
    (dict(tp=1, pp=3, dp=3, gpus_per_node=8), "not divisible by gpus_per_node=8"),
    (dict(tp=0, pp=1, dp=1), "tp must be a positive integer"),
    (dict(tp=1, pp=1, dp=8, order="tp-pp"), "permutation"),
])
def test_inconsistent_sizes_are_refused(kwargs, message):
    with pytest.raises(TopologyError, match=message):
        Topology(**kwargs)


def test_rank_outside_world_is_refused():
    t = Topology(**IL)
    with pytest.raises(TopologyError, match="rank 12960 is outside the world 0..12959"):
        t.coords_of(12960)
    with pytest.raises(TopologyError, match="outside"):
        t.check_ranks([-1, 5])
    with pytest.raises(TopologyError, match="node 1620"):
        t.node_ranks([1620])
    with pytest.raises(TopologyError, match="unknown topology key"):
        Topology.from_dict({"tp": 1, "pp": 1, "dp": 8, "tensor": 2})


def test_hundred_thousand_ranks():
    t = Topology(tp=8, pp=10, dp=1250, ep=25, gpus_per_node=8)
    assert t.world == 100_000
    m = t.members("ep")
    assert m.shape == (4000, 25)
    assert np.array_equal(np.sort(m.reshape(-1)), t.ranks)


def test_rank_set_text_round_trips():
    assert parse_ranks("10352-10359").tolist() == list(range(10352, 10360))
    assert parse_ranks([1, "4-5", 9]).tolist() == [1, 4, 5, 9]
    assert format_ranks([7, 1, 2, 3, 9, 10]) == "1-3,7,9-10"
    assert format_ranks(parse_ranks("0,2-4,100")) == "0,2-4,100"
    with pytest.raises(ValueError, match="runs backwards"):
        parse_ranks("9-3")
    with pytest.raises(ValueError, match="not N or N-M"):
        parse_ranks("a-b")


def test_topology_is_inferred_from_tags():
    from rankscope.topology_inference import infer_topology
    for t in (Topology(**IL), Topology(tp=2, pp=3, dp=8, ep=4, gpus_per_node=4, order="tp-pp-dp")):
        r = np.setdiff1d(t.ranks, np.arange(5, 12))  # a few silent ranks do not matter
        back = infer_topology(r, t.tp_index[r], t.pp_index[r], t.dp_index[r], t.group_ids("ep")[r], t.node_index[r])
        assert back.to_dict() == {**t.to_dict()}
    with pytest.raises(TopologyError, match="no rank order"):
        t = Topology(tp=1, pp=2, dp=4, ep=2, gpus_per_node=2)
        infer_topology(t.ranks, t.tp_index, t.pp_index, t.dp_index, t.group_ids("ep"), (t.node_index + 1) % 4)
