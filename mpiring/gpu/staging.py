"""The staged path: device buffers travel through pinned host memory, segment by segment, so
that copies and MPI overlap.

MPI here is not CUDA-aware, so it must only ever see host memory. One ring step of a staged
backend moves each message in segments (``MPIRING_GPU_SEGMENT_BYTES``, default 4 MiB):

    sender:    D2H s0 │ D2H s1 │ D2H s2 │                       (copy stream, queued at once)
                      │ MPI s0 │ MPI s1 │ MPI s2 │              (each Isend posted once its D2H is done)
    receiver:                  │ H2D s0 │ H2D s1 │ H2D s2       (queued as each Irecv lands)

so the device-to-host copy of one segment, the MPI transfer of the previous one and the
host-to-device copy of the one before run at the same time. Ordering with the device work
around the step is kept with events, never a device-wide synchronize:

- before the step's copies: both copy streams wait on an event recorded on the compute (current)
  stream, so a D2H reads finished data and an H2D never overwrites a buffer a queued kernel
  still reads;
- after them: the compute stream waits on an event recorded after the last H2D, so the kernels
  the algorithm launches next (the reduction) see the received data.

Pinned blocks come from a `PinnedPool` and go back to it when the step ends (a receive block
carries a fence: it is reused only once its H2D copies have finished), so steady-state calls
allocate nothing.

All CUDA work goes through a `CopyEngine` (mpiring.gpu.engine.CupyCopyEngine on a GPU); tests
drive the same pipeline with a fake engine on host arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, Protocol

import numpy
from mpi4py import MPI

from mpiring import environment
from mpiring.errors import CommunicationError

SEGMENT_ENV = "MPIRING_GPU_SEGMENT_BYTES"
# 4 MiB: the best of 256 KiB, 1, 4 and 16 MiB on an H100 at 16 and 64 MiB messages (docs/gpu.md)
DEFAULT_SEGMENT_BYTES = 4 << 20
MIN_BLOCK_BYTES = 1 << 16  # pool size classes start here, so small messages share blocks
DEFAULT_POOL_LIMIT = 1 << 30  # idle pinned memory kept for reuse, at most (more is allocated if needed)

_EMPTY = numpy.empty(0, numpy.uint8)  # zero-byte messages still travel, from host memory


class CopyEngine(Protocol):
    """The CUDA operations the staged path needs; a fence is whatever `done` understands."""

    def pinned(self, nbytes: int) -> numpy.ndarray:
        """A new page-locked host buffer of `nbytes` bytes (uint8)."""

    def after_compute(self) -> None:
        """Make copies queued from now on wait for the work queued on the compute stream so far."""

    def to_host(self, host: numpy.ndarray, device: Any, offset: int) -> Any:
        """Queue a copy of device bytes [offset, offset + host.nbytes) of flat `device` into `host`; a fence."""

    def to_device(self, device: Any, offset: int, host: numpy.ndarray) -> Any:
        """Queue a copy of `host` into device bytes [offset, offset + host.nbytes) of flat `device`; a fence."""

    def done(self, fence: Any) -> bool:
        """Whether the copies a fence stands for have finished (None: nothing to wait for)."""

    def before_compute(self) -> Any:
        """Make work queued on the compute stream from now on wait for the H2D copies so far; a fence."""

    def synchronize(self) -> None:
        """Wait on the host until the compute stream's queued work is done."""


def segment_bytes_from_env() -> int:
    from_environment = environment.positive_int(SEGMENT_ENV, "staged transfer")
    return DEFAULT_SEGMENT_BYTES if from_environment is None else from_environment


def segment_bounds(nbytes: int, segment_bytes: int) -> list[int]:
    """Byte offsets of the segments of an nbytes message: [0, s, 2s, ..., nbytes].

    A zero-byte message is one empty segment: it is still a message the receiver waits for.
    Bytes, not elements: copies and MPI both move raw bytes, so a segment may split an element.
    """
    if nbytes <= 0:
        return [0, 0]
    bounds = list(range(0, nbytes, segment_bytes))
    bounds.append(nbytes)
    return bounds


