"""The IPC path: device buffers move between ranks of one node by CUDA IPC, never through the host
and without a CUDA-aware MPI. MPI carries only small descriptors and acknowledgements.

One message of a ring step, from rank s to rank r (both on one node, any GPUs that can map each
other's memory, or one GPU shared):

    s: D2D buf -> own IPC block ──► Isend descriptor (block handle, serial, bytes) ──┐
    r: Irecv descriptor ◄──────────────────────────────────────────────────────────┘
       open the handle once (cached), D2D peer block -> buf ──► Isend ack ──► s: block free again

so the payload crosses device memory twice (into s's block, out of it into r's buffer) and the
host never touches it. Blocks are `cudaMalloc`'d once, in power-of-two size classes, and reused
(a `PinnedPool` of device blocks): after warm-up nothing is allocated, exported or opened.
A block is reused only after its receiver acknowledged its copy out, so a sender never
overwrites bytes a peer still reads. Ordering with the kernels around the step uses the same
events as the staged path (`after_compute` before the copies, `before_compute` after them).

Message sizes are checked against the descriptor: ranks on different paths (an IPC descriptor
meets a staged segment) or with different shapes raise CommunicationError, never mix data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy
from mpi4py import MPI

from mpiring.errors import CommunicationError
from mpiring.gpu.staging import PinnedPool

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
# Acknowledgements travel on the call's tag plus the Ring's tag space (its tags use the lower
# half of MPI_TAG_UB): on the call's own tag an early ack from a peer could match the receive
# posted for that peer's descriptor (MPI matches source and tag in order).
# descriptor: the block's handle, then int64 serial (which allocation) and int64 byte count
DESCRIPTOR_BYTES = HANDLE_BYTES + 16


class IpcBlock(Protocol):
    nbytes: int
    handle: bytes  # HANDLE_BYTES, what a peer opens
    serial: int  # unique per allocation in this process: a reopened handle is never a stale one


class IpcEngine(Protocol):
    """The CUDA operations the IPC path needs (mpiring.gpu.copy_streams.CupyIpcEngine on a GPU)."""

    def ipc_block(self, nbytes: int) -> IpcBlock:
        """A new device block of nbytes that peers can open."""

    def open_peer(self, handle: bytes, serial: int) -> Any:
        """The peer block a descriptor names, mapped into this process (cached by handle)."""

    def to_block(self, block: IpcBlock, device: Any, nbytes: int) -> Any:
        """Queue a copy of the first nbytes of flat `device` into `block`; a fence."""

    def from_peer(self, device: Any, peer: Any, nbytes: int) -> Any:
        """Queue a copy of nbytes of a mapped peer block into flat `device`; a fence."""

    def after_compute(self) -> None: ...
    def before_compute(self) -> Any: ...
    def done(self, fence: Any) -> bool: ...


def encode_descriptor(block: IpcBlock | None, nbytes: int) -> numpy.ndarray:
    descriptor = numpy.zeros(DESCRIPTOR_BYTES, numpy.uint8)
    if block is not None:
        descriptor[:HANDLE_BYTES] = numpy.frombuffer(block.handle, numpy.uint8)
        descriptor[HANDLE_BYTES:].view(numpy.int64)[:] = (block.serial, nbytes)
    return descriptor


def decode_descriptor(descriptor: numpy.ndarray) -> tuple[bytes, int, int]:
    serial, nbytes = (int(v) for v in descriptor[HANDLE_BYTES:].view(numpy.int64))
    return descriptor[:HANDLE_BYTES].tobytes(), serial, nbytes


class _Outgoing:
    """One send: the block its bytes were copied into, and its descriptor until that is posted."""

    __slots__ = ("dest", "block", "fence", "descriptor", "index", "ack")

    def __init__(self, dest: int, block: IpcBlock | None, fence: Any, descriptor: numpy.ndarray) -> None:
        self.dest, self.block, self.fence, self.descriptor = dest, block, fence, descriptor
        self.index = -1  # of its descriptor's request in step.requests
        self.ack = numpy.empty(1, numpy.uint8)


class _Incoming:
    """One receive: waiting for its descriptor, then copying out of the peer's block, then acked."""

    __slots__ = ("buf", "source", "descriptor", "index", "fence", "ack", "state")

    def __init__(self, buf: Any, source: int) -> None:
        self.buf, self.source = buf, source
        self.descriptor = numpy.empty(DESCRIPTOR_BYTES, numpy.uint8)
        self.index = -1
        self.fence: Any = None
        self.ack = numpy.zeros(1, numpy.uint8)
        self.state = "waiting"  # -> "copying" -> "acked"


