"""CuPy device buffers behind the same seam as NumPy (mpiring.backend): two paths to MPI.

- direct (`CupyBackend`): the MPI library is CUDA-aware, so device buffers go to MPI as they are.
  mpi4py does not synchronize streams, so the compute stream is synchronized before any device
  buffer is handed to MPI (one stream, not the whole device).
- staged (`StagedCupyBackend`): MPI only ever sees pinned host memory; each ring step's
  messages are copied through it in overlapping segments (mpiring.gpu.staging).
- ipc (`IpcCupyBackend`): on a communicator whose ranks share one node, device buffers move by
  CUDA IPC, device to device, and MPI carries only descriptors (mpiring.gpu.ipc); elsewhere it
  hands each step to the direct or staged backend it wraps.

The reductions run on the device, in place, as CuPy elementwise kernels: one kernel per combine
(out = a op b). The exception: on the staged and IPC paths a small call whose message has the
same size on every rank runs on pinned host copies instead (`host_bytes`, mpiring.gpu.host_route).
Results are CuPy arrays on the input's device.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy
from mpi4py import MPI

from mpiring.engine.ring import Ring
from mpiring.engine.transport import Step
from mpiring.gpu.host_route import HostRoute, host_bytes_from_env
from mpiring.gpu.ipc import IpcEngine, IpcTransfer
from mpiring.gpu.staging import CopyEngine, PinnedPool, StagedTransfer, record_staged_step, segment_bytes_from_env
from mpiring.ops import AVG, UFUNC_NAMES

_EMPTY = numpy.empty(0, numpy.uint8)  # zero-byte messages: never hand MPI a (possibly null) device pointer


class CupyBackend:
    """Device buffers on one GPU, handed to a CUDA-aware MPI directly."""

    name = "cupy"
    staged = False
    on_device = True
    path = "direct"
    plannable = True  # a repeated call may be recorded as a plan (mpiring.engine.plan)
    host_bytes = 0  # calls moving at most this many bytes run on host copies (run_on_host); 0: none

    def __init__(self, xp: Any, device: AbstractContextManager, engine: CopyEngine, name: str = "cupy") -> None:
        # The name also keys the Ring's reusable scratch buffers, so it names the GPU: a buffer
        # of one device must never be handed to a collective on another.
        self.name = name
        self.xp = xp  # cupy (or a test double with the same calls)
        self.device = device  # entering it makes this GPU current: kernels run where the data is
        self.engine = engine
        self._host_route: HostRoute | None = None

    def _route_through_host(self, host_bytes: int | None) -> None:
        self._host_route = HostRoute(self, host_bytes_from_env() if host_bytes is None else host_bytes)
        self.host_bytes = self._host_route.limit_bytes

    def run_on_host(self, x: Any, out: Any, call: Any) -> Any:
        """`call(host_x, host_out)` on pinned copies of `x` and `out`, its result copied back
        (mpiring.gpu.host_route): for a call of at most `host_bytes` bytes on every rank."""
        with self.device:
            return self._host_route.run(x, out, call)

    def is_array(self, x: Any) -> bool:
        return isinstance(x, self.xp.ndarray)

    def asarray(self, x: Any) -> Any:
        with self.device:
            return self.xp.asarray(x)

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        with self.device:
            return self.xp.empty(shape, dtype=dtype)

    empty_kept = empty  # CuPy's memory pool already keeps freed device memory for the next call

    def flat(self, x: Any) -> Any:
        """A 1-D view of a C-contiguous array (a device copy only if it is not contiguous)."""
        with self.device:
            return self.xp.ascontiguousarray(x).reshape(-1)

    def combine(self, op: str, a: Any, b: Any, out: Any) -> None:
        """out = a (op) b on the device: one elementwise kernel on the current stream."""
        with self.device:
            getattr(self.xp, UFUNC_NAMES[op])(a, b, out=out)

    def finish(self, op: str, buf: Any, world_size: int) -> None:
        if op == AVG and buf.size:
            with self.device:
                self.xp.true_divide(buf, world_size, out=buf)

    def copy(self, dst: Any, src: Any) -> None:
        with self.device:
            self.xp.copyto(dst, src)

    def may_share_memory(self, a: Any, b: Any) -> bool:
        if not (self.is_array(a) and self.is_array(b)):
            return False  # host and device memory never overlap
        return bool(self.xp.may_share_memory(a, b))

    def ready_for_mpi(self) -> None:
        """The kernels that wrote the send buffers must be finished before MPI reads them."""
        self.engine.synchronize()

    def send_message(self, buf: Any) -> list:
        return [buf if buf.nbytes else _EMPTY, MPI.BYTE]

    def receive_message(self, buf: Any) -> tuple[list, None]:
        # MPI may write as soon as the receive is posted: no queued kernel may still use the buffer.
        self.engine.synchronize()
        return [buf if buf.nbytes else _EMPTY, MPI.BYTE], None


class _SelfPostingBackend(CupyBackend):
    """A backend that moves device buffers itself: Ring.post hands it each whole step
    (`staged = True`), and it never gives MPI a device buffer."""

    staged = True

    def _transfer(self, ring: Ring, tag: int, step: Step) -> Any:
        """The object that moves one step's messages: post(sends, receives) and progress(call)."""
        raise NotImplementedError

    def post_staged(
        self, ring: Ring, tag: int, sends: Sequence[tuple[Any, int]] = (), receives: Sequence[tuple[Any, int]] = ()
    ) -> Step:
        """Ring.post for this backend: the step's messages go through its transfer."""
        step = Step()
        transfer = self._transfer(ring, tag, step)
        step.progress = transfer.progress
        traffic = ring.traffic
        for buf, _ in receives:
            traffic.bytes_received += buf.nbytes
        for buf, _ in sends:
            traffic.bytes_sent += buf.nbytes
            traffic.messages += 1  # the algorithm's messages, not the segments or descriptors MPI sees
        with self.device:
            transfer.post(sends, receives)
        return step

    def send_message(self, buf: Any) -> list:
        raise RuntimeError(f"{self.path} device buffers must go through post_staged, never straight to MPI")

    def receive_message(self, buf: Any) -> tuple[list, None]:
        raise RuntimeError(f"{self.path} device buffers must go through post_staged, never straight to MPI")


