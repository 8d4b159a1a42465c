"""Node-aware scatter, the node-aware gather's inverse: the root sends every other node's
representative (its leader) that node's blocks in one message, then each representative (the
root on its own node) scatters them inside its node. Each block crosses the network at most
once, and the root's link carries N-1 messages instead of one per rank of the other nodes.

Cost, N nodes of k ranks, n bytes scattered:
    ceil((N-1)/W) alpha_inter + (N-1)/N n beta_inter   (the root to the representatives, W = WINDOW
                                                   messages per step, all crossing the root's link)
  + the scatter of k n/(N k) bytes in the node     (linear: alpha_intra + (k-1)/(N k) n beta_intra)

    2 nodes x 2 ranks, root r0, blocks A B C D

    to the representatives  r0 ─CD─► r2
    scatter in the node     r0 ─B─► r1            r2 ─D─► r3

A node whose ranks are not consecutive gets its blocks as runs of consecutive ranks, one message
per run, received packed in member order. The root scatters its own node's blocks straight from
its input where that node's ranks are consecutive, and packs them first where they are not.
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.gather_node_leader import consecutive, node_runs, packed_bounds, windows
from mpiring.algorithms.scatter_binomial import scatter_binomial
from mpiring.algorithms.scatter_linear import scatter_linear
from mpiring.algorithms.scatter_ring import scatter_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.transport import Steps
from mpiring.ring import Ring, SubRing
from mpiring.selection import flat_choice

FLAT = {"linear": scatter_linear, "binomial": scatter_binomial, "ring": scatter_steps}


def scatter_node_leader(ring: Ring, backend: NumpyBackend, tag: int, root: int, src: Any, mine: Any,
                        bounds: list[int]) -> Steps:
    """Scatter flat `src` (root only; block of rank k: bounds[k]:bounds[k+1]) into flat `mine`."""
    nodes, r = ring.nodes, ring.rank
    representatives = nodes.representatives(root)
    members = nodes.node(r)
    rep = representatives[nodes.node_of(r)]
    node = SubRing(ring, members)
    local = packed_bounds(members, bounds)
    inside = FLAT[flat_choice("scatter", local[-1] * mine.itemsize, node.size)]
    if r != rep:
        yield from inside(node, backend, tag, node.members.index(rep), None, mine, local)
        return
    if r != root:
        if node.size == 1:  # its own block only: received where it belongs (an empty one not at all)
            if mine.size:
                yield ring.post(backend, tag, receives=[(mine, root)])
            return
        with ring.scratch(backend, local[-1], mine.dtype) as packed:
            messages = [(packed[at : at + length], root) for at, _, length in node_runs(members, bounds)]
            for window in windows(messages):
                yield ring.post(backend, tag, receives=window)
            yield from inside(node, backend, tag, node.rank, packed, mine, local)
        return
    # the root: the other nodes' runs leave its input while its own node scatters
    outgoing = [(src[at : at + length], other_rep) for other_rep, other in zip(representatives, nodes.nodes,
                                                                               strict=True)
                if other_rep != root for _, at, length in node_runs(other, bounds)]
    later = windows(outgoing)
    first = ring.post(backend, tag, sends=later.pop(0)) if later else None
    if consecutive(members):
        yield from inside(node, backend, tag, node.rank, src[bounds[members[0]] : bounds[members[-1] + 1]], mine, local)
    else:
        with ring.scratch(backend, local[-1], mine.dtype) as packed:
            for at, lo, length in node_runs(members, bounds):
                backend.copy(packed[at : at + length], src[lo : lo + length])
            yield from inside(node, backend, tag, node.rank, packed, mine, local)
    if first is not None:
        yield first
    for window in later:
        yield ring.post(backend, tag, sends=window)