class PinnedPool:
    """Page-locked host blocks, reused across steps and calls.

    Blocks come in power-of-two size classes (from 64 KiB). A block handed back with a fence is
    reused only once the fence is done. Idle blocks beyond `limit_bytes` are dropped; a request
    that needs more than the limit is still served (correctness first).
    """

    def __init__(
        self, allocate: Callable[[int], numpy.ndarray], done: Callable[[Any], bool],
        limit_bytes: int = DEFAULT_POOL_LIMIT,
    ) -> None:
        self._allocate = allocate
        self._done = done
        self.limit_bytes = limit_bytes
        self._free: dict[int, list[tuple[numpy.ndarray, Any]]] = {}
        self.allocations = 0  # blocks ever allocated: flat across calls once warm
        self.held_bytes = 0  # bytes of all blocks the pool owns, lent out or idle

    @staticmethod
    def size_class(nbytes: int) -> int:
        return max(MIN_BLOCK_BYTES, 1 << max(nbytes - 1, 0).bit_length())

    def acquire(self, nbytes: int) -> numpy.ndarray:
        """A pinned uint8 block of at least nbytes, not in use by any copy or message."""
        capacity = self.size_class(nbytes)
        free = self._free.get(capacity, [])
        for i, (block, fence) in enumerate(free):
            if fence is None or self._done(fence):
                del free[i]
                return block
        self._trim(capacity)
        block = self._allocate(capacity)
        self.allocations += 1
        self.held_bytes += capacity
        return block

    def release(self, block: numpy.ndarray, fence: Any = None) -> None:
        """Hand a block back; with a fence it is reused only once the fence is done."""
        self._free.setdefault(block.nbytes, []).append((block, fence))

    def idle_blocks(self) -> int:
        return sum(len(free) for free in self._free.values())

    def _trim(self, incoming: int) -> None:
        """Drop finished idle blocks, largest first, until the new block fits under the limit."""
        for capacity in sorted(self._free, reverse=True):
            free = self._free[capacity]
            for entry in list(free):
                if self.held_bytes + incoming <= self.limit_bytes:
                    return
                if entry[1] is None or self._done(entry[1]):
                    free.remove(entry)
                    self.held_bytes -= capacity


class _Segment:
    """One segment of one message: its host bytes, where it sits in the device buffer, its request."""

    __slots__ = ("device", "offset", "host", "index", "peer", "fence")

    def __init__(self, device: Any, offset: int, host: numpy.ndarray, index: int, peer: int) -> None:
        self.device = device
        self.offset = offset
        self.host = host
        self.index = index  # into step.requests
        self.peer = peer
        self.fence: Any = None


