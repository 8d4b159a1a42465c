"""Node-aware all-gather: each node's leader gathers its ranks' chunks, the leaders exchange their
nodes' chunks all at once, and each leader broadcasts the whole result in its node. Every chunk
crosses into each other node once, where a flat ring over ranks in node order forwards (N k - 1)
chunks through each node's link, one per step.

Cost, N nodes of k ranks, n bytes of result:
    alpha_intra + (k-1)/(N k) n beta_intra                (the gather in the node, one step)
  + alpha_inter + (N-1)/N n beta_inter                    (the leaders' exchange: each node's n/N to every other,
                                                          all at once; large results, nodes in rank order: a ring,
                                                          N-1 steps, each link carrying (N-1)/N n once)
  + the broadcast of n bytes in the node                  (linear: alpha_intra + (k-1) n beta_intra)

    2 nodes x 2 ranks, chunks A B C D

    gather in the node       r1 ─B─► r0            r3 ─D─► r2
    leaders exchange         r0 ─AB─► r2           r2 ─CD─► r0
    broadcast in the node    r0 ─ABCD─► r1         r2 ─ABCD─► r3

A node whose ranks are not consecutive sends its chunks as runs of consecutive ranks, each run
one message, so the result stays in rank order.
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allgather_ring import allgather_steps
from mpiring.algorithms.broadcast_node_leader import FLAT as FLAT_BROADCASTS
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Steps
from mpiring.selection import across_choice, flat_choice


def runs(buf: Any, bounds: list[int], members: tuple[int, ...]) -> list[Any]:
    """The chunks of `members` in `buf`, joined where their ranks are consecutive (empty ones left out)."""
    views, first = [], 0
    for i in range(1, len(members) + 1):
        if i == len(members) or members[i] != members[i - 1] + 1:
            lo, hi = bounds[members[first]], bounds[members[i - 1] + 1]
            if hi > lo:
                views.append(buf[lo:hi])
            first = i
    return views


def _in_node_order(nodes: tuple[tuple[int, ...], ...]) -> bool:
    """Whether the nodes hold ranks 0, 1, ... in turn: each node's chunks are then one block."""
    return [r for node in nodes for r in node] == list(range(sum(len(node) for node in nodes)))


def allgather_node_leader(ring: Ring, backend: NumpyBackend, tag: int, buf: Any, bounds: list[int],
                          src: Any = None) -> Steps:
    """The ring all-gather's contract (mpiring.algorithms.allgather_ring): the own chunk is in
    `buf` already, or is `src`, sent from there and copied into its place meanwhile."""
    nodes, r = ring.nodes, ring.rank
    members = nodes.node(r)
    leader = members[0]
    own = buf[bounds[r] : bounds[r + 1]]
    if r != leader:
        step = ring.post(backend, tag, sends=[(own if src is None else src, leader)])
    else:
        step = ring.post(backend, tag, receives=[(buf[bounds[m] : bounds[m + 1]], m) for m in members[1:]])
    if src is not None:
        backend.copy(own, src)
    yield step
    in_ring = _in_node_order(nodes.nodes) and across_choice("allgather", buf.nbytes, len(nodes.nodes)) == "ring"
    if r == leader and in_ring:  # large results: the leaders' ring passes each node's block once through every link
        node_bounds = [bounds[node[0]] for node in nodes.nodes] + [bounds[-1]]
        yield from allgather_steps(SubRing(ring, nodes.leaders), backend, tag, buf, node_bounds)
    elif r == leader:
        others = [node for node in nodes.nodes if node[0] != leader]
        mine = runs(buf, bounds, members)
        yield ring.post(backend, tag, sends=[(view, node[0]) for node in others for view in mine],
                        receives=[(view, node[0]) for node in others for view in runs(buf, bounds, node)])
    node = SubRing(ring, members)
    yield from FLAT_BROADCASTS[flat_choice("broadcast", buf.nbytes, node.size)](node, backend, tag, 0, buf)
