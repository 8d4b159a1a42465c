"""Scattered all-gather: every rank posts its block to, and a receive from, all the others at
once, at most WINDOW peers per step (the scattered all-to-all's schedule with one block).
Any world size; one round up to WINDOW + 1 ranks, where the ring takes p-1 dependent steps.

Cost: ceil((p-1)/W) alpha + (p-1)/p n beta    (n bytes of gathered result, p ranks, even
blocks, W = WINDOW) - the ring's bytes, with up to W messages in flight per rank, so the
rounds' latencies overlap and no rank waits for a block to be forwarded. Each rank's own block
is read by p-1 sends at once; what that costs in contention is the memory's (on one node).

    4 ranks, one step; A from r0, B from r1, ...

        r0 ─A─► r1   r0 ─A─► r2   r0 ─A─► r3
        r1 ─B─► r2   r1 ─B─► r3   r1 ─B─► r0
        r2 ─C─► r3   r2 ─C─► r0   r2 ─C─► r1
        r3 ─D─► r0   r3 ─D─► r1   r3 ─D─► r2
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import WINDOW, Steps, shift_windows


def allgather_scattered(ring: Ring, backend: NumpyBackend, tag: int, buf: Any, bounds: list[int],
                        src: Any = None) -> Steps:
    """The ring all-gather's contract (mpiring.algorithms.allgather_ring): the own chunk is in
    `buf` or is `src`, then copied into its place while the first step is in flight. Shift k
    falls in the same step at its sender and its receiver, as in the all-to-all."""
    p, r = ring.size, ring.rank
    own = buf[bounds[r] : bounds[r + 1]]
    outgoing = own if src is None else src
    if p == 1 and src is not None:
        backend.copy(own, src)
    for shifts in shift_windows(p, WINDOW):
        step = ring.post(
            backend, tag,
            sends=[(outgoing, (r + k) % p) for k in shifts],
            receives=[(buf[bounds[(r - k) % p] : bounds[(r - k) % p + 1]], (r - k) % p) for k in shifts],
        )
        if shifts.start == 1 and src is not None:
            backend.copy(own, src)
        yield step
