"""Bruck all-to-all: ceil(lg p) rounds for any world size, each sending about half the data:
latency-optimal for small messages. Blocks must all have the same size.

Cost: ceil(lg p) alpha + ceil(lg p) n/2 beta + 2 n gamma'    (n bytes of input per rank; gamma'
the cost of a local copy per byte: the rotations and the packing of every round)
Each rank sends about n/2 bytes per round, lg p / 2 times the pairwise exchange's bytes.

Rank r first rotates its blocks: slot i holds its block for rank r+i. In round k (d = 2^k)
it sends every slot whose index has bit k set to rank r+d and receives the same slots from
rank r-d. After the last round slot i holds the block rank r-i sent to r; a reversed copy puts
the slots in rank order.

    4 ranks; what r0's slots hold: "ab" = rank a's block for rank b

    rotate:          slots 00 01 02 03
    round 0 (d=1):   slots 1, 3 go to r1; r0 gets r3's slots 1, 3:   00 30 02 32
    round 1 (d=2):   slots 2, 3 go to r2; r0 gets r2's slots 2, 3:   00 30 20 10
    reverse:         00 10 20 30 (rank order)
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def alltoall_bruck(ring: Ring, backend: NumpyBackend, tag: int, src: Any, send_bounds: list[int], out: Any,
                   recv_bounds: list[int]) -> Steps:
    """The pairwise exchange's contract, for blocks that all have one size (alltoall's)."""
    p, r = ring.size, ring.rank
    b = send_bounds[1] - send_bounds[0]
    if p == 1:
        backend.copy(out, src)
        return
    with ring.scratch(backend, p * b, src.dtype) as slots, ring.scratch(backend, 2 * (p // 2) * b, src.dtype) as pack:
        backend.copy(slots[: (p - r) * b], src[r * b :])  # slot i = the block for rank r+i
        backend.copy(slots[(p - r) * b :], src[: r * b])
        sending, arriving = pack[: (p // 2) * b], pack[(p // 2) * b :]
        d = 1
        while d < p:
            runs = [(lo * b, min(lo + d, p) * b) for lo in range(d, p, 2 * d)]  # the slots with bit d set
            offset = 0
            for lo, hi in runs:
                backend.copy(sending[offset : offset + hi - lo], slots[lo:hi])
                offset += hi - lo
            yield ring.post(backend, tag, sends=[(sending[:offset], (r + d) % p)],
                            receives=[(arriving[:offset], (r - d) % p)])
            offset = 0
            for lo, hi in runs:
                backend.copy(slots[lo:hi], arriving[offset : offset + hi - lo])
                offset += hi - lo
            d *= 2
        # slot i holds rank (r-i)'s block: slots 0..r go to r..0, slots r+1..p-1 to p-1..r+1
        blocks, ordered = slots.reshape(p, b), out.reshape(p, b)
        backend.copy(ordered[r::-1], blocks[: r + 1])
        if r + 1 < p:
            backend.copy(ordered[: r : -1], blocks[r + 1 :])
