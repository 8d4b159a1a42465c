"""Node-aware broadcast: the root's data crosses to one rank of every other node (a flat
broadcast among the nodes' representatives), then each representative broadcasts inside its
node (MPICH's "smp" broadcast). The data crosses each node's link once, where a flat tree or
ring over every rank sends it across once per rank of a node that is not in node order.

Cost, N nodes of k ranks, n bytes:
    the representatives' broadcast over N ranks     (binomial: ceil(lg N) (alpha_inter + n beta_inter))
  + the broadcast in the node over k ranks          (linear: alpha_intra + n beta_intra, the receivers copying at once)

    2 nodes x 2 ranks, root r1

    across nodes   r1 ─────► r2         (r1 represents node 0, r2 node 1)
    in each node   r1 ─► r0  r2 ─► r3
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.broadcast_binomial import broadcast_binomial
from mpiring.algorithms.broadcast_linear import broadcast_linear
from mpiring.algorithms.broadcast_ring import broadcast_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Steps
from mpiring.selection import across_choice, flat_choice

FLAT = {"linear": broadcast_linear, "binomial": broadcast_binomial, "ring": broadcast_steps}


def broadcast_node_leader(ring: Ring, backend: NumpyBackend, tag: int, root: int, buf: Any,
                          src: Any = None) -> Steps:
    """Broadcast flat `buf` from `root` (the contract of mpiring.algorithms.broadcast_binomial)."""
    nodes = ring.nodes
    representatives = nodes.representatives(root)
    mine = representatives[nodes.node_of(ring.rank)]
    if ring.rank == mine:
        across = SubRing(ring, representatives)
        flat = FLAT[across_choice("broadcast", buf.nbytes, across.size)]
        yield from flat(across, backend, tag, nodes.node_of(root), buf, src)
    node = SubRing(ring, nodes.node(ring.rank))
    flat = FLAT[flat_choice("broadcast", buf.nbytes, node.size)]
    yield from flat(node, backend, tag, node.members.index(mine), buf)
