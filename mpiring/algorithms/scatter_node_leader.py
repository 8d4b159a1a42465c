"""Node-aware scatter, the node-aware gather's inverse: the root sends every other node's leader
that node's blocks in one message, and its own node's ranks their blocks, all in one step; then
each leader scatters its node's blocks inside its node. Each block crosses the network at most
once, and the root's link carries N-1 messages instead of one per rank of the other nodes.

Cost, N nodes of k ranks, n bytes scattered:
    ceil((N+k-2)/W) max(alpha_inter + (N-1)/N n beta_inter,      (the root to the leaders and its own
                        alpha_intra + n/(N k) beta_intra)         node's ranks, W = WINDOW messages per
                                                   step; the leaders' cross the root's link)
  + the scatter of n/N bytes in the other nodes    (linear: alpha_intra + (k-1)/(N k) n beta_intra)

    2 nodes x 2 ranks, root r0, blocks A B C D

    from the root           r0 ─B─► r1   r0 ─CD─► r2      (one step)
    scatter in the node                           r2 ─D─► r3

A node whose ranks are not consecutive gets its blocks as runs of consecutive ranks, one message
per run, received packed in member order. The root's sends are one step (WINDOW at a time), so
the call stays a sequence of steps each waited for before the next.
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.gather_node_leader import node_runs, packed_bounds, windows
from mpiring.algorithms.scatter_binomial import scatter_binomial
from mpiring.algorithms.scatter_linear import scatter_linear
from mpiring.algorithms.scatter_ring import scatter_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Steps
from mpiring.selection import flat_choice

FLAT = {"linear": scatter_linear, "binomial": scatter_binomial, "ring": scatter_steps}


def scatter_node_leader(ring: Ring, backend: NumpyBackend, tag: int, root: int, src: Any, mine: Any,
                        bounds: list[int]) -> Steps:
    """Scatter flat `src` (root only; block of rank k: bounds[k]:bounds[k+1]) into flat `mine`."""
    nodes, r = ring.nodes, ring.rank
    representatives = nodes.representatives(root)
    members = nodes.node(r)
    rep = representatives[nodes.node_of(r)]
    if rep == root:  # the root's node: every rank receives its block straight from the root
        if r != root:
            yield ring.post(backend, tag, receives=[(mine, root)])
            return
        # the root sends its node's blocks and the other nodes' runs at once, WINDOW per step
        outgoing = [(src[bounds[m] : bounds[m + 1]], m) for m in members if m != root]
        outgoing += [(src[at : at + length], leader) for leader, other in zip(representatives, nodes.nodes,
                                                                              strict=True)
                     if leader != root for _, at, length in node_runs(other, bounds)]
        later = windows(outgoing)
        step = ring.post(backend, tag, sends=later.pop(0)) if later else None
        backend.copy(mine, src[bounds[r] : bounds[r + 1]])  # while the first messages are in flight
        if step is not None:
            yield step
        for window in later:
            yield ring.post(backend, tag, sends=window)
        return
    node = SubRing(ring, members)
    local = packed_bounds(members, bounds)
    inside = FLAT[flat_choice("scatter", local[-1] * mine.itemsize, node.size)]
    if r != rep:
        yield from inside(node, backend, tag, node.members.index(rep), None, mine, local)
        return
    if node.size == 1:  # its own block only: received where it belongs (an empty one not at all)
        if mine.size:
            yield ring.post(backend, tag, receives=[(mine, root)])
        return
    with ring.scratch(backend, local[-1], mine.dtype) as packed:
        messages = [(packed[at : at + length], root) for at, _, length in node_runs(members, bounds)]
        for window in windows(messages):
            yield ring.post(backend, tag, receives=window)
        yield from inside(node, backend, tag, node.rank, packed, mine, local)
