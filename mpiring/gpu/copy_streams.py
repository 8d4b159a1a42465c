"""The CUDA side of the staged path, on CuPy: two non-blocking copy streams and events.

The copy streams are created non-blocking on purpose: CuPy's default (current) stream is often
the legacy null stream, which would otherwise serialize with every copy and undo the overlap.
Ordering with the compute stream is therefore explicit, with events (see mpiring.gpu.staging).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import numpy


class CupyCopyEngine:
    """Copies between device buffers and pinned host memory for one GPU (see staging.CopyEngine)."""

    def __init__(self, cupy: Any, device_id: int) -> None:
        self._cupy = cupy
        self._runtime = cupy.cuda.runtime
        self.device = cupy.cuda.Device(device_id)
        with self.device:
            self._d2h = cupy.cuda.Stream(non_blocking=True)
            self._h2d = cupy.cuda.Stream(non_blocking=True)

    def _event(self, stream: Any) -> Any:
        event = self._cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        return event

    def _compute(self) -> Any:
        """The stream CuPy queues kernels on for this device: the one the caller made current."""
        return self._cupy.cuda.get_current_stream(self.device.id)

    def pinned(self, nbytes: int) -> numpy.ndarray:
        memory = self._cupy.cuda.alloc_pinned_memory(nbytes)  # the array keeps it alive
        return numpy.frombuffer(memory, numpy.uint8, nbytes)

    def after_compute(self) -> None:
        with self.device:
            event = self._event(self._compute())
            self._d2h.wait_event(event)
            self._h2d.wait_event(event)

    def to_host(self, host: numpy.ndarray, device: Any, offset: int) -> Any:
        with self.device:
            self._runtime.memcpyAsync(
                host.ctypes.data, device.data.ptr + offset, host.nbytes, self._runtime.memcpyDeviceToHost,
                self._d2h.ptr,
            )
            return self._event(self._d2h)

    def to_device(self, device: Any, offset: int, host: numpy.ndarray) -> Any:
        with self.device:
            self._runtime.memcpyAsync(
                device.data.ptr + offset, host.ctypes.data, host.nbytes, self._runtime.memcpyHostToDevice,
                self._h2d.ptr,
            )
            return self._event(self._h2d)

    def fetch(self, host: numpy.ndarray, device: Any) -> None:
        """Copy flat `device` into `host` on the compute stream, after the kernels queued there,
        and wait for it: one stream, no events (mpiring.gpu.host_route's small calls)."""
        with self.device:
            stream = self._compute()
            self._runtime.memcpyAsync(host.ctypes.data, device.data.ptr, host.nbytes,
                                      self._runtime.memcpyDeviceToHost, stream.ptr)
            stream.synchronize()

    def put(self, device: Any, host: numpy.ndarray) -> Any:
        """Queue a copy of `host` into flat `device` on the compute stream, so later kernels see
        it; the fence says when `host` may be written again."""
        with self.device:
            stream = self._compute()
            self._runtime.memcpyAsync(device.data.ptr, host.ctypes.data, host.nbytes,
                                      self._runtime.memcpyHostToDevice, stream.ptr)
            return self._event(stream)

    def done(self, fence: Any) -> bool:
        return fence is None or fence.done

    def before_compute(self) -> Any:
        with self.device:
            event = self._event(self._h2d)
            self._compute().wait_event(event)
            return event

    def synchronize(self) -> None:
        """Wait for the compute stream only (not the whole device): what MPI must see is queued there."""
        self._compute().synchronize()


class DeviceBlock:
    """A cudaMalloc'd block that peers on this node can open by its IPC handle (freed with it)."""

    _serials = itertools.count(1)

    def __init__(self, runtime: Any, nbytes: int) -> None:
        self._runtime = runtime
        self.nbytes = nbytes
        self.ptr = runtime.malloc(nbytes)
        self.handle = bytes(runtime.ipcGetMemHandle(self.ptr))
        self.serial = next(self._serials)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown the driver frees it with the context
            self._runtime.free(self.ptr)


class CupyIpcEngine(CupyCopyEngine):
    """Device-to-device copies through CUDA IPC blocks (see mpiring.gpu.ipc.IpcEngine).

    Outgoing copies (own buffer -> own block) run on the first copy stream, incoming ones (peer
    block -> own buffer) on the second, so after_compute/before_compute order them with the
    kernels exactly as on the staged path.
    """

    def __init__(self, cupy: Any, device_id: int) -> None:
        super().__init__(cupy, device_id)
        self._opened: dict[bytes, tuple[int, int]] = {}  # handle -> (serial, mapped pointer)

    def ipc_block(self, nbytes: int) -> DeviceBlock:
        with self.device:
            return DeviceBlock(self._runtime, nbytes)

    def open_peer(self, handle: bytes, serial: int) -> int:
        known = self._opened.get(handle)
        if known is not None and known[0] == serial:
            return known[1]
        with self.device:
            if known is not None:  # the same handle bytes for a new allocation: drop the old mapping
                self._runtime.ipcCloseMemHandle(known[1])
            pointer = self._runtime.ipcOpenMemHandle(handle)
        self._opened[handle] = (serial, pointer)
        return pointer

    def to_block(self, block: DeviceBlock, device: Any, nbytes: int) -> Any:
        return self._copy(block.ptr, device.data.ptr, nbytes, self._d2h)

    def from_peer(self, device: Any, peer: int, nbytes: int) -> Any:
        return self._copy(device.data.ptr, peer, nbytes, self._h2d)

    def _copy(self, dst: int, src: int, nbytes: int, stream: Any) -> Any:
        with self.device:
            self._runtime.memcpyAsync(dst, src, nbytes, self._runtime.memcpyDeviceToDevice, stream.ptr)
            return self._event(stream)
