"""Node-aware reduce: a reduce inside each node to its representative (the root on the root's
node, the leader elsewhere), then a flat reduce among the representatives to the root (MPICH's
"smp" reduce). Each node's partial result crosses its link once.

Cost, N nodes of k ranks, n bytes per rank:
    ceil(lg k) (alpha_intra + n beta_intra + n gamma)     (binomial reduce in the node)
  + the representatives' reduce over N ranks  (binomial: ceil(lg N) (alpha_inter + n (beta_inter + gamma)))

    2 nodes x 2 ranks, root r0

    in each node   r1 ─► r0   r3 ─► r2
    across nodes   r2 ─────► r0
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.reduce_binomial import reduce_binomial
from mpiring.algorithms.reduce_ring import reduce_ring
from mpiring.algorithms.reduce_scattered import reduce_scattered
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Steps
from mpiring.ops import AVG, SUM
from mpiring.selection import across_choice

FLAT = {"binomial": reduce_binomial, "ring": reduce_ring, "scattered": reduce_scattered}


def reduce_node_leader(ring: Ring, backend: NumpyBackend, tag: int, root: int, src: Any, out: Any,
                       op: str) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` on `root` (None elsewhere)."""
    nodes = ring.nodes
    representatives = nodes.representatives(root)
    mine = representatives[nodes.node_of(ring.rank)]
    node = SubRing(ring, nodes.node(ring.rank))
    summing = SUM if op == AVG else op  # the division by every rank's count comes once, at the end
    partial = backend.empty(src.size, src.dtype) if ring.rank == mine else None
    yield from reduce_binomial(node, backend, tag, node.members.index(mine), src, partial, summing)
    if ring.rank == mine:
        across = SubRing(ring, representatives)
        flat = FLAT[across_choice("reduce", src.nbytes, across.size)]
        yield from flat(across, backend, tag, nodes.node_of(root), partial, out, summing)
    if ring.rank == root:
        backend.finish(op, out, ring.size)