class IpcTransfer:
    """The messages of one ring step on the IPC path, pushed along by `progress` (like
    mpiring.gpu.staging.StagedTransfer, whose place in Ring.post it takes)."""

    def __init__(self, comm: MPI.Intracomm, engine: IpcEngine, pool: PinnedPool, tag: int, step: Any,
                 ack_tag: int) -> None:
        self._comm, self._engine, self._pool, self._tag, self._step = comm, engine, pool, tag, step
        self._ack_tag = ack_tag
        self._out: list[_Outgoing] = []
        self._in: list[_Incoming] = []
        self._done = False

    def _request(self, request: MPI.Request, what: str, peer: int) -> int:
        self._step.requests.append(request)
        self._step.peers.append((what, peer))
        return len(self._step.requests) - 1

    def post(self, sends: Sequence[tuple[Any, int]], receives: Sequence[tuple[Any, int]]) -> None:
        """Post descriptor receives, queue each send's copy into a block, post what is ready."""
        comm, tag = self._comm, self._tag
        if sends or receives:
            self._engine.after_compute()
        for buf, source in receives:
            incoming = _Incoming(buf, source)
            incoming.index = self._request(comm.Irecv([incoming.descriptor, MPI.BYTE], source, tag),
                                           "receive from", source)
            self._in.append(incoming)
        copied: dict[int, tuple[IpcBlock | None, Any]] = {}  # one copy per buffer, however many peers
        for buf, dest in sends:
            first = id(buf) not in copied
            if first:
                block = self._pool.acquire(buf.nbytes) if buf.nbytes else None
                copied[id(buf)] = (block, self._engine.to_block(block, buf, buf.nbytes) if block is not None else None)
            block, fence = copied[id(buf)]
            # the first send of a buffer owns its block and hands it back at the end of the step
            outgoing = _Outgoing(dest, block if first else None, fence, encode_descriptor(block, buf.nbytes))
            outgoing.index = self._request(MPI.Request(), "send to", dest)  # null until the copy is done
            self._request(comm.Irecv([outgoing.ack, MPI.BYTE], dest, self._ack_tag),
                          "acknowledgement from", dest)
            self._out.append(outgoing)
        self._send_ready_descriptors()

    def _send_ready_descriptors(self) -> bool:
        """Post the descriptors of sends whose copies finished; True while some still wait."""
        requests, comm = self._step.requests, self._comm
        for outgoing in self._out:  # in order: two messages to one peer must not overtake each other
            if outgoing.descriptor is None:
                continue  # posted (the request keeps its buffer alive)
            if not self._engine.done(outgoing.fence):
                return True
            requests[outgoing.index] = comm.Isend([outgoing.descriptor, MPI.BYTE], outgoing.dest, self._tag)
            outgoing.descriptor = None
        return False

    def progress(self, call: Any) -> bool:
        """Send descriptors of finished copies, copy out of landed peer blocks, acknowledge.

        Called only from the wait loops (mpiring.engine.waiting), which turn an MPI error into CommunicationError.
        """
        if self._done:
            return True
        requests, engine, comm = self._step.requests, self._engine, self._comm
        busy = self._send_ready_descriptors()
        status = MPI.Status()
        for incoming in self._in:
            if incoming.state == "waiting":
                if not requests[incoming.index].Test(status):
                    busy = True
                    continue
                self._start_copy(incoming, status, call)
            if incoming.state == "copying":
                if not engine.done(incoming.fence):
                    busy = True
                    continue
                self._request(comm.Isend([incoming.ack, MPI.BYTE], incoming.source, self._ack_tag),
                              "send to", incoming.source)
                incoming.state = "acked"
        if busy or not MPI.Request.Testall(requests):
            return False
        self._finish()
        return True

    def _start_copy(self, incoming: _Incoming, status: MPI.Status, call: Any) -> None:
        got = status.Get_count(MPI.BYTE)
        handle, serial, nbytes = decode_descriptor(incoming.descriptor) if got == DESCRIPTOR_BYTES else (b"", 0, -1)
        if got != DESCRIPTOR_BYTES or nbytes != incoming.buf.nbytes:
            what = f"{nbytes} bytes" if got == DESCRIPTOR_BYTES else f"a {got}-byte message, not an IPC descriptor"
            raise CommunicationError(
                call.collective,
                f"rank {self._comm.Get_rank()} received {what} from rank {incoming.source} but expected "
                f"{incoming.buf.nbytes} bytes: the ranks passed different shapes, lengths or dtypes, "
                "or took different device paths",
            )
        if nbytes:
            incoming.fence = self._engine.from_peer(incoming.buf, self._engine.open_peer(handle, serial), nbytes)
        incoming.state = "copying"

    def _finish(self) -> None:
        """Every descriptor and acknowledgement is through: order the compute stream after the
        copies into this rank's buffers, hand the acknowledged blocks back."""
        if any(incoming.buf.nbytes for incoming in self._in):
            self._engine.before_compute()
        for outgoing in self._out:
            if outgoing.block is not None:
                self._pool.release(outgoing.block)
        self._out, self._in = [], []
        self._done = True
