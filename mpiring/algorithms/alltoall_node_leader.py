"""Node-aware all-to-all, aggregated per node pair: each node's leader gathers its ranks' inputs,
sends every other node's leader one message holding all the blocks its node has for that node,
and hands each of its ranks the blocks addressed to it. For small blocks, where each message
costs its latency: N-1 messages cross each node's link instead of k (N-1) k.

Cost, N nodes of k ranks, b bytes per block (n = N k b bytes of input per rank):
    alpha_intra + (k-1) n beta_intra                   (the leader gathers its ranks' inputs)
  + alpha_inter + (N-1) k^2 b beta_inter               (one message to each other node's leader)
  + alpha_intra + (k-1) n beta_intra                   (the leader hands out the results)
  + 2 k n copies at the leader                         (packing per node, unpacking per rank)

    2 nodes x 2 ranks; "02" = the block rank 0 holds for rank 2

    gather in the node     r1 ─10 11 12 13─► r0                     r3 ─► r2 likewise
    leaders exchange       r0 ─02 03 12 13─► r2                     r2 ─20 21 30 31─► r0
    hand out               r0 ─01 11 21 31─► r1   (r0 keeps 00 10 20 30)

Blocks are equal (the all-to-all's; all-to-all-v's counts are known to their own ranks only).
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def alltoall_node_leader(ring: Ring, backend: NumpyBackend, tag: int, src: Any, send_bounds: list[int], out: Any,
                         recv_bounds: list[int]) -> Steps:
    """The pairwise exchange's contract (mpiring.algorithms.alltoall_pairwise), for equal blocks."""
    p, r, nodes = ring.size, ring.rank, ring.nodes
    b = send_bounds[1] - send_bounds[0]
    members = nodes.node(r)
    leader = members[0]
    if r != leader:  # the whole input to the leader; the whole result back from it
        yield ring.post(backend, tag, sends=[(src, leader)], receives=[(out, leader)])
        return
    k = len(members)
    rows = backend.empty(k * p * b, src.dtype)  # rows[i]: member i's input, block d for rank d

    def block(i: int, d: int) -> Any:  # member i's block for rank d
        return rows[(i * p + d) * b : (i * p + d + 1) * b]

    step = ring.post(backend, tag, receives=[(rows[i * p * b : (i + 1) * p * b], members[i]) for i in range(1, k)])
    backend.copy(rows[: p * b], src)
    yield step
    others = [node for node in nodes.nodes if node[0] != leader]
    # one message per other node: (my member i, their member j) blocks, i major
    outgoing = [backend.empty(k * len(node) * b, src.dtype) for node in others]
    incoming = [backend.empty(len(node) * k * b, src.dtype) for node in others]
    for pack, node in zip(outgoing, others, strict=True):
        for i in range(k):
            for j, d in enumerate(node):
                at = (i * len(node) + j) * b
                backend.copy(pack[at : at + b], block(i, d))
    if others:
        yield ring.post(backend, tag, sends=[(pack, node[0]) for pack, node in zip(outgoing, others, strict=True)],
                        receives=[(pack, node[0]) for pack, node in zip(incoming, others, strict=True)])
    # where the block from rank s to my member t lies
    source: dict[int, tuple[Any, int]] = {s: (rows, i) for i, s in enumerate(members)}
    for pack, node in zip(incoming, others, strict=True):
        for i, s in enumerate(node):
            source[s] = (pack, i)
    results = [out] + [backend.empty(p * b, src.dtype) for _ in range(1, k)]
    for t, result in enumerate(results):
        for s in range(p):
            pack, i = source[s]
            at = ((i * p + members[t]) if pack is rows else (i * k + t)) * b
            backend.copy(result[s * b : (s + 1) * b], pack[at : at + b])
    if k > 1:
        yield ring.post(backend, tag, sends=[(results[t], members[t]) for t in range(1, k)])
