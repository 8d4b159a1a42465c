"""Arrays of other libraries (PyTorch, JAX, Numba, ...) in and out of mpiring without copies.

The collectives run on NumPy arrays (host memory) and CuPy arrays (device memory). Any other
array that offers DLPack (`__dlpack__`, `__dlpack_device__`) or, on the device, the CUDA array
interface (`__cuda_array_interface__`) is seen through one of those, sharing its memory:

    host memory    numpy.from_dlpack(x)                    (a NumPy view of x's memory)
    device memory  cupy.from_dlpack(x), cupy.asarray(x)     (a CuPy view; CuPy loaded only then)

A result comes back as the caller's own kind, sharing mpiring's result memory (the library's
`from_dlpack`), and an `out=` of any kind is written in place and returned as given.

This module never imports an array library other than NumPy: a foreign array is recognised by
the protocols it offers, and its library, already loaded since the caller holds one of its
arrays, is found in `sys.modules`.

Plans: the engine keys a host call's schedule by the layout of its arrays (shape, dtype,
contiguity), not by the arrays themselves, so a view made anew on every call finds the schedule
of the calls before it. Every view here is the one DLPack gave: it holds the exporter's memory
alive for as long as the call (or its request) holds the view.

Device streams: a DLPack export orders the producer's work before the consumer's stream
(`cupy.from_dlpack` passes CuPy's current stream); mpiring then works on CuPy's current stream.
There is no `stream=` argument: work on the current stream (docs/pytorch-and-jax.md).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from mpiring.errors import ArgumentError, ArgumentTypeError, Unconverted

# DLPack device types (dlpack.h, DLDeviceType): what NumPy can read, and the CUDA ones CuPy can
_HOST_DEVICES = frozenset((1, 3))  # kDLCPU, kDLCUDAHost (pinned host memory)
_DEVICE_DEVICES = frozenset((2, 13))  # kDLCUDA, kDLCUDAManaged

_NO_COPY = numpy.lib.NumpyVersion(numpy.__version__) >= "2.1.0"  # from_dlpack(copy=False)


def is_foreign(x: Any) -> bool:
    """Whether `x` is another library's array, offered through DLPack or the CUDA array interface
    (NumPy arrays and their subclasses, CuPy arrays and None are mpiring's own)."""
    if x is None or isinstance(x, numpy.ndarray):
        return False
    kind = type(x)
    if kind.__module__.startswith("cupy"):
        return False
    return hasattr(kind, "__dlpack__") or hasattr(kind, "__cuda_array_interface__")


def native(collective: str, name: str, x: Any, writable: bool = False) -> Any:
    """A foreign array `x` as a NumPy (host) or CuPy (device) array over the same memory, which
    keeps that memory alive; on any problem, an `Unconverted` that the collective's own argument
    check raises (so a refusal takes the same path as any bad argument: before a message moves,
    every rank kept in step).

    `writable`: `x` receives a result (out=): a read-only export is refused.
    """
    try:
        return _native(collective, name, x, writable)
    except ArgumentError as error:
        return Unconverted(error)


def _native(collective: str, name: str, x: Any, writable: bool) -> Any:
    kind = type(x).__name__
    if not hasattr(type(x), "__dlpack__"):  # the CUDA array interface alone: device memory
        return _device_view(collective, name, x, writable)
    try:  # host memory is the common case: asking the device first would cost as much again
        view = _from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as error:
        device = _device_type(x)
        if device in _DEVICE_DEVICES:
            return _device_view(collective, name, x, writable)
        if device not in _HOST_DEVICES:
            raise ArgumentTypeError(collective, name, f"this {kind} lives on a device mpiring cannot reach "
                                    f"(DLPack device type {device}): pass host memory or a CUDA array") from None
        raise ArgumentTypeError(collective, name, f"this {kind} cannot be shared without a copy through "
                                f"DLPack: {error}{_hint(error)}") from error
    if writable and not view.flags.writeable:
        raise ArgumentError(collective, name, f"this {kind} is read-only (its library exports it so; JAX "
                            "arrays are immutable): a result cannot be written into it; pass a writable "
                            "array as out=, or none and take the result")
    return view


def _from_dlpack(x: Any) -> numpy.ndarray:
    """NumPy's view of x's memory; never a copy (NumPy 2.1 and later say so to the exporter;
    before, the exporter gives its own memory as it is, or nothing)."""
    if _NO_COPY:
        return numpy.from_dlpack(x, copy=False)
    return numpy.from_dlpack(x)


def _device_type(x: Any) -> int:
    """x's DLPack device type; an array with only the CUDA array interface is on a CUDA device."""
    where = getattr(x, "__dlpack_device__", None)
    if where is not None:
        try:
            return int(where()[0])
        except Exception:  # noqa: BLE001 - a library's own refusal: fall back to the interface below
            pass
    return 2 if hasattr(x, "__cuda_array_interface__") else 1


def _hint(error: BaseException) -> str:
    text = str(error)
    if "gradient" in text:
        return " (pass tensor.detach(): it shares the memory)"
    if "dtype" in text.lower():
        return (" (NumPy has no such dtype: bfloat16 travels through torch.distributed on the mpiring "
                "backend, or as a NumPy array of ml_dtypes.bfloat16)")
    return ""


def _device_view(collective: str, name: str, x: Any, writable: bool) -> Any:
    """A CuPy array over a device array's memory (importing CuPy: device arrays need it)."""
    try:
        import cupy
    except ImportError:
        raise ArgumentTypeError(collective, name, f"this {type(x).__name__} is in device memory, which mpiring "
                                "reaches through CuPy: pip install 'mpiring[gpu]'") from None
    interface = getattr(x, "__cuda_array_interface__", None) if not hasattr(x, "__dlpack__") else None
    if writable and interface is not None and interface["data"][1]:
        raise ArgumentError(collective, name, f"this {type(x).__name__} is read-only: a result cannot be "
                            "written into it")
    try:
        return cupy.asarray(x) if interface is not None else cupy.from_dlpack(x)
    except Exception as error:  # noqa: BLE001 - any library's refusal, named in the error
        raise ArgumentTypeError(collective, name, f"this {type(x).__name__} cannot be shared with CuPy "
                                f"without a copy: {error}{_hint(error)}") from error


def library_of(like: Any) -> Any:
    """The loaded top-level module of `like`'s type (torch for a tensor), or None."""
    return sys.modules.get(type(like).__module__.partition(".")[0])


def as_kind(result: Any, like: Any) -> Any:
    """`result` (a NumPy or CuPy array) as an array of `like`'s library, sharing its memory: the
    array API's `from_dlpack` (JAX), else the library's own (PyTorch), else Numba's view of CUDA
    memory; `result` as it is where none of these applies."""
    if result is None or not is_foreign(like):
        return result
    namespace = getattr(like, "__array_namespace__", None)
    if namespace is not None:
        return namespace().from_dlpack(result)
    library = library_of(like)
    if library is not None and hasattr(library, "from_dlpack"):
        return library.from_dlpack(result)
    if library is not None and hasattr(getattr(library, "cuda", None), "as_cuda_array"):
        return library.cuda.as_cuda_array(result)
    return result


def convert(collective: str, x: Any, out: Any) -> tuple[Any, Any]:
    """x and out, each a native array where it was a foreign one (see native)."""
    if out is x and is_foreign(x):  # in place (torch.distributed's way): one view serves both
        x = out = native(collective, "out", x, writable=True)
        return x, out
    if is_foreign(x):
        x = native(collective, "x", x)
    if is_foreign(out):
        out = native(collective, "out", out, writable=True)
    return x, out


def result(value: Any, native_out: Any, x: Any, out: Any) -> Any:
    """A call's result for its caller: `out` itself where the result landed in it, else the result
    as the kind of array the caller passed (x's, or out's where only out was foreign)."""
    if value is None:
        return None
    if out is not None and value is native_out:
        return out
    return as_kind(value, x if is_foreign(x) else out)


class ConvertedRequest:
    """A nonblocking or persistent request of a call given foreign arrays: the same request, whose
    wait() and `result` give the result as the caller's kind. It holds the caller's arrays, and
    so their memory, while the call may still use it."""

    def __init__(self, request: Any, x: Any, out: Any, native_out: Any) -> None:
        self._request = request
        self._x, self._out, self._native_out = x, out, native_out

    def wait(self) -> Any:
        return result(self._request.wait(), self._native_out, self._x, self._out)

    @property
    def result(self) -> Any:
        return result(self._request.result, self._native_out, self._x, self._out)

    def __getattr__(self, name: str) -> Any:  # test(), start(), free() and the rest: the request's own
        return getattr(self._request, name)


def call(run: Any, collective: str, x: Any, out: Any, *rest: Any) -> Any:
    """Run a blocking call (`run`: the communicator's) on native views of x and out, and give its
    result back as the caller's kind."""
    native_x, native_out = convert(collective, x, out)
    return result(run(collective, native_x, native_out, *rest), native_out, x, out)


def start(run: Any, collective: str, x: Any, out: Any, *rest: Any) -> ConvertedRequest:
    """Start a nonblocking or persistent call (`run`: the communicator's) on native views of x
    and out (which its request holds, and so their memory, whatever the caller drops); its
    request gives the result back as the caller's kind."""
    native_x, native_out = convert(collective, x, out)
    return ConvertedRequest(run(collective, native_x, native_out, *rest), x, out, native_out)
