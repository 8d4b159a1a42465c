"""The node map (mpiring.topology): virtual nodes cut as MPIRING_VIRTUAL_NODES says, leaders,
representatives and lanes on even and uneven nodes, `auto`'s node-aware rows, and which ranks
take turns on shared cores."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mpiring.engine.ring import Ring, SubRing
from mpiring.errors import ArgumentError
from mpiring.selection import NODE_SWITCH_POINTS, across_choice, choose
from mpiring.topology import NodeMap, _a_core_each, split_virtual

EIGHT = (tuple(range(8)),)


@pytest.mark.parametrize(("spec", "nodes"), [
    ("", EIGHT),
    ("1", EIGHT),
    ("2", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("3", ((0, 1, 2), (3, 4, 5), (6, 7))),
    ("2:round-robin", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("3:round-robin", ((0, 3, 6), (1, 4, 7), (2, 5))),
    ("5,3", ((0, 1, 2, 3, 4), (5, 6, 7))),
    ("1,1,6", ((0,), (1,), (2, 3, 4, 5, 6, 7))),
    ("9", tuple((r,) for r in range(8))),  # more virtual nodes than ranks: one rank each
])
def test_virtual_nodes_cut_each_node(spec, nodes):
    assert split_virtual(EIGHT, spec) == nodes


def test_virtual_nodes_cut_every_real_node_alike():
    assert split_virtual(((0, 2, 4, 6), (1, 3, 5, 7)), "2") == ((0, 2), (1, 3), (4, 6), (5, 7))


@pytest.mark.parametrize("spec", ["two", "0", "2:ring", "3,3", "2,x", "-1", "2,2:round-robin"])
def test_a_bad_virtual_node_spec_names_the_variable(spec):
    with pytest.raises(ArgumentError, match="MPIRING_VIRTUAL_NODES"):
        split_virtual(EIGHT, spec)


def test_uneven_nodes_have_lanes_of_the_smallest_node():
    nodes = NodeMap(((0, 1, 2), (3, 4)))
    assert nodes.size == 5 and nodes.leaders == (0, 3) and nodes.lanes == 2 and nodes.most_per_node == 3
    assert [nodes.lane(j) for j in range(3)] == [(0, 3), (1, 4), (2,)]
    assert [nodes.local_rank(r) for r in range(5)] == [0, 1, 2, 0, 1]
    assert nodes.representatives(4) == (0, 4) and nodes.representatives(2) == (2, 3)
    assert nodes.hierarchical and nodes.describe() == "2 nodes x 2/3 ranks"


def test_ranks_out_of_node_order():
    nodes = NodeMap(((0, 2), (1, 3)))
    assert nodes.node(3) == (1, 3) and nodes.node_of(2) == 0 and nodes.lane(1) == (2, 3)
    assert nodes.describe() == "2 nodes x 2 ranks (ranks not in node order)"


def test_one_node_keeps_the_flat_choices():
    nodes = NodeMap.single(4)
    assert not nodes.hierarchical
    for size in (8, 1 << 20):
        assert choose("allreduce", "auto", size, 4, nodes) == choose("allreduce", "auto", size, 4)


def test_a_rank_per_node_takes_the_rows_across_nodes():
    """Several nodes of one rank each: no node-aware algorithm differs from a flat one, but every
    message crosses the network, so the flat choices come from ACROSS_NODES_SWITCH_POINTS."""
    nodes = NodeMap(((0,), (1,), (2,), (3,)))
    assert not nodes.hierarchical
    assert choose("broadcast", "auto", 4 << 20, 4, nodes) == across_choice("broadcast", 4 << 20, 4) == "ring"
    assert choose("broadcast", "auto", 4 << 20, 4) == "linear"  # one node: the receivers copy side by side
    assert choose("allreduce", "auto", 8, 4, nodes) == "recursive_doubling"
    assert choose("scan", "auto", 8, 4, nodes) == choose("scan", "auto", 8, 4)  # not in the table: flat


def test_auto_takes_the_node_rows_on_several_nodes():
    nodes = NodeMap(((0, 1), (2, 3)))
    for collective, rows in NODE_SWITCH_POINTS.items():
        above = 8  # the smallest size past the rows before
        for largest, algorithm in rows:
            size = above if largest is None else largest
            above = size + 1
            chosen = choose(collective, "auto", size, 4, nodes)
            assert chosen == algorithm or (algorithm == "flat" and chosen == choose(collective, "auto", size, 4))
    assert choose("allreduce", "ring", 1 << 20, 4, nodes) == "ring"  # asked for: no switching


def test_a_machine_has_a_core_each_with_as_many_cores_as_ranks_there_or_started_there():
    def facts(cpus: set[int], started: int, ranks: int) -> list[tuple]:
        return [(0, "machine", frozenset(cpus), started)] * ranks

    assert _a_core_each(facts({0, 1}, 2, 2))
    assert not _a_core_each(facts({0, 1}, 4, 4))
    assert not _a_core_each(facts({0, 1}, 4, 2))  # a communicator of 2 of the 4 ranks started there
    assert _a_core_each(facts({0, 1, 2, 3}, 4, 4))
    assert _a_core_each([(0, "m", frozenset({0}), 2), (0, "m", frozenset({1}), 2)])  # each pinned to its own


def test_ranks_take_turns_only_all_on_one_node_whose_cores_they_outnumber():
    def ring(nodes: tuple, sharing: set[int], rank: int = 0) -> SimpleNamespace:
        size = sum(map(len, nodes))
        return SimpleNamespace(nodes=NodeMap(nodes), ranks_sharing_cores=frozenset(sharing), size=size, rank=rank)

    one_node = ((0, 1, 2, 3),)
    assert Ring.takes_turns(ring(one_node, {0, 1, 2, 3}))
    assert not Ring.takes_turns(ring(one_node, set()))
    two_nodes = ((0, 1), (2, 3))
    assert not Ring.takes_turns(ring(two_nodes, {0, 1, 2, 3}))  # a chain across nodes: its links run at once
    world = ring(two_nodes, {0, 1, 2, 3}, rank=1)
    assert SubRing(world, (0, 1)).takes_turns()  # a node of it
    assert not SubRing(world, (1, 3)).takes_turns()  # the leaders, across nodes
    assert not SubRing(ring(two_nodes, {2, 3}, rank=1), (0, 1)).takes_turns()  # that node has a core each