class StagedTransfer:
    """The messages of one ring step of a staged backend, pushed along by `progress`.

    Built by `post` (called from Ring.post for a staged backend); the wait loops
    (mpiring.engine.waiting) call `progress(call)` until it returns True. Fills `step.requests`/
    `step.peers` like Ring.post, so timeouts name the same peers; checks received sizes itself,
    because a segment's status is consumed when its receive is tested.
    """

    def __init__(
        self, comm: MPI.Intracomm, engine: CopyEngine, pool: PinnedPool, tag: int, step: Any,
        segment_bytes: int,
    ) -> None:
        self._comm = comm
        self._engine = engine
        self._pool = pool
        self._tag = tag
        self._step = step
        self._segment_bytes = segment_bytes
        self._sends: list[_Segment] = []  # in the order they must be posted (MPI matches in order)
        self._next_send = 0
        self._landing: list[tuple[_Segment, int]] = []  # receive segments not yet arrived, with sizes
        self._send_blocks: list[numpy.ndarray] = []
        self._receive_blocks: list[numpy.ndarray] = []
        self._copied_in = False  # any H2D queued: the compute stream must wait for it
        self._done = False

    def post(self, sends: Sequence[tuple[Any, int]], receives: Sequence[tuple[Any, int]]) -> None:
        """Post every receive segment, queue every send segment's D2H copy, post what is ready."""
        step, engine = self._step, self._engine
        if sends or receives:
            engine.after_compute()
        for buf, source in receives:
            host = self._host_for(buf.nbytes, self._receive_blocks)
            bounds = segment_bounds(buf.nbytes, self._segment_bytes)
            for lo, hi in pairwise(bounds):
                segment = _Segment(buf, lo, host[lo:hi], len(step.requests), source)
                step.requests.append(self._comm.Irecv([segment.host, MPI.BYTE], source, self._tag))
                step.peers.append(("receive from", source))
                self._landing.append((segment, hi - lo))
        copied: dict[int, list[_Segment]] = {}  # one D2H per buffer, however many ranks it goes to
        for buf, dest in sends:
            earlier = copied.get(id(buf))
            if earlier is None:
                host = self._host_for(buf.nbytes, self._send_blocks)
                bounds = segment_bounds(buf.nbytes, self._segment_bytes)
                earlier = copied[id(buf)] = []
                for lo, hi in pairwise(bounds):
                    segment = _Segment(buf, lo, host[lo:hi], -1, dest)
                    if hi > lo:
                        segment.fence = engine.to_host(segment.host, buf, lo)
                    earlier.append(segment)
            for source_segment in earlier:
                segment = _Segment(buf, source_segment.offset, source_segment.host, len(step.requests), dest)
                segment.fence = source_segment.fence
                step.requests.append(MPI.Request())  # a null request until the copy is done
                step.peers.append(("send to", dest))
                self._sends.append(segment)
        self._post_ready_sends()

    def progress(self, call: Any) -> bool:
        """Post sends whose copies finished, start H2D copies of landed segments; True once all done."""
        if self._done:
            return True
        self._post_ready_sends()
        if self._landing:
            self._copy_landed(call)
        if self._next_send < len(self._sends) or self._landing:
            return False
        if not MPI.Request.Testall([self._step.requests[s.index] for s in self._sends]):
            return False
        self._finish()
        return True

    def _host_for(self, nbytes: int, blocks: list[numpy.ndarray]) -> numpy.ndarray:
        if nbytes == 0:
            return _EMPTY
        block = self._pool.acquire(nbytes)
        blocks.append(block)
        return block[:nbytes]

    def _post_ready_sends(self) -> None:
        sends, requests, engine = self._sends, self._step.requests, self._engine
        while self._next_send < len(sends):
            segment = sends[self._next_send]
            if not engine.done(segment.fence):
                return  # in order: a later segment must not overtake this one
            requests[segment.index] = self._comm.Isend([segment.host, MPI.BYTE], segment.peer, self._tag)
            self._next_send += 1

    def _copy_landed(self, call: Any) -> None:
        requests, still = self._step.requests, []
        status = MPI.Status()
        for segment, expected in self._landing:
            if not requests[segment.index].Test(status):
                still.append((segment, expected))
                continue
            got = status.Get_count(MPI.BYTE)
            if got != expected:
                raise CommunicationError(
                    call.collective,
                    f"rank {self._comm.Get_rank()} received {got} bytes from rank {segment.peer} but "
                    f"expected {expected}: the ranks passed different shapes, lengths or dtypes",
                )
            if expected:
                segment.fence = self._engine.to_device(segment.device, segment.offset, segment.host)
                self._copied_in = True
        self._landing = still

    def _finish(self) -> None:
        """Every message is done: order the compute stream after the H2D copies, return the blocks."""
        fence = self._engine.before_compute() if self._copied_in else None
        for block in self._send_blocks:  # every Isend has completed: MPI no longer reads them
            self._pool.release(block)
        for block in self._receive_blocks:  # free once the H2D copies out of them have run
            self._pool.release(block, fence)
        self._send_blocks = self._receive_blocks = []
        self._done = True
