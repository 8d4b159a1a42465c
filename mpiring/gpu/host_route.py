"""Small device calls on host copies: copy x to pinned memory, run the host collective, copy back.

Where MPI cannot take device pointers (the staged and IPC paths), a small message costs far more
in GPU round trips than in bytes: every ring step of the device path waits for a copy to the host,
MPI, a copy back and a reduction kernel, each a stream round trip (docs/gpu.md#small-calls). On host copies the
whole call makes two copies and no kernel, and the host collective itself is planned:

    device x ──D2H──► pinned twin of x ──host collective──► pinned twin of out ──H2D──► device out
          (both copies on the caller's compute stream: after the kernels that wrote x, before
           the kernels that read out, with no event between streams)

It is taken by calls whose message has the same size on every rank (so every rank takes it, or
none does) and is at most `MPIRING_GPU_HOST_BYTES` (see mpiring.gpu.device_backend); the
reductions run in NumPy, with the same IEEE elementwise arithmetic as the device kernels.

The pinned twins are kept per (role, shape, dtype), so a repeated call hands the host collective
the same arrays and hits its plan. A twin that was copied to the device is reused only once that
copy finished.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy

from mpiring import environment

HOST_BYTES_ENV = "MPIRING_GPU_HOST_BYTES"
DEFAULT_HOST_BYTES = 512 << 10  # host copies measured faster up to 512 KiB at 2 and 4 ranks (docs/gpu.md)
# Twins kept (the least recently used goes first): a training loop's small calls come in few shapes.
MAX_TWINS = 32


def host_bytes_from_env() -> int:
    from_environment = environment.count(HOST_BYTES_ENV, "device backend")
    return DEFAULT_HOST_BYTES if from_environment is None else from_environment


class HostRoute:
    """Pinned twins of small device arrays and the copies between them (one per backend)."""

    def __init__(self, backend: Any, limit_bytes: int) -> None:
        self._backend = backend  # flat/empty on the device, and its copy engine
        self._engine = backend.engine
        self.limit_bytes = limit_bytes  # largest message taken; 0: never
        self._twins: OrderedDict[tuple, list] = OrderedDict()  # key -> [array, fence of its last H2D]
        self._abandoned: list[numpy.ndarray] = []  # twins of calls that raised: MPI may still use them

    def _twin(self, role: str, shape: tuple[int, ...], dtype: Any) -> list:
        """[array, fence of its last copy to the device, its bytes] for this role, shape and dtype."""
        key = (role, shape, dtype)
        entry = self._twins.pop(key, None)
        if entry is None:
            nbytes = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
            raw = self._engine.pinned(max(nbytes, 1))[:nbytes]
            entry = [raw.view(dtype).reshape(shape), None, raw]
            if len(self._twins) >= MAX_TWINS:
                self._twins.popitem(last=False)
        else:
            self._wait(entry[1])  # its last copy to the device still reads it
            entry[1] = None
        self._twins[key] = entry
        return entry

    def _abandon(self, *twins: numpy.ndarray | None) -> None:
        """A call on these twins raised: a peer's late message may still land in them, or MPI
        still read them, so they are never handed out again (and kept alive)."""
        for key, (array, *_) in list(self._twins.items()):
            if any(array is twin for twin in twins):
                del self._twins[key]
                self._abandoned.append(array)

    def _wait(self, fence: Any) -> None:
        while not self._engine.done(fence):  # one copy of at most limit_bytes: microseconds
            pass

    def run(self, x: Any, out: Any, call: Callable[[numpy.ndarray, numpy.ndarray | None], Any]) -> Any:
        """`call(host_x, host_out)` on pinned copies of device `x` (and a twin of `out`); its
        result copied back to `out`, or to a new device array. None stays None."""
        backend, engine = self._backend, self._engine
        twin_x = self._twin("x", x.shape, x.dtype)
        if x.nbytes:  # on the compute stream, after the kernels that wrote x
            engine.fetch(twin_x[2], x if x.flags.c_contiguous else backend.flat(x))
        twin_out = None if out is None else self._twin("out", out.shape, out.dtype)
        host_out = None if twin_out is None else twin_out[0]
        try:
            result = call(twin_x[0], host_out)
        except BaseException:
            self._abandon(twin_x[0], host_out)
            raise
        if result is None:
            return None
        if result is host_out:
            source = twin_out[2]
        else:  # out= not given: the host call allocated its result
            source = numpy.ascontiguousarray(result).reshape(-1).view(numpy.uint8)
            if out is None:
                out = backend.empty(result.shape, result.dtype)
        if out.nbytes:  # on the compute stream, before the kernels that read out
            fence = engine.put(out, source)
            if result is host_out:
                twin_out[1] = fence
        return out
