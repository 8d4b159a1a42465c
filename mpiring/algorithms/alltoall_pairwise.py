"""Pairwise (ring-shift) all-to-all: in step k each rank sends its block for rank+k straight to
it and receives rank-k's block for it. Any world size, p-1 steps, no copies but its own block:
bandwidth-optimal for large messages. Blocks may differ in size (all-to-all-v).

Cost: (p-1) alpha + (p-1)/p n beta      (n bytes of input per rank, p ranks, even blocks)
Each rank sends and receives (p-1)/p n bytes, each byte once, straight between its buffers.

    4 ranks; "12" = the block rank 1 holds for rank 2. Step k: everyone shifts by k.

    step 1 (+1):  r0 ─01─► r1 ─12─► r2 ─23─► r3 ─30─► r0
    step 2 (+2):  r0 ─02─► r2 ─20─► r0     r1 ─13─► r3 ─31─► r1
    step 3 (+3):  r0 ─03─► r3 ─32─► r2 ─21─► r1 ─10─► r0
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps


def alltoall_pairwise(ring: Ring, backend: NumpyBackend, tag: int, src: Any, send_bounds: list[int], out: Any,
                      recv_bounds: list[int]) -> Steps:
    """Send flat `src[send_bounds[j]:send_bounds[j+1]]` to rank j; receive rank i's block into
    `out[recv_bounds[i]:recv_bounds[i+1]]`. Every message is posted, empty ones too, so a rank
    whose counts disagree with its peer's gets a size error instead of a stray message."""
    p, r = ring.size, ring.rank
    backend.copy(out[recv_bounds[r] : recv_bounds[r + 1]], src[send_bounds[r] : send_bounds[r + 1]])
    for k in range(1, p):
        to, come = (r + k) % p, (r - k) % p
        yield ring.post(
            backend, tag,
            sends=[(src[send_bounds[to] : send_bounds[to + 1]], to)],
            receives=[(out[recv_bounds[come] : recv_bounds[come + 1]], come)],
        )
