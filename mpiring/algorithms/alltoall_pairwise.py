"""Pairwise all-to-all: in step k rank r exchanges blocks with rank s = (k - r) mod p, its
partner in step k as r is s's, so each pair meets once. Any world size; each rank exchanges with
p-1 partners over p steps (in one step its partner is itself: nothing moves). Blocks may differ
in size (all-to-all-v). In place (the input is the output, MPI_IN_PLACE), the block for s is
copied aside before s's block takes its place, as MPI_Sendrecv_replace does.

Cost: (p-1) alpha + (p-1)/p n beta      (n bytes of input per rank, p ranks, even blocks)
Each rank sends and receives (p-1)/p n bytes, each byte once, straight between its buffers; in
place it also copies them once, (p-1)/p n bytes, a block at a time into one block of scratch.

    4 ranks; "12" = the block rank 1 holds for rank 2. Step k: r pairs with k - r.

    step 0:  r1 ◄─13/31─► r3                       (r0, r2 pair with themselves)
    step 1:  r0 ◄─01/10─► r1     r2 ◄─23/32─► r3
    step 2:  r0 ◄─02/20─► r2                       (r1, r3 pair with themselves)
    step 3:  r0 ◄─03/30─► r3     r1 ◄─12/21─► r2
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def alltoall_pairwise(ring: Ring, backend: NumpyBackend, tag: int, src: Any, send_bounds: list[int], out: Any,
                      recv_bounds: list[int]) -> Steps:
    """Send flat `src[send_bounds[j]:send_bounds[j+1]]` to rank j; receive rank i's block into
    `out[recv_bounds[i]:recv_bounds[i+1]]`; `src` may be `out` itself (its bounds then the same).
    Every message is posted, empty ones too, so a rank whose counts disagree with its peer's gets
    a size error instead of a stray message."""
    p, r = ring.size, ring.rank
    in_place = backend.may_share_memory(src, out)
    if not in_place:
        backend.copy(out[recv_bounds[r] : recv_bounds[r + 1]], src[send_bounds[r] : send_bounds[r + 1]])
        yield from _exchanges(ring, backend, tag, src, send_bounds, out, recv_bounds, None)
        return
    largest = max(send_bounds[j + 1] - send_bounds[j] for j in range(p))
    with ring.scratch(backend, largest, src.dtype) as aside:
        yield from _exchanges(ring, backend, tag, src, send_bounds, out, recv_bounds, aside)


def _exchanges(ring: Ring, backend: NumpyBackend, tag: int, src: Any, send_bounds: list[int], out: Any,
               recv_bounds: list[int], aside: Any) -> Steps:
    """The p-1 exchanges with a partner; a block goes out from `aside` (its copy) where given."""
    p, r = ring.size, ring.rank
    for k in range(p):
        s = (k - r) % p
        if s == r:
            continue
        block = src[send_bounds[s] : send_bounds[s + 1]]
        if aside is not None:
            backend.copy(aside[: block.size], block)
            block = aside[: block.size]
        yield ring.post(backend, tag, sends=[(block, s)], receives=[(out[recv_bounds[s] : recv_bounds[s + 1]], s)])
