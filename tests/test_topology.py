"""The node map (mpiring.topology): virtual nodes cut as MPIRING_VIRTUAL_NODES says, leaders,
representatives and lanes on even and uneven nodes, and `auto`'s node-aware rows."""

from __future__ import annotations

import pytest

from mpiring.errors import ArgumentError
from mpiring.selection import NODE_SWITCH_POINTS, across_choice, choose
from mpiring.topology import NodeMap, split_virtual

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
