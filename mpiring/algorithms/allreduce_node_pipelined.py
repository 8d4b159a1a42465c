"""Segment-pipelined multi-lane all-reduce across nodes: `node_lanes` with the buffer cut into
segments that flow through its three phases as through a pipeline, so that a segment's
reduce-scatter and another's all-gather inside each node run while a third crosses the network
(Open MPI HAN's pipelined all-reduce, on lanes).

    slot:           0        1        2        3       ...  m+1
    in the node:    RS s0    RS s1    RS s2    RS s3
    across (lanes):          X  s0    X  s1    X  s2
    in the node:                      AG s0    AG s1   ...  AG s(m-1)

    RS: ring reduce-scatter of the segment into k shares inside each node
    X:  each local rank j all-reduces share j with rank j of every other node (lane j, a ring)
    AG: ring all-gather of the segment inside each node

Slots run in lock-step: every slot has L = max(K-1, 2(N-1)) steps on every rank (K the largest
node's ranks), and a phase of segment g posts its i-th step at step (g + phase) L + i of the
call, everywhere. Each step of the call carries the messages of every phase it holds, posted
before any of them is waited for, so each rank waits in step t only for what its peers post in
step t: the phases never wait on each other across ranks, whatever the node sizes. Within a
step the lanes post first, so a share is on the network while this rank reduces and copies for
the node phases.

Cost, N nodes of k ranks, n bytes per rank, m segments of s = n/m bytes (at most k N PIECE_BYTES):
    (m+2) L steps, each  max(alpha_e + s/N beta_e [a node's k lanes, s/(kN) each, share its link],
                             alpha_i + 2 s/k beta_i [the two node phases' messages])
                  + the reductions of the step (s/k gamma inside, s/(kN) gamma across)
With s small next to n this tends to node_lanes' network time alone, 2(N-1)/N n beta_e, the least
an all-reduce can cross, with the node phases hidden behind it; the price is (m+2) L alphas of
each class and two slots of fill and drain. Bytes per rank are node_lanes' with ring lanes.
It wins where the network is slow next to the node phases (1 Gbit/s links on the emulated
cluster) and loses where it is not (10 Gbit/s there): docs/algorithms.md, "Pipelined lanes".

Every share is reduced once, by its lane, in a fixed order: every rank gets the same bits. One
node, nodes of one rank each, and staged device buffers run `node_lanes` (nothing to overlap,
or the staged path's own pipeline).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from mpiring.algorithms.allgather_ring import allgather_steps
from mpiring.algorithms.allreduce_node_lanes import allreduce_node_lanes
from mpiring.algorithms.reduce_scatter_ring import reduce_scatter_steps
from mpiring.backend import NumpyBackend
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring, SubRing
from mpiring.engine.transport import Step, Steps
from mpiring.ops import AVG, SUM

# The bytes of one message across nodes (a lane's ring step): a segment is k N of them, so the
# network's per-message cost is amortized alike at any scale. Measured on the emulated cluster
# (2 nodes x 2 ranks, 1 Gbit/s): 4 MiB took the same time from 8 KiB to 64 KiB pieces (32 to 256
# KiB segments) and more from 128 KiB up, where fill and drain (one segment's node phases) grow.
PIECE_BYTES = 1 << 15

LANES, REDUCE_SCATTER, ALL_GATHER = 0, 1, 2  # the phases; a segment enters phase p in slot g + p


def segment_bounds(count: int, itemsize: int, pieces: int) -> list[int]:
    """Bounds of the segments `count` items are cut into: at most `pieces` x PIECE_BYTES each,
    as even as can be, and one (perhaps empty) segment at least."""
    per = max(1, pieces * PIECE_BYTES // itemsize)
    return split_bounds(count, max(1, -(-count // per)))


def slot_steps(nodes: tuple[tuple[int, ...], ...]) -> int:
    """L: the steps of one slot, the most any phase takes on any rank (ring phases: K-1 in a node
    of K ranks, 2(N-1) for a lane of N nodes)."""
    return max(max(len(node) for node in nodes) - 1, 2 * (len(nodes) - 1))


def _lane_allreduce(lane: SubRing, backend: NumpyBackend, tag: int, share: Any, op: str) -> Steps:
    """Ring all-reduce of `share` in place over `lane`: 2(N-1) steps whatever its length."""
    bounds = split_bounds(share.size, lane.size)
    mine = share[bounds[lane.rank] : bounds[lane.rank + 1]]
    yield from reduce_scatter_steps(lane, backend, tag, share, bounds, op, mine)
    yield from allgather_steps(lane, backend, tag, share, bounds)


def allreduce_node_pipelined(ring: Ring, backend: NumpyBackend, tag: int, src: Any, out: Any, op: str) -> Steps:
    """Reduce flat `src` over all ranks into flat `out` (which may be `src` itself)."""
    nodes = ring.nodes
    if len(nodes.nodes) == 1 or max(len(node) for node in nodes.nodes) == 1 or backend.staged:
        yield from allreduce_node_lanes(ring, backend, tag, src, out, op)
        return
    node = SubRing(ring, nodes.node(ring.rank))
    lane = SubRing(ring, nodes.lane(node.rank)) if node.rank < nodes.lanes else None
    summing = SUM if op == AVG else op  # the division by every rank's count comes once, at the end
    cuts = segment_bounds(src.size, src.itemsize, nodes.lanes * len(nodes.nodes))
    m, slot = len(cuts) - 1, slot_steps(nodes.nodes)

    def phases(g: int) -> list[tuple[int, int, Generator[Step, None, Any]]]:
        """Segment g's phases on this rank: (first step, phase, its steps), none run yet."""
        lo, hi = cuts[g], cuts[g + 1]
        seg_src, seg_out = src[lo:hi], out[lo:hi]
        bounds = split_bounds(hi - lo, nodes.lanes) + [hi - lo] * (node.size - nodes.lanes)
        share = seg_out[bounds[node.rank] : bounds[node.rank + 1]]
        made = [(g * slot, REDUCE_SCATTER, reduce_scatter_steps(node, backend, tag, seg_src, bounds, summing, share)),
                ((g + 2) * slot, ALL_GATHER, allgather_steps(node, backend, tag, seg_out, bounds))]
        if lane is not None:
            made.append(((g + 1) * slot, LANES, _lane_allreduce(lane, backend, tag, share, summing)))
        return made

    # Resumed in this order every step: the phases begun earlier first (a phase ending in this
    # step finishes its last reduction before the next phase of its segment starts on it), then
    # lanes before the node phases (a share's messages leave before the node work is done).
    waiting = sorted((phase for g in range(m) for phase in phases(g)), key=lambda p: (p[0], p[1]))
    running: list[tuple[int, int, Generator[Step, None, Any]]] = []
    for t in range((m + 2) * slot):
        if not running and not waiting:
            break
        while waiting and waiting[0][0] == t:
            running.append(waiting.pop(0))
        posted, still = [], []
        for first, phase, steps in running:
            step = next(steps, None)
            if step is None:
                continue
            if t >= first + slot:  # an algorithm with more steps than slot_steps counts
                raise RuntimeError(f"node_pipelined: phase {phase} ran past its slot of {slot} steps")
            posted.append(step)
            still.append((first, phase, steps))
        running = still
        yield from posted
    for _, _, steps in running:  # phases whose last step was the call's last: their final work
        for _ in steps:
            raise RuntimeError("node_pipelined: a phase ran past the last slot")
    backend.finish(op, out, ring.size)
