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
- `FakeIpcEngine`: the IPC path's engine over POSIX shared memory, which other ranks (processes)
  really open by name, as CUDA IPC opens a handle; its device-to-device copies are as late as the
  staged ones, so a descriptor sent before its copy finished, or a reduction before the copy in
  landed, gives wrong results.
- `fake_xp(log)`: the array module for FakeDeviceArray; every kernel is logged, so tests can
  check that the stream was synchronized between a kernel and MPI reading its output.
"""

from __future__ import annotations

import contextlib
import itertools
from multiprocessing import resource_tracker, shared_memory
from types import SimpleNamespace
from typing import Any

import numpy
from mpi4py import MPI

from mpiring.gpu.backend import CupyBackend, IpcCupyBackend, StagedCupyBackend
from mpiring.gpu.staging import PinnedPool


class FakeDeviceArray(numpy.ndarray):
    """Host memory standing in for GPU memory in tests."""


def route_to(monkeypatch: Any, backend: Any) -> None:
    """Make the communicator's argument checks and its engine see `backend` as the backend of
    every FakeDeviceArray (mpiring.backend.backend_for, as both modules hold it)."""
    import mpiring.communicator
    import mpiring.engine.engine

    original = mpiring.communicator.backend_for
    for module in (mpiring.communicator, mpiring.engine.engine):
        monkeypatch.setattr(module, "backend_for", lambda x: backend if isinstance(x, FakeDeviceArray) else original(x))


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

    def fetch(self, host: numpy.ndarray, device: Any) -> None:
        # on the compute stream, waited for: the fake's kernels ran already, so the bytes are final
        host[:] = numpy.asarray(device).reshape(-1).view(numpy.uint8)[: host.nbytes]
        self.log.append(("fetch", host.nbytes))

    def put(self, device: Any, host: numpy.ndarray) -> _Fence:
        # on the compute stream: the fake's later kernels run after it, so it lands now; the host
        # learns that its bytes may be reused only when the fence is seen done
        numpy.asarray(device).reshape(-1).view(numpy.uint8)[: host.nbytes] = host
        self.log.append(("put", host.nbytes))
        return _Fence(self.delay)

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


class SharedBlock:
    """A block of shared memory posing as an IPC-exportable device block."""

    _serials = itertools.count(1)

    def __init__(self, nbytes: int) -> None:
        self.memory = shared_memory.SharedMemory(create=True, size=nbytes)
        self.nbytes = nbytes
        self.array = numpy.ndarray(nbytes, numpy.uint8, self.memory.buf)
        self.array[:] = 0xEE  # junk, so a missed copy is visible
        self.handle = self.memory.name.encode().ljust(64, b"\0")
        self.serial = next(self._serials)

    def close(self) -> None:
        del self.array
        self.memory.close()
        self.memory.unlink()


class FakeIpcEngine(FakeEngine):
    """The IPC path's engine on shared memory (see module docstring). `opens` counts handles opened."""

    def __init__(self, log: list, delay: int = 2) -> None:
        super().__init__(log, delay)
        self.blocks: list[SharedBlock] = []
        self.opened: dict[bytes, tuple[int, Any, numpy.ndarray]] = {}  # handle -> (serial, memory, view)
        self.opens = 0

    def ipc_block(self, nbytes: int) -> SharedBlock:
        block = SharedBlock(nbytes)
        self.blocks.append(block)
        return block

    def open_peer(self, handle: bytes, serial: int) -> numpy.ndarray:
        known = self.opened.get(handle)
        if known is not None and known[0] == serial:
            return known[2]
        memory = shared_memory.SharedMemory(name=handle.rstrip(b"\0").decode())
        resource_tracker.unregister(memory._name, "shared_memory")  # the exporter unlinks it, not us
        view = numpy.ndarray(memory.size, numpy.uint8, memory.buf)
        self.opened[handle] = (serial, memory, view)
        self.opens += 1
        return view

    def to_block(self, block: SharedBlock, device: Any, nbytes: int) -> _Fence:
        source = numpy.asarray(device).view(numpy.uint8)

        def copy() -> None:
            block.array[:nbytes] = source[:nbytes]

        self.log.append(("to_block", nbytes))
        return _Fence(self.delay, copy)

    def from_peer(self, device: Any, peer: numpy.ndarray, nbytes: int) -> _Fence:
        target = numpy.asarray(device).view(numpy.uint8)

        def copy() -> None:
            target[:nbytes] = peer[:nbytes]

        self.log.append(("from_peer", nbytes))
        fence = _Fence(self.delay, copy)
        self._pending_h2d.append(fence)  # the compute stream's wait lands it, as on the staged path
        return fence

    def close(self) -> None:
        memories = [memory for _, memory, _ in self.opened.values()]
        self.opened.clear()  # drops the views first: a mapping with views alive cannot close
        for memory in memories:
            with contextlib.suppress(BufferError):
                memory.close()
        for block in self.blocks:
            block.close()
        self.blocks.clear()


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

    def Send_init(self, message: Any, dest: int, tag: int) -> MPI.Prequest:  # noqa: N802 (a plan's send)
        self._check(message, "send_init")
        return self._comm.Send_init(message, dest, tag)

    def Recv_init(self, message: Any, source: int, tag: int) -> MPI.Prequest:  # noqa: N802 (a plan's receive)
        self._check(message, "recv_init")
        return self._comm.Recv_init(message, source, tag)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


