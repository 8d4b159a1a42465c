"""Test doubles for the device path, so its logic runs on a machine without a GPU.

- `FakeDeviceArray`: host memory posing as device memory (a NumPy subclass, so the collectives'
  array code runs unchanged). It must never reach MPI on the staged path; `RecordingComm`
  stands between mpiring and MPI and fails the test when one does.
- `FakeEngine`: the staged path's copy engine, with copies that are *really* asynchronous: a
  device-to-host copy writes the host bytes only when its fence is first seen done (after
  `delay` polls), and a host-to-device copy lands only when its fence is done or the compute
  stream is made to wait for it. A pipeline that posts a send before its copy finished sends
  stale bytes, and one that reduces before its receive was copied in reduces stale data: both
  show up as wrong results, not just as a broken log.
- `fake_xp(log)`: the array module for FakeDeviceArray; every kernel is logged, so tests can
  check that the stream was synchronized between a kernel and MPI reading its output.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import numpy
from mpi4py import MPI

from mpiring.gpu.backend import CupyBackend, StagedCupyBackend
from mpiring.gpu.staging import PinnedPool


class FakeDeviceArray(numpy.ndarray):
    """Host memory standing in for GPU memory in tests."""


def to_device(a: Any) -> FakeDeviceArray:
    return numpy.array(a).view(FakeDeviceArray)


def fake_xp(log: list) -> SimpleNamespace:
    """An array module for FakeDeviceArray that logs every kernel it launches."""

    def kernel(ufunc):
        def launch(*args, **kwargs):
            log.append(("kernel", ufunc.__name__))
            return ufunc(*args, **kwargs)
        return launch

    def dev(a):
        return a.view(FakeDeviceArray)

    return SimpleNamespace(
        ndarray=FakeDeviceArray,
        dtype=numpy.dtype,
        asarray=lambda x: dev(numpy.asarray(x)),
        empty=lambda shape, dtype=float: dev(numpy.empty(shape, dtype)),
        ascontiguousarray=lambda x: dev(numpy.ascontiguousarray(x)),
        add=kernel(numpy.add), multiply=kernel(numpy.multiply), minimum=kernel(numpy.minimum),
        maximum=kernel(numpy.maximum), true_divide=kernel(numpy.true_divide),
        copyto=kernel(numpy.copyto),
        may_share_memory=numpy.may_share_memory,
    )


class _Fence:
    def __init__(self, delay: int, apply: Any = None) -> None:
        self.remaining = delay
        self.apply = apply  # the copy itself, run when the fence is first seen done
        self.done = False


class FakeEngine:
    """A staged-path copy engine whose copies finish only after `delay` polls (see module docstring)."""

    def __init__(self, log: list, delay: int = 2) -> None:
        self.log = log
        self.delay = delay
        self.pinned_blocks: list[numpy.ndarray] = []
        self._pending_h2d: list[_Fence] = []
        self.syncs = 0

    def pinned(self, nbytes: int) -> numpy.ndarray:
        block = numpy.full(nbytes, 0xEE, numpy.uint8)  # junk, so a missed copy is visible
        self.pinned_blocks.append(block)
        return block

    def after_compute(self) -> None:
        self.log.append(("after_compute",))

    def to_host(self, host: numpy.ndarray, device: Any, offset: int) -> _Fence:
        source = numpy.asarray(device).view(numpy.uint8)

        def copy() -> None:
            host[:] = source[offset : offset + host.nbytes]
            self.log.append(("d2h_done", offset, host.nbytes))

        self.log.append(("d2h", offset, host.nbytes))
        return _Fence(self.delay, copy)

    def to_device(self, device: Any, offset: int, host: numpy.ndarray) -> _Fence:
        target = numpy.asarray(device).view(numpy.uint8)
        snapshot = host  # read when the copy runs, as the GPU would: the block must stay untouched

        def copy() -> None:
            target[offset : offset + snapshot.nbytes] = snapshot
            self.log.append(("h2d_done", offset, snapshot.nbytes))

        self.log.append(("h2d", offset, host.nbytes))
        fence = _Fence(self.delay, copy)
        self._pending_h2d.append(fence)
        return fence

    def done(self, fence: _Fence | None) -> bool:
        if fence is None or fence.done:
            return True
        if fence.remaining > 0:
            fence.remaining -= 1
            return False
        self._complete(fence)
        return True

    def _complete(self, fence: _Fence) -> None:
        if not fence.done:
            fence.done = True
            if fence.apply is not None:
                fence.apply()

    def before_compute(self) -> _Fence:
        # The compute stream waits for every queued H2D: they have landed before the next kernel.
        for fence in self._pending_h2d:
            self._complete(fence)
        self._pending_h2d = []
        self.log.append(("before_compute",))
        # ...but, as on a GPU, the host learns that they finished (the pinned block is free) later
        return _Fence(self.delay)

    def synchronize(self) -> None:
        self.syncs += 1
        self.log.append(("sync",))


class RecordingComm:
    """An mpi4py communicator that records every buffer handed to MPI, and refuses device memory
    unless `device_ok` (the CUDA-aware case)."""

    def __init__(self, comm: MPI.Intracomm, log: list, device_ok: bool = False) -> None:
        self._comm = comm
        self.log = log
        self.device_ok = device_ok
        self.buffers: list[type] = []

    def _check(self, message: Any, what: str) -> None:
        buf = message[0] if isinstance(message, list | tuple) else message
        self.buffers.append(type(buf))
        on_device = isinstance(buf, FakeDeviceArray) or hasattr(buf, "__cuda_array_interface__")
        if on_device and not self.device_ok:
            raise AssertionError(f"{what}: a device buffer reached an MPI that is not CUDA-aware")
        self.log.append((what, "device" if on_device else "host", numpy.asarray(buf).nbytes))

    def Isend(self, message: Any, dest: int, tag: int) -> MPI.Request:  # noqa: N802 (mpi4py's name)
        self._check(message, "isend")
        return self._comm.Isend(message, dest, tag)

    def Irecv(self, message: Any, source: int, tag: int) -> MPI.Request:  # noqa: N802
        self._check(message, "irecv")
        return self._comm.Irecv(message, source, tag)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


def staged_backend(log: list, delay: int = 2, segment_bytes: int = 64) -> StagedCupyBackend:
    """A staged backend over fake device memory; small segments so short messages pipeline."""
    engine = FakeEngine(log, delay)
    pool = PinnedPool(engine.pinned, engine.done)
    return StagedCupyBackend(fake_xp(log), contextlib.nullcontext(), engine, pool, segment_bytes)


def direct_backend(log: list) -> CupyBackend:
    """A direct-path (CUDA-aware) backend over fake device memory."""
    return CupyBackend(fake_xp(log), contextlib.nullcontext(), FakeEngine(log))
