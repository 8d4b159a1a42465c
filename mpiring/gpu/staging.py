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

A repeated call on the same buffers is planned (mpiring.engine.plan): `record_staged_step` then
cuts each step into rounds of segments, each round a step of the plan with persistent requests
on pinned blocks the plan owns, and the copies its work (`StagedSchedule`, at the end of this
module). The same overlap, without a transfer object, pool or segment arithmetic per call.

All CUDA work goes through a `CopyEngine` (mpiring.gpu.copy_streams.CupyCopyEngine on a GPU); tests
drive the same pipeline with a fake engine on host arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from itertools import pairwise
from typing import Any, Protocol

import numpy
from mpi4py import MPI

from mpiring import environment
from mpiring.backend import NUMPY
from mpiring.engine.transport import Step, Traffic
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


# ---- the staged path in a plan (mpiring.engine.plan): segments become the plan's own steps ----


_Part = tuple[Any, numpy.ndarray, list[int]]  # a device buffer, its bytes in a pinned block, its segment bounds


class _PlanBlock:
    """A pinned block a staged plan's steps share, and the fence of the last copies out of it
    (a receive block may take new bytes only once the device has copied the previous ones in)."""

    __slots__ = ("host", "fence")

    def __init__(self, host: numpy.ndarray) -> None:
        self.host = host
        self.fence: Any = None


class PlanBlocks:
    """The pinned blocks of one staged plan: one block sends, one receives, step after step (a step
    that needs more gets a larger block from then on). A plan runs one step at a time, so a step's
    sends are done before the next step copies into the send block; the receive block's fence
    orders the rest."""

    def __init__(self, engine: CopyEngine) -> None:
        self._engine = engine
        self._blocks: dict[str, _PlanBlock] = {}
        self.allocated = 0  # bytes of pinned memory allocated so far

    def block(self, kind: str, nbytes: int) -> _PlanBlock:
        """The `kind` ("send" or "receive") block, at least nbytes large (zero bytes: an empty one)."""
        if nbytes == 0:
            return _PlanBlock(_EMPTY)
        block = self._blocks.get(kind)
        if block is None or block.host.nbytes < nbytes:
            capacity = PinnedPool.size_class(nbytes)
            block = self._blocks[kind] = _PlanBlock(self._engine.pinned(capacity))
            self.allocated += capacity
        return block


class StagedSchedule:
    """One staged ring step as a plan replays it, the pipeline of StagedTransfer cut into rounds:

        copy_out()     after the compute stream, queue every send segment's D2H copy at once
        ready(r)       round r's D2H copies are done (round 0: and the receive block is free)
        (messages)     round r's segments, host to host: a step of the plan, persistent requests
        copy_in(r)     queue the H2D copies of round r's received segments
        join()         the compute stream waits for the H2D copies

    so the D2H of round r+1 and the H2D of round r-1 overlap round r's messages.
    """

    def __init__(self, engine: CopyEngine, sends: list[_Part], receives: list[_Part],
                 receive_block: _PlanBlock) -> None:
        self._engine = engine
        self._sends = sends  # one per buffer sent, however many ranks it goes to
        self._receives = receives  # one per message received
        self._receive_block = receive_block
        self.rounds = max((len(bounds) - 1 for _, _, bounds in sends + receives), default=1)
        self._copies_out: list[list[Any]] = [[] for _ in range(self.rounds)]

    def copy_out(self) -> None:
        engine, copies = self._engine, self._copies_out
        engine.after_compute()
        for fences in copies:
            fences.clear()
        for device, host, bounds in self._sends:
            for r, (lo, hi) in enumerate(pairwise(bounds)):
                if hi > lo:
                    copies[r].append(engine.to_host(host[lo:hi], device, lo))

    def ready(self, r: int) -> None:
        """Wait (spinning: device copies take microseconds) until round r may be sent and received."""
        done = self._engine.done
        fences = self._copies_out[r] + ([self._receive_block.fence] if r == 0 else [])
        for fence in fences:
            while not done(fence):
                pass

    def copy_in(self, r: int) -> None:
        for device, host, bounds in self._receives:
            if r + 1 < len(bounds) and bounds[r + 1] > bounds[r]:
                lo, hi = bounds[r], bounds[r + 1]
                self._engine.to_device(device, lo, host[lo:hi])

    def join(self) -> None:
        if any(bounds[-1] for _, _, bounds in self._receives):
            self._receive_block.fence = self._engine.before_compute()


def _laid_out(devices: list[Any], block: numpy.ndarray, segment_bytes: int) -> list[_Part]:
    """The buffers' places, one after another, in a pinned block."""
    parts, offset = [], 0
    for device in devices:
        parts.append((device, block[offset : offset + device.nbytes], segment_bounds(device.nbytes, segment_bytes)))
        offset += device.nbytes
    return parts


def _round(parts: list[tuple[_Part, int]], r: int) -> list[tuple[numpy.ndarray, int]]:
    """Round r's host segments of these messages, (segment, peer) as Ring.post takes them."""
    return [(host[bounds[r] : bounds[r + 1]], peer) for (_, host, bounds), peer in parts if r + 1 < len(bounds)]


def record_staged_step(recorder: Any, engine: CopyEngine, segment_bytes: int, tag: int,
                       sends: Sequence[tuple[Any, int]], receives: Sequence[tuple[Any, int]]) -> Step:
    """Record one staged step into a plan being built (mpiring.engine.plan.Recorder): its rounds
    of segments become the plan's own steps of host messages, the copies its work. Returns the
    last round's step (the one the algorithm yields); its H2D copies and the join are recorded
    right after it is waited for."""
    blocks = recorder.shared.get(engine)
    if blocks is None:
        blocks = recorder.shared[engine] = PlanBlocks(engine)
    before = blocks.allocated
    unique = list({id(device): device for device, _ in sends}.values())
    send_block = blocks.block("send", sum(device.nbytes for device in unique))
    receive_block = blocks.block("receive", sum(device.nbytes for device, _ in receives))
    recorder.allocated += blocks.allocated - before
    send_parts = _laid_out(unique, send_block.host, segment_bytes)
    receive_parts = _laid_out([device for device, _ in receives], receive_block.host, segment_bytes)
    schedule = StagedSchedule(engine, send_parts, receive_parts, receive_block)
    by_buffer = {id(part[0]): part for part in send_parts}
    sending = [(by_buffer[id(device)], dest) for device, dest in sends]
    receiving = [(part, source) for part, (_, source) in zip(receive_parts, receives, strict=True)]

    traffic = recorder.traffic  # the algorithm's messages, not the segments MPI sees (as post_staged counts)
    traffic.bytes_received += sum(device.nbytes for device, _ in receives)
    traffic.bytes_sent += sum(device.nbytes for device, _ in sends)
    traffic.messages += len(sends)
    uncounted = Traffic()
    recorder.work(schedule.copy_out)
    for r in range(schedule.rounds):
        recorder.work(partial(schedule.ready, r))
        step = recorder.post(NUMPY, tag, _round(sending, r), _round(receiving, r), uncounted)
        if r + 1 < schedule.rounds:
            recorder.wait(step)
            recorder.work(partial(schedule.copy_in, r))
    recorder.after_wait(step, [partial(schedule.copy_in, schedule.rounds - 1), schedule.join])
    return step
