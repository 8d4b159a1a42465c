"""The scratch pool: the large temporary buffers of algorithms, kept for reuse across calls.

Fresh large arrays cost page faults on first touch every call (the allocator hands big blocks
back to the system), which shows in large collectives. So buffers from 64 KiB up are kept, per
backend, at most a few (enough for some nonblocking collectives in flight at once) and at most
`limit` bytes in all (MPIRING_SCRATCH_BYTES, default POOL_BYTES). Only a collective that finished
cleanly gives its buffer back: after an error or timeout MPI may still write to it.

    with ring.scratch(backend, count, dtype) as buf:   # Ring.scratch: a plan's own, or pooled
        ...                                            # clean exit: buf's memory back to the pool
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpiring.backend import NumpyBackend

POOL_FROM_BYTES = 64 * 1024  # smaller buffers are allocated fresh each time
POOL_BUFFERS = 4  # kept per backend, at most
POOL_BYTES = 256 << 20  # kept per backend, at most, unless MPIRING_SCRATCH_BYTES says otherwise


class Scratch:
    """The context manager `Ring.scratch` returns (a plain class: small collectives are paid in
    Python time). On a clean exit a pooled buffer goes back to its pool, the smallest dropped
    when the pool holds too many or too many bytes; on an exception (MPI may still write to it)
    it is left to the GC."""

    __slots__ = ("array", "_raw", "_pool", "_limit")

    def __init__(self, array: Any, raw: Any = None, pool: list[Any] | None = None, limit: int = 0) -> None:
        self.array, self._raw, self._pool, self._limit = array, raw, pool, limit

    def __enter__(self) -> Any:
        return self.array

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        pool = self._pool
        if kind is None and pool is not None:
            pool.append(self._raw)
            while len(pool) > POOL_BUFFERS or sum(buf.nbytes for buf in pool) > self._limit:
                del pool[min(range(len(pool)), key=lambda i: pool[i].nbytes)]


class ScratchPool:
    """One communicator's spare scratch buffers, by backend name (a device backend's name names
    its GPU, so a buffer never serves a collective on another device)."""

    def __init__(self, limit: int = POOL_BYTES) -> None:
        self.limit = limit  # the most bytes kept per backend
        self._spare: dict[str, list[Any]] = {}

    def take(self, backend: NumpyBackend, count: int, dtype: Any) -> Scratch:
        """A flat array of `count` elements: the smallest spare buffer that fits, or a new one
        (pooled only from POOL_FROM_BYTES up to `limit`)."""
        nbytes = count * backend.xp.dtype(dtype).itemsize
        if not POOL_FROM_BYTES <= nbytes <= self.limit:
            return Scratch(backend.empty(count, dtype))
        spare = self._spare.setdefault(backend.name, [])
        fitting = [i for i, buf in enumerate(spare) if buf.nbytes >= nbytes]
        raw = spare.pop(min(fitting, key=lambda i: spare[i].nbytes)) if fitting else backend.empty_kept(nbytes, "uint8")
        return Scratch(raw[:nbytes].view(dtype), raw, spare, self.limit)

    def clear(self) -> None:
        """Let every spare buffer go (Communicator.free)."""
        self._spare.clear()
