"""Node-aware gather: a gather inside each node but the root's to its leader, then every leader
sends its node's blocks to the root in one message, which the root receives together with the
blocks of its own node's ranks. Each block crosses the network at most once, and the root's link takes
N-1 messages instead of one per rank of the other nodes (a flat tree or ring over ranks not in
node order sends some blocks across several times).

Cost, N nodes of k ranks, n bytes gathered:
    the gather of n/N bytes in the other nodes     (linear: alpha_intra + (k-1)/(N k) n beta_intra)
  + ceil((N+k-2)/W) max(alpha_inter + (N-1)/N n beta_inter,      (the leaders and the root's node's
                        alpha_intra + (k-1)/(N k) n beta_intra)   ranks to the root, W = WINDOW
                                                   messages per step; the leaders' cross the root's link)

    2 nodes x 2 ranks, root r0, blocks A B C D

    gather in the node                            r3 ─D─► r2
    to the root            r1 ─B─► r0   r2 ─CD─► r0      (one step)

A node whose ranks are not consecutive sends its blocks as runs of consecutive ranks, one message
per run, each received straight into its place in the result. A leader gathers its node's blocks
packed in member order (runs then lie side by side). The root posts every receive of its call in
one step (WINDOW at a time), so the call stays a sequence of steps each waited for before the
next (a schedule the engine can record and replay).
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.gather_binomial import gather_binomial
from mpiring.algorithms.gather_linear import gather_linear
from mpiring.algorithms.gather_ring import gather_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import WINDOW, Steps
from mpiring.selection import flat_choice

FLAT = {"linear": gather_linear, "binomial": gather_binomial, "ring": gather_steps}


def packed_bounds(members: tuple[int, ...], bounds: list[int]) -> list[int]:
    """Bounds of the members' blocks packed one after another, in member order."""
    packed = [0]
    for m in members:
        packed.append(packed[-1] + bounds[m + 1] - bounds[m])
    return packed


def node_runs(members: tuple[int, ...], bounds: list[int]) -> list[tuple[int, int, int]]:
    """The members' blocks joined where their ranks are consecutive, as (offset in the packed
    blocks, offset in rank order, elements); empty runs left out."""
    packed = packed_bounds(members, bounds)
    spans, first = [], 0
    for i in range(1, len(members) + 1):
        if i == len(members) or members[i] != members[i - 1] + 1:
            length = packed[i] - packed[first]
            if length:
                spans.append((packed[first], bounds[members[first]], length))
            first = i
    return spans


def windows(messages: list[tuple[Any, int]]) -> list[list[tuple[Any, int]]]:
    """At most WINDOW messages per step (as the linear rooted algorithms post them)."""
    return [messages[first : first + WINDOW] for first in range(0, len(messages), WINDOW)]


def gather_node_leader(ring: Ring, backend: NumpyBackend, tag: int, root: int, own: Any, out: Any,
                       bounds: list[int]) -> Steps:
    """Gather flat `own` blocks into flat `out` at `root` (block of rank k: bounds[k]:bounds[k+1])."""
    nodes, r = ring.nodes, ring.rank
    representatives = nodes.representatives(root)
    members = nodes.node(r)
    mine = representatives[nodes.node_of(r)]
    if mine == root:  # the root's node: every rank sends its block straight into the result
        if r != root:
            yield ring.post(backend, tag, sends=[(own, root)])
            return
        # the root gathers its node's blocks and the other nodes' runs at once, WINDOW per step
        incoming = [(out[bounds[m] : bounds[m + 1]], m) for m in members if m != root]
        incoming += [(out[to : to + length], rep) for rep, other in zip(representatives, nodes.nodes, strict=True)
                     if rep != root for _, to, length in node_runs(other, bounds)]
        later = windows(incoming)
        step = ring.post(backend, tag, receives=later.pop(0)) if later else None
        backend.copy(out[bounds[r] : bounds[r + 1]], own)  # while the first messages are in flight
        if step is not None:
            yield step
        for window in later:
            yield ring.post(backend, tag, receives=window)
        return
    node = SubRing(ring, members)
    local = packed_bounds(members, bounds)
    inside = FLAT[flat_choice("gather", local[-1] * own.itemsize, node.size)]
    if r != mine:
        yield from inside(node, backend, tag, node.members.index(mine), own, None, local)
        return
    if node.size == 1:  # nothing to gather: the own block goes as it is (an empty one not at all)
        if own.size:
            yield ring.post(backend, tag, sends=[(own, root)])
        return
    with ring.scratch(backend, local[-1], own.dtype) as packed:
        yield from inside(node, backend, tag, node.rank, own, packed, local)
        messages = [(packed[at : at + length], root) for at, _, length in node_runs(members, bounds)]
        for window in windows(messages):
            yield ring.post(backend, tag, sends=window)