class StagedCupyBackend(_SelfPostingBackend):
    """Device buffers on one GPU, through pinned host memory: for an MPI that is not CUDA-aware."""

    path = "staged"

    def __init__(
        self, xp: Any, device: AbstractContextManager, engine: CopyEngine, pool: PinnedPool | None = None,
        segment_bytes: int | None = None, name: str = "cupy", host_bytes: int | None = None,
    ) -> None:
        super().__init__(xp, device, engine, name)
        self.pool = pool if pool is not None else PinnedPool(engine.pinned, engine.done)
        self.segment_bytes = segment_bytes if segment_bytes is not None else segment_bytes_from_env()
        self._route_through_host(host_bytes)

    def _transfer(self, ring: Ring, tag: int, step: Step) -> StagedTransfer:
        return StagedTransfer(ring.comm, self.engine, self.pool, tag, step, self.segment_bytes)

    def record_step(self, recorder: Any, tag: int, sends: Sequence[tuple[Any, int]] = (),
                    receives: Sequence[tuple[Any, int]] = ()) -> Step:
        """Ring.post while a plan is built: the step's segments become steps of the plan."""
        with self.device:
            return record_staged_step(recorder, self.engine, self.segment_bytes, tag, sends, receives)


class IpcCupyBackend(_SelfPostingBackend):
    """Device buffers on one GPU, moved by CUDA IPC between ranks of one node (mpiring.gpu.ipc).

    Whether a communicator's ranks share a node is the Ring's `node_local` (found once when the
    Communicator is made); on any other communicator each step goes to `fallback`, the direct or
    staged backend the MPI library allows.
    """

    path = "ipc"
    plannable = False  # whether a step takes IPC depends on the ring: each call decides

    def __init__(
        self, xp: Any, device: AbstractContextManager, engine: IpcEngine, fallback: CupyBackend,
        pool: PinnedPool | None = None, name: str = "cupy", host_bytes: int | None = None,
    ) -> None:
        super().__init__(xp, device, engine, name)
        self.fallback = fallback
        self._route_through_host(host_bytes)
        # device blocks other ranks open by handle; reused once the receiver acknowledged its copy
        self.pool = pool if pool is not None else PinnedPool(engine.ipc_block, lambda fence: True)

    def post_staged(
        self, ring: Ring, tag: int, sends: Sequence[tuple[Any, int]] = (), receives: Sequence[tuple[Any, int]] = ()
    ) -> Step:
        if not ring.node_local:
            return ring.post(self.fallback, tag, sends, receives)
        return super().post_staged(ring, tag, sends, receives)

    def _transfer(self, ring: Ring, tag: int, step: Step) -> IpcTransfer:
        return IpcTransfer(ring.comm, self.engine, self.pool, tag, step, ack_tag=tag + ring.tags.ack_offset)