def staged_backend(log: list, delay: int = 2, segment_bytes: int = 64, host_bytes: int = 0) -> StagedCupyBackend:
    """A staged backend over fake device memory; small segments so short messages pipeline.
    Small calls take the device path unless `host_bytes` sends them through host copies."""
    engine = FakeEngine(log, delay)
    pool = PinnedPool(engine.pinned, engine.done)
    return StagedCupyBackend(fake_xp(log), contextlib.nullcontext(), engine, pool, segment_bytes,
                             host_bytes=host_bytes)


def direct_backend(log: list) -> CupyBackend:
    """A direct-path (CUDA-aware) backend over fake device memory."""
    return CupyBackend(fake_xp(log), contextlib.nullcontext(), FakeEngine(log))


def ipc_backend(log: list, delay: int = 2, host_bytes: int = 0) -> IpcCupyBackend:
    """An IPC backend over fake device memory; its fallback (other nodes) is the staged backend."""
    engine = FakeIpcEngine(log, delay)
    return IpcCupyBackend(fake_xp(log), contextlib.nullcontext(), engine, staged_backend(log, delay),
                          host_bytes=host_bytes)


def on_host(x: Any) -> numpy.ndarray:
    assert isinstance(x, FakeDeviceArray), f"result is {type(x).__name__}, not a device array"
    return numpy.asarray(x)


def check_collectives_on_fake_device(comm: Any, algorithm: str | None) -> None:
    """Every collective on fake device buffers against NumPy oracles (lengths 0 to 333, five
    dtype/op pairs, roots off 0), and only host memory handed to MPI (comm's RecordingComm)."""
    from oracles import all_inputs, assert_same, numpy_reduce

    n, rank = comm.size, comm.rank
    for seed, length in enumerate([0, 1, n + 1, 333]):
        for dtype, op in ((numpy.float32, "sum"), (numpy.int64, "prod"), (numpy.float16, "max"),
                          (numpy.complex128, "avg"), (numpy.bool_, "min")):
            inputs = all_inputs(seed, n, length, dtype, op)
            got = comm.allreduce(to_device(inputs[rank]), op=op, algorithm=algorithm)
            assert_same(on_host(got), numpy_reduce(op, inputs), f"allreduce {op} {numpy.dtype(dtype)} {length}")
            got = comm.reduce(to_device(inputs[rank]), op=op, root=n - 1, algorithm=algorithm)
            if rank == n - 1:
                assert_same(on_host(got), numpy_reduce(op, inputs), f"reduce {op} {length}")
        rows = all_inputs(seed, n, (length, 3), numpy.float64)
        got = comm.reduce_scatter(to_device(rows[rank]), algorithm=algorithm)
        assert_same(on_host(got), numpy.array_split(numpy_reduce("sum", rows), n)[rank], f"reduce_scatter {length}")
        assert_same(on_host(comm.allgather(to_device(rows[rank]), algorithm=algorithm)), numpy.concatenate(rows),
                    f"allgather {length}")
        got = comm.gather(to_device(rows[rank]), root=0, algorithm=algorithm)
        if rank == 0:
            assert_same(on_host(got), numpy.concatenate(rows), f"gather {length}")
        root = n // 2
        got = comm.broadcast(to_device(rows[root] if rank == root else numpy.zeros_like(rows[root])), root=root,
                             algorithm=algorithm)
        assert_same(on_host(got), rows[root], f"broadcast {length}")
        part = numpy.array_split(rows[root], n)[rank]
        out = to_device(numpy.zeros_like(part))
        got = comm.scatter(to_device(rows[root]) if rank == root else None, root=root, out=out, algorithm=algorithm)
        assert got is out
        assert_same(on_host(got), part, f"scatter {length}")
    assert all(kind is numpy.ndarray for kind in comm._ring.comm.buffers), "only host memory reached MPI"
