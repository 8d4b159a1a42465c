"""Node-aware scan and exscan: a scan inside each node, an exclusive scan of the node totals among
the nodes' last ranks (each holds its node's total once the scan in the node is done), then each
node's last rank broadcasts that prefix of the earlier nodes in its node, where every rank
combines it with its own prefix in the node. Only N-1 messages of n bytes cross the network, one
per link, where a flat chain over ranks crosses each link once too but waits for every rank of
every earlier node hop after hop, and recursive doubling crosses lg p times.

Cost, N nodes of k ranks, n bytes per rank:
    the scan in the node                          (chain: (k-1) (alpha_intra + n beta_intra + n gamma))
  + the last ranks' exclusive scan over N ranks   (chain: (N-1) (alpha_inter + n beta_inter + n gamma))
  + the broadcast of n bytes in the node          (linear: alpha_intra + n beta_intra) + n gamma

    2 nodes x 2 ranks, inputs a b c d

    scan in the node       r0 ─a─► r1 (ab)        r2 ─c─► r3 (cd)
    exclusive across       r1 ─ab─► r3
    broadcast, combine     r3 ─ab─► r2            r2: ab+c   r3: ab+cd

Rank r gets (x0 op .. op x(first of its node - 1)) op (its prefix in the node): the ranks' order is
kept, grouped by node (floating-point sums may differ from the chain's in the last bits, as
recursive doubling's do). The grouping needs every node's ranks consecutive: on a node map
whose ranks are not in node order every rank runs the flat scan `auto` picks instead (every rank
holds the same map, so every rank does).
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms.allgather_node_leader import _in_node_order
from mpiring.algorithms.broadcast_node_leader import FLAT as FLAT_BROADCASTS
from mpiring.algorithms.scan_recursive_doubling import scan_recursive_doubling
from mpiring.algorithms.scan_ring import scan_ring
from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Steps
from mpiring.ops import AVG, SUM
from mpiring.selection import across_choice, flat_choice

FLAT = {"ring": scan_ring, "recursive_doubling": scan_recursive_doubling}


def scan_node_leader(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str,
                     exclusive: bool) -> Steps:
    """The chain scan's contract (mpiring.algorithms.scan_ring): prefix-reduce flat `src` into flat
    `out` (not overlapping `src`), over ranks 0..r, or with `exclusive` over 0..r-1."""
    nodes, r = ring.nodes, ring.rank
    if not _in_node_order(nodes.nodes):
        yield from FLAT[flat_choice("scan", src.nbytes, ring.size)](ring, backend, tag, src, out, op, exclusive)
        return
    members = nodes.node(r)
    node = SubRing(ring, members)
    first_node = members[0] == 0
    last = node.rank == node.size - 1
    summing = SUM if op == AVG else op  # the division by every rank's count comes once, at the end
    inside = FLAT[flat_choice("scan", src.nbytes, node.size)]
    yield from inside(node, backend, tag, src, out, summing, exclusive)  # out: the prefix in the node
    if len(nodes.nodes) > 1:
        own_total = last and exclusive and node.size > 1  # the total needs a combine of its own
        with ring.scratch(backend, src.size if own_total else 0, src.dtype) as total, \
                ring.scratch(backend, 0 if first_node else src.size, src.dtype) as earlier:
            if last:  # this node's total, and the earlier nodes' prefix from the other last ranks
                if not exclusive:
                    node_total = out
                elif own_total:
                    backend.combine(summing, out, src, total)
                    node_total = total
                else:
                    node_total = src
                tails = SubRing(ring, [each[-1] for each in nodes.nodes])
                across = FLAT[across_choice("scan", src.nbytes, tails.size)]
                yield from across(tails, backend, tag, node_total, None if first_node else earlier, summing, True)
            if not first_node:
                broadcast = FLAT_BROADCASTS[flat_choice("broadcast", src.nbytes, node.size)]
                yield from broadcast(node, backend, tag, node.size - 1, earlier)
                if exclusive and node.rank == 0:  # nothing of its own node before it
                    backend.copy(out, earlier)
                else:
                    backend.combine(summing, earlier, out, out)
    if out is not None:
        backend.finish(op, out, r if exclusive else r + 1)
