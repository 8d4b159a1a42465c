"""Scattered all-to-all (MPICH's name): every rank posts its receives from, and its sends to,
all the others at once, in the pairwise order, at most WINDOW peers per step. Any world size,
blocks of any size (all-to-all-v), no copies but its own block: one round up to WINDOW + 1
ranks, where the pairwise exchange takes p-1.

Cost: ceil((p-1)/W) alpha + (p-1)/p n beta    (n bytes of input per rank, p ranks, even blocks,
W = WINDOW) - the pairwise exchange's bytes, each byte once, with up to W messages in flight
per rank, so the rounds' latencies overlap; what overlapping many messages costs in contention
is the network's (on one node, the memory's).

    4 ranks, one step; "12" = the block rank 1 holds for rank 2:

        r0 ─01─► r1   r0 ─02─► r2   r0 ─03─► r3
        r1 ─12─► r2   r1 ─13─► r3   r1 ─10─► r0
        r2 ─23─► r3   r2 ─20─► r0   r2 ─21─► r1
        r3 ─30─► r0   r3 ─31─► r1   r3 ─32─► r2
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import WINDOW, Steps, shift_windows


def alltoall_scattered(ring: Ring, backend: NumpyBackend, tag: int, src: Any, send_bounds: list[int], out: Any,
                       recv_bounds: list[int]) -> Steps:
    """The pairwise exchange's contract (mpiring.algorithms.alltoall_pairwise), its p-1 shifts
    posted WINDOW at a time: shift k falls in the same step at its sender and its receiver, so
    every step's receives meet that step's sends."""
    p, r = ring.size, ring.rank
    own = (out[recv_bounds[r] : recv_bounds[r + 1]], src[send_bounds[r] : send_bounds[r + 1]])
    if p == 1:
        backend.copy(*own)
    for shifts in shift_windows(p, WINDOW):
        step = ring.post(
            backend, tag,
            sends=[(src[send_bounds[(r + k) % p] : send_bounds[(r + k) % p + 1]], (r + k) % p) for k in shifts],
            receives=[(out[recv_bounds[(r - k) % p] : recv_bounds[(r - k) % p + 1]], (r - k) % p) for k in shifts],
        )
        if shifts.start == 1:  # the own block is copied while the first step's messages are in flight
            backend.copy(*own)
        yield step
