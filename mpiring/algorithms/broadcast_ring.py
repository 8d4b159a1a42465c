"""Pipelined ring broadcast: the root's data flows once around the ring, segment by segment.

Cost: (p+S-2) (alpha + n/S beta)       (n bytes, p ranks, S segments)
      -> n beta + (p-2) n/S beta + (p+S-2) alpha: near n beta once S >> p.
Every rank but the last receives n bytes and forwards n bytes (the root only sends, the last
rank before the root only receives). Ranks receive straight into the result and forward from
it: no copies.

    root r0, 4 ranks, segments A B C

    step 0:  r0 ─A─► r1
    step 1:  r0 ─B─► r1 ─A─► r2
    step 2:  r0 ─C─► r1 ─B─► r2 ─A─► r3
    step 3:          r1 ─C─► r2 ─B─► r3
    step 4:                  r2 ─C─► r3
"""

from __future__ import annotations

from typing import Any

from mpiring.backend import NumpyBackend
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Steps

# Segments only pay off when some rank both receives and forwards (p > 2); this size keeps
# the pipeline short for small messages and the per-message cost small for large ones.
SEGMENT_BYTES = 512 * 1024


def segment_count(nbytes: int, world_size: int) -> int:
    if world_size <= 2 or nbytes <= SEGMENT_BYTES:
        return 1
    return -(-nbytes // SEGMENT_BYTES)


def broadcast_steps(ring: Ring, backend: NumpyBackend, tag: int, root: int, buf: Any, src: Any = None) -> Steps:
    """Broadcast flat `buf` from `root`: the root's buf is sent, everyone else's is filled. A
    root's `src` (another array) is sent instead, and copied into its buf meanwhile."""
    p = ring.size
    if p == 1:
        if src is not None:
            backend.copy(buf, src)
        return
    segments = segment_count(buf.nbytes, p)
    seg = split_bounds(buf.size, segments)
    q = ring.position(root)
    last = p - 1  # the position that only receives
    first_step = 0 if q == 0 else q - 1
    final_step = segments - 1 + (q if q < last else q - 1)
    outgoing = src if q == 0 and src is not None else buf
    for t in range(first_step, final_step + 1):
        sends, receives = [], []
        i = t - q  # the segment this rank forwards at step t
        if q < last and 0 <= i < segments:
            sends.append((outgoing[seg[i] : seg[i + 1]], ring.right))
        i = t - q + 1  # the segment it receives at step t
        if q > 0 and 0 <= i < segments:
            receives.append((buf[seg[i] : seg[i + 1]], ring.left))
        step = ring.post(backend, tag, sends=sends, receives=receives)
        if outgoing is not buf and t == 0:  # the root's copy, while its first segment is in flight
            backend.copy(buf, src)
        yield step
