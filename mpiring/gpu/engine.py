"""The CUDA side of the staged path, on CuPy: two non-blocking copy streams and events.

The copy streams are created non-blocking on purpose: CuPy's default (current) stream is often
the legacy null stream, which would otherwise serialize with every copy and undo the overlap.
Ordering with the compute stream is therefore explicit, with events (see mpiring.gpu.staging).
"""

from __future__ import annotations

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
