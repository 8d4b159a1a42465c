"""Node-aware reduce-scatter: a reduce inside each node to its leader, a reduce-scatter among the
leaders in which leader j keeps node j's blocks (its ranks' chunks), then a scatter of those
chunks inside each node. Each node's data is summed before it crosses the network: a node sends
(N-1)/N n bytes across its link, where a flat ring over ranks sends (Nk-1)/(Nk) n in Nk-1 steps
and the scattered reduce-scatter (every input chunk straight to its owner) k (N-1)/N n.

Cost, N nodes of k ranks, n bytes per rank:
    the reduce of n bytes in the node               (binomial: ceil(lg k) (alpha_intra + n beta_intra + n gamma))
  + the leaders' reduce-scatter of n bytes over N   (ring: (N-1) (alpha_inter + n/N beta_inter + n/N gamma))
  + the scatter of the node's n/N bytes in it       (linear: alpha_intra + (k-1)/(N k) n beta_intra)

    2 nodes x 2 ranks, chunks 0 1 2 3 of every rank's vector; "01:23" = chunks 0 1 summed over r2 r3

    reduce in the node     r1 ─► r0               r3 ─► r2
    leaders                r0 ─23:01─► r2         r2 ─01:23─► r0      (each adds the other's part)
    scatter in the node    r0 ─1─► r1             r2 ─3─► r3

Uneven chunks (counts=) and nodes whose ranks are not consecutive: a leader lays its node's
partial out by node before the leaders' reduce-scatter (one copy, only where the nodes' ranks
are not in node order), so node j's chunks are one block, its members' chunks in member order.
Each chunk is reduced in one fixed order (inside its node, then across the nodes in the order
of the leaders' algorithm), so every run gives the same bits.
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allgather_node_leader import _in_node_order
from mpiring.algorithms.gather_node_leader import node_runs, packed_bounds
from mpiring.algorithms.reduce_node_leader import FLAT as FLAT_REDUCES
from mpiring.algorithms.reduce_scatter_recursive_halving import reduce_scatter_recursive_halving
from mpiring.algorithms.reduce_scatter_ring import reduce_scatter_steps
from mpiring.algorithms.reduce_scatter_ring_pipelined import pipelined_reduce_scatter_steps
from mpiring.algorithms.reduce_scatter_scattered import reduce_scatter_scattered
from mpiring.algorithms.scatter_node_leader import FLAT as FLAT_SCATTERS
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Steps
from mpiring.ops import AVG, SUM
from mpiring.selection import across_choice, flat_choice

ACROSS_NODES = {
    "ring": reduce_scatter_steps,
    "ring_pipelined": pipelined_reduce_scatter_steps,
    "recursive_halving": reduce_scatter_recursive_halving,
    "scattered": reduce_scatter_scattered,
}


def reduce_scatter_node_leader(ring: Ring, backend: NumpyBackend, tag: int, src: Any, bounds: list[int], op: str,
                               result: Any) -> Steps:
    """The ring reduce-scatter's contract (mpiring.algorithms.reduce_scatter_ring), `result` not
    overlapping `src`."""
    nodes, r = ring.nodes, ring.rank
    members = nodes.node(r)
    node = SubRing(ring, members)
    summing = SUM if op == AVG else op  # the division by every rank's count comes once, at the end
    local = packed_bounds(members, bounds)
    scatter = FLAT_SCATTERS[flat_choice("scatter", local[-1] * src.itemsize, node.size)]
    if node.rank != 0:
        yield from FLAT_REDUCES[flat_choice("reduce", src.nbytes, node.size)](node, backend, tag, 0, src, None,
                                                                               summing)
        yield from scatter(node, backend, tag, 0, None, result, local)
        backend.finish(op, result, ring.size)
        return
    in_order = _in_node_order(nodes.nodes)
    # the leader's node partial, laid out by node: node j's chunks from node_bounds[j]
    node_bounds = [0]
    for other in nodes.nodes:
        node_bounds.append(node_bounds[-1] + packed_bounds(other, bounds)[-1])
    with ring.scratch(backend, src.size, src.dtype) as partial, \
            ring.scratch(backend, 0 if node.size == 1 else local[-1], src.dtype) as region:
        reduce = FLAT_REDUCES[flat_choice("reduce", src.nbytes, node.size)]
        if in_order:
            yield from reduce(node, backend, tag, 0, src, partial, summing)
            by_node = partial
        else:
            with ring.scratch(backend, src.size, src.dtype) as reduced:
                yield from reduce(node, backend, tag, 0, src, reduced, summing)
                by_node = partial
                for j, other in enumerate(nodes.nodes):
                    for at, lo, length in node_runs(other, bounds):
                        start = node_bounds[j] + at
                        backend.copy(by_node[start : start + length], reduced[lo : lo + length])
        mine = result if node.size == 1 else region  # this node's chunks, reduced over every node
        leaders = SubRing(ring, nodes.leaders)
        across = ACROSS_NODES[across_choice("reduce_scatter", src.nbytes, leaders.size)]
        yield from across(leaders, backend, tag, by_node, node_bounds, summing, mine)
        if node.size > 1:
            yield from scatter(node, backend, tag, 0, region, result, local)
    backend.finish(op, result, ring.size)
