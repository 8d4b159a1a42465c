"""The one seam between the algorithms and an array module (NumPy on the host, CuPy on a GPU).

Algorithm code never imports an array module: it allocates, combines and copies through the
`Backend` of the arrays it was given, and hands buffers to MPI through the transport calls
(`ready_for_mpi`, `send_message`, `receive_message`), or, for a `staged` backend, lets the
backend post a whole ring step itself (`post_staged`: device buffers copied through pinned host
memory in overlapping segments, see mpiring.gpu.staging).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy
from mpi4py import MPI

from mpiring import host_memory
from mpiring.ops import AVG, UFUNC_NAMES

# The dtypes every collective accepts: bool, signed and unsigned ints, float16/32/64, complex64/128;
# also ml_dtypes' bfloat16 on the host (is_bfloat16; the optional extra `bf16` installs it).
SUPPORTED_DTYPES = frozenset(
    numpy.dtype(name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)




def is_bfloat16(dtype: Any) -> bool:
    """Whether `dtype` is ml_dtypes' bfloat16 (NumPy sees it as a 2-byte void kind 'V'); known by
    its name, so mpiring never imports ml_dtypes itself: an array of it means it is loaded."""
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.name == "bfloat16"


def dtype_token(dtype: Any) -> str:
    """A dtype as short exact text that numpy.dtype() turns back into it: dtype.str ("<f8"), or
    "bfloat16" (whose dtype.str, "<V2", would come back as raw void)."""
    return "bfloat16" if is_bfloat16(dtype) else dtype.str


def dtype_from_token(token: str, xp: Any) -> Any:
    """The inverse of dtype_token (bfloat16 needs ml_dtypes loaded: a rank that only receives it
    loads it here)."""
    if token == "bfloat16":
        import ml_dtypes

        return numpy.dtype(ml_dtypes.bfloat16)
    return xp.dtype(token)


class Backend(Protocol):
    """What every backend provides (NumpyBackend here; CupyBackend, StagedCupyBackend in mpiring.gpu)."""

    name: str
    xp: Any
    staged: bool  # True: Ring.post hands the step to post_staged instead of giving buffers to MPI
    on_device: bool  # its arrays live on a device: a collective's own metadata then stays on the host
    plannable: bool  # whether repeated calls may be recorded as plans (a staged one records its steps: record_step)
    host_bytes: int  # a device backend's calls of at most this many bytes may run_on_host(x, out, call); 0: none

    def is_array(self, x: Any) -> bool: ...
    def asarray(self, x: Any) -> Any: ...
    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any: ...
    def empty_kept(self, shape: int | tuple[int, ...], dtype: Any) -> Any: ...
    def flat(self, x: Any) -> Any: ...
    def combine(self, op: str, a: Any, b: Any, out: Any) -> None: ...
    def finish(self, op: str, buf: Any, world_size: int) -> None: ...
    def copy(self, dst: Any, src: Any) -> None: ...
    def may_share_memory(self, a: Any, b: Any) -> bool: ...
    def ready_for_mpi(self) -> None: ...
    def send_message(self, buf: Any) -> list: ...
    def receive_message(self, buf: Any) -> tuple[list, Callable[[], None] | None]: ...


class NumpyBackend:
    """Host buffers. MPI reads and writes them directly; nothing needs synchronizing."""

    name = "numpy"
    xp = numpy
    staged = False
    on_device = False
    plannable = True
    host_bytes = 0  # already there

    def is_array(self, x: Any) -> bool:
        return isinstance(x, numpy.ndarray)

    def asarray(self, x: Any) -> numpy.ndarray:
        return numpy.asarray(x)

    def empty(self, shape: int | tuple[int, ...], dtype: numpy.dtype) -> numpy.ndarray:
        """An array for one call (a result, a temporary): numpy.empty, whose freed memory malloc
        hands out again; a fresh 2 MiB-page mapping per call would cost its page faults every time."""
        return numpy.empty(shape, dtype)

    def empty_kept(self, shape: int | tuple[int, ...], dtype: numpy.dtype) -> numpy.ndarray:
        """An array kept across calls (the scratch pool's): in 2 MiB pages from 1 MiB (host_memory)."""
        return host_memory.empty(shape, dtype, huge_from=host_memory.OWN_HUGE_FROM_BYTES)

    def flat(self, x: numpy.ndarray) -> numpy.ndarray:
        """A 1-D view of a C-contiguous array (a copy only if it is not contiguous)."""
        return numpy.ascontiguousarray(x).reshape(-1)

    def combine(self, op: str, a: Any, b: Any, out: Any) -> None:
        """out = a (op) b, elementwise, in the array's own dtype (integers wrap like NumPy)."""
        getattr(self.xp, UFUNC_NAMES[op])(a, b, out=out)

    def finish(self, op: str, buf: Any, world_size: int) -> None:
        """The last touch of a fully reduced chunk: avg divides the sum by the world size."""
        if op == AVG and buf.size:
            self.xp.true_divide(buf, world_size, out=buf)

    def copy(self, dst: Any, src: Any) -> None:
        self.xp.copyto(dst, src)

    def may_share_memory(self, a: Any, b: Any) -> bool:
        return bool(numpy.may_share_memory(a, b))

    def ready_for_mpi(self) -> None:
        """Make every pending write to buffers visible to MPI (a no-op on the host)."""

    # Buffers go to MPI as raw bytes, so every dtype travels, float16 and bool too.
    def send_message(self, buf: numpy.ndarray) -> list:
        """The buffer to hand MPI for a send."""
        return [buf, MPI.BYTE]

    def receive_message(self, buf: numpy.ndarray) -> tuple[list, Callable[[], None] | None]:
        """The buffer to hand MPI for a receive, and what to do once it has arrived (or None).

        A staged device backend receives into host memory and returns the copy to the device.
        """
        return [buf, MPI.BYTE], None


NUMPY = NumpyBackend()


_NDARRAY = numpy.ndarray


def _unregistered(x: Any) -> Backend:
    raise RuntimeError(f"no device backend is registered for {type(x).__name__} arrays "
                       "(import mpiring, which registers mpiring.gpu's)")


# Gives a device array its backend: mpiring.gpu.device_backend, which the package's composition
# root (mpiring/__init__.py) registers, so that this module, and the core, never name gpu/.
_device_backend: Callable[[Any], Backend] = _unregistered


def register_device_backend(factory: Callable[[Any], Backend]) -> None:
    """Name the function that gives a device (CuPy) array its backend."""
    global _device_backend
    _device_backend = factory


def backend_for(x: Any) -> Backend:
    """The backend that owns array `x` (array-likes that are not device arrays go to NumPy).

    A NumPy array costs one type check. A CuPy array is recognised by its type, without importing
    CuPy, so a caller that never uses CuPy never loads it; only then does the registered device
    backend (mpiring.gpu.device_backend) import it.
    """
    if type(x) is _NDARRAY:
        return NUMPY
    if is_device_array(x):
        return _device_backend(x)
    return NUMPY


def is_device_array(x: Any) -> bool:
    """Whether `x` is a CuPy array (its type comes from cupy and exposes the CUDA Array Interface)."""
    kind = type(x)
    return kind.__module__.startswith("cupy") and hasattr(kind, "__cuda_array_interface__")


def binding(array: Any) -> Any:
    """Where a plan or persistent request bound to `array` reads or writes it: its memory's
    address and whether it is read-only, its strides (None: C-contiguous), shape and element
    type, from the NumPy or CUDA array interface; None for None. An array restrided, resized or made read-only since is
    bound elsewhere. Anything without either interface gives a new object, equal to no other."""
    if array is None:
        return None
    face = getattr(array, "__cuda_array_interface__", None) or getattr(array, "__array_interface__", None)
    if face is None:
        return object()
    return face["data"], face.get("strides"), face["shape"], face["typestr"]
