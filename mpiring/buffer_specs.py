"""mpi4py's buffer specifications read as views of the caller's memory, for the drop-in's
uppercase methods (mpiring.buffer_api).

A spec names a buffer and, optionally, a count, a displacement and a datatype: an array;
[array, datatype]; [array, count, datatype]; [array, (count, displ), datatype];
[array, (counts, displs), datatype] for the v-variants (`vector`, or `packed_blocks` for its
common packed forms); [buffer, (counts, displs), datatypes] for Alltoallw (`bytes_vector`);
MPI.IN_PLACE or None for an in-place send buffer (`is_in_place`). `simple` reads a plain spec;
its common forms are read in C first (native.spec_items). The views are never copies, so a
collective run on them leaves its result in the caller's receive buffer.

Datatypes: the predefined ones; long double (MPI.LONG_DOUBLE, MPI.C_LONG_DOUBLE_COMPLEX) as its
bytes, wherever nothing is reduced; derived datatypes whose elements are of one dtype at one
stride (contiguous, vector, hvector, indexed, struct), as strided views of the caller's memory.
docs/dropin.md lists what is refused, and why. A spec every rank can check alone (an unsupported
datatype or op, a count that does not fit its buffer) raises ArgumentError here, before any
message moves.
"""

from __future__ import annotations

import array
import contextlib
import math
import mmap
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import Any

import numpy
from mpi4py import MPI
from mpi4py.util import dtlib

from mpiring.backend import NUMPY, SUPPORTED_DTYPES, backend_for
from mpiring.engine import native
from mpiring.engine.partition import split_bounds
from mpiring.errors import ArgumentError, ArgumentTypeError, Unconverted

# mpi4py's predefined ops and the lowercase op each one runs as
OPS = (
    (MPI.SUM, "sum"), (MPI.PROD, "prod"), (MPI.MIN, "min"), (MPI.MAX, "max"),
    (MPI.LAND, "land"), (MPI.LOR, "lor"), (MPI.LXOR, "lxor"),
    (MPI.BAND, "band"), (MPI.BOR, "bor"), (MPI.BXOR, "bxor"),
)
_OP_NAMES = ", ".join(f"MPI.{name.upper()}" for _, name in OPS)
_NDARRAY = numpy.ndarray


def op_name(collective: str, op: Any) -> str:
    """The lowercase op name for an mpi4py MPI.Op (MAXLOC, MINLOC, REPLACE, user ops: refused)."""
    for known, name in OPS:  # the predefined objects themselves: the common case, without a comparison in MPI
        if op is known:
            return name
    if isinstance(op, MPI.Op):
        for known, name in OPS:
            if op == known:
                return name
        label = next((f"MPI.{n}" for n in ("MAXLOC", "MINLOC", "REPLACE", "NO_OP")
                      if getattr(MPI, n, None) is not None and op == getattr(MPI, n)), "a user-defined MPI.Op")
        raise ArgumentError(collective, "op", f"{label} is not supported; supported: {_OP_NAMES}")
    raise ArgumentTypeError(collective, "op", f"must be an MPI.Op ({_OP_NAMES}), got {op!r}")


def is_in_place(spec: Any) -> bool:
    """Whether a send buffer spec says "in place" (MPI.IN_PLACE, or None as mpi4py takes it)."""
    return spec is None or spec is MPI.IN_PLACE


# Element types mpiring moves but does not reduce (its reductions have no long double): their
# bytes travel, so MPI.LONG_DOUBLE and MPI.C_LONG_DOUBLE_COMPLEX work in every call that does not reduce.
_MOVED_AS_BYTES = frozenset(numpy.dtype(t) for t in (numpy.longdouble, numpy.clongdouble)) - SUPPORTED_DTYPES
_REDUCING = frozenset(("Reduce", "Allreduce", "Reduce_scatter_block", "Reduce_scatter", "Scan", "Exscan"))


@dataclass(frozen=True)
class _Layout:
    """Where the elements of a datatype that is not one element of a supported dtype lie, in
    elements of `base` from the buffer's start: instance i holds `per` elements, element k at
    first + i * extent + k * step."""

    name: str
    base: numpy.dtype
    first: int
    step: int
    per: int
    extent: int
    moved_as_bytes: bool = False  # long double: its bytes travel, and reductions are refused


def _datatype_dtype(collective: str, argument: str, datatype: Any) -> numpy.dtype | _Layout:
    """The NumPy dtype of a predefined MPI datatype (or mpi4py typecode string); a _Layout for
    long double and for a derived datatype whose elements are of one dtype at one stride."""
    named = _NAMED.get(id(datatype))
    if named is not None and named[0] is datatype:  # a predefined one: known
        return named[1]
    if isinstance(datatype, str):
        try:
            datatype = dtlib.from_numpy_dtype(datatype)
        except (TypeError, ValueError, KeyError) as error:
            raise ArgumentTypeError(collective, argument, f"unknown typecode {datatype!r} ({error})") from None
    if not isinstance(datatype, MPI.Datatype):
        raise ArgumentTypeError(collective, argument, f"expected an MPI.Datatype, got {datatype!r}")
    named = datatype.combiner == MPI.COMBINER_NAMED
    name = datatype.Get_name() or ("a derived datatype" if not named else repr(datatype))
    try:
        dtype = dtlib.to_numpy_dtype(datatype)
    except (TypeError, ValueError, KeyError) as error:
        what = "a derived datatype that mpi4py.util.dtlib cannot map" if not named else "it has no NumPy dtype"
        raise ArgumentTypeError(collective, argument, f"{name} is not supported ({what}: {error})") from None
    if dtype in SUPPORTED_DTYPES:
        return dtype
    if dtype in _MOVED_AS_BYTES:
        return _Layout(name, numpy.dtype(numpy.uint8), 0, 1, dtype.itemsize, dtype.itemsize, moved_as_bytes=True)
    if dtype.fields is None and dtype.subdtype is None:
        raise ArgumentTypeError(collective, argument, f"{name} is not supported (its dtype {dtype} is not; mpiring "
                                "takes bool, (unsigned) integers, float16/32/64, complex64/128 and long double)")
    if named:
        raise ArgumentTypeError(collective, argument, f"{name} is not supported (pair types are for MAXLOC and "
                                "MINLOC, which mpiring does not have)")
    return _derived_layout(collective, argument, datatype, dtype, name)


def _derived_layout(collective: str, argument: str, datatype: Any, dtype: numpy.dtype, name: str) -> _Layout:
    """A derived datatype as evenly spaced elements of one supported dtype (contiguous, vector,
    hvector, indexed and struct types whose elements lie at one stride), else refused by name."""
    run = _run_of(dtype, 0)
    if run is None:
        raise ArgumentTypeError(collective, argument, f"{name} is not supported (a derived datatype whose elements "
                                "are not of one dtype at one stride, in order)")
    first, step, per, base = run
    size = base.itemsize
    if (base not in SUPPORTED_DTYPES or per == 0 or datatype.extent <= 0
            or any(value % size for value in (first, step, datatype.extent))):
        raise ArgumentTypeError(collective, argument, f"{name} is not supported (a derived datatype of {per} {base} "
                                f"elements, extent {datatype.extent} bytes)")
    return _Layout(name, base, first // size, step // size, per, datatype.extent // size)


def _run_of(dtype: numpy.dtype, offset: int) -> tuple[int, int, int, numpy.dtype] | None:
    """A NumPy dtype (as mpi4py.util.dtlib maps a datatype) as one run of elements in typemap
    order: (byte offset of the first, byte step, count, element dtype), or None if its elements
    are not of one dtype at one positive step."""
    if dtype.names is not None:
        runs = [_run_of(dtype.fields[name][0], offset + dtype.fields[name][1]) for name in dtype.names]
        return _joined(runs)
    if dtype.subdtype is not None:
        inner, shape = dtype.subdtype
        copies = math.prod(shape)
        run = _run_of(inner, offset)
        if run is None or copies == 1:
            return run
        first, step, count, base = run
        if count == 1:  # one element per copy: the copies are the run
            return first, inner.itemsize, copies, base
        return (first, step, count * copies, base) if step * count == inner.itemsize else None
    return offset, dtype.itemsize, 1, dtype


def _joined(runs: list[tuple[int, int, int, numpy.dtype] | None]) -> tuple[int, int, int, numpy.dtype] | None:
    """Runs one after another as one run, or None where they do not continue each other."""
    joined = None
    for run in runs:
        if run is None:
            return None
        if run[2] == 0:
            continue
        if joined is None:
            joined = run
            continue
        first, step, count, base = joined
        first2, step2, count2, base2 = run
        stride = step if count > 1 else (step2 if count2 > 1 else first2 - first)
        if base2 != base or stride <= 0 or first2 != first + count * stride or (count2 > 1 and step2 != stride):
            return None
        joined = first, stride, count + count2, base
    return joined


class _Instances:
    """A buffer seen as instances of a _Layout. Slicing instances gives a view of their elements
    (strided where they have gaps), which simple() and vector() use as they use a flat array:
    `size` counts instances, the views elements (`unit` per instance)."""

    def __init__(self, collective: str, argument: str, base: numpy.ndarray, layout: _Layout) -> None:
        self._collective, self._argument = collective, argument
        self._base = base  # the buffer as a flat array of layout.base
        self.layout = layout
        self.dtype = layout.base
        self.unit = layout.per
        last = layout.first + (layout.per - 1) * layout.step  # instance 0's last element
        self.size = 0 if last >= base.size else (base.size - 1 - last) // layout.extent + 1

    def __getitem__(self, where: slice) -> numpy.ndarray:
        start, stop, _ = where.indices(self.size)
        count = max(stop - start, 0)
        layout = self.layout
        spaced = layout.per == 1 or layout.extent == layout.per * layout.step
        if count > 1 and not spaced:
            raise ArgumentTypeError(self._collective, self._argument, f"{layout.name} is not supported here (a "
                                    f"derived datatype whose {count} instances are not evenly spaced elements: "
                                    "mpiring takes a derived datatype as one strided view)")
        n = count * layout.per
        step = layout.step if layout.per > 1 else layout.extent
        begin = layout.first + start * layout.extent
        view = self._base[begin : begin + (n - 1) * step + 1 : step] if n else self._base[begin:begin]
        if view.size != n:
            raise ArgumentError(self._collective, self._argument, f"{count} instances of {layout.name} run past "
                                "the buffer")
        return view


def _instances(collective: str, argument: str, flat: numpy.ndarray, layout: _Layout) -> _Instances:
    if layout.moved_as_bytes and collective in _REDUCING:
        raise ArgumentTypeError(collective, argument, f"reductions of {layout.name} are not supported (mpiring's "
                                "reductions have no long double; it moves long double data in every other call)")
    if flat.dtype != layout.base:
        if flat.nbytes % layout.base.itemsize:
            raise ArgumentError(collective, argument, f"the buffer's {flat.nbytes} bytes are not a whole number "
                                f"of {layout.base} elements")
        flat = flat.view(numpy.uint8).view(layout.base)
    return _Instances(collective, argument, flat, layout)


_DLPACK_CPU = 1  # DLPack's kDLCPU device type


def _host_array(collective: str, argument: str, buf: Any, datatype: Any, refused: str | None = None) -> numpy.ndarray:
    """A buffer object's memory as a NumPy array (a DLPack object's as bytes, which the spec's
    datatype then reads); what is not host memory refused by name (`refused`: why its own DLPack
    export could not give its dtype)."""
    try:
        return numpy.asarray(memoryview(buf))
    except TypeError:
        pass
    kind = type(buf).__name__
    if buf is MPI.BOTTOM:
        raise ArgumentError(collective, argument, "MPI.BOTTOM is not supported (absolute addresses: mpiring "
                            "moves the elements of one buffer)")
    if hasattr(buf, "__cuda_array_interface__"):
        raise ArgumentTypeError(collective, argument, f"{kind} is a device buffer (__cuda_array_interface__): "
                                "device buffers are not supported by the uppercase API; pass CuPy arrays to the "
                                "lowercase collectives")
    if hasattr(buf, "__dlpack__"):
        try:
            device = buf.__dlpack_device__()[0]
        except Exception as error:
            raise ArgumentTypeError(collective, argument, f"{kind}: __dlpack_device__ failed ({error})") from None
        if device != _DLPACK_CPU:
            raise ArgumentTypeError(collective, argument, f"{kind} is on DLPack device type {int(device)}: device "
                                    "buffers are not supported by the uppercase API; pass CuPy arrays to the "
                                    "lowercase collectives")
        if datatype is None:
            why = f" ({refused})" if refused else ""
            raise ArgumentTypeError(collective, argument, f"{kind} offers its memory through DLPack, which could not "
                                    f"give its element type{why}: DLPack buffers without a datatype are not "
                                    "supported; name one ([buf, MPI.DOUBLE]) or pass a NumPy array")
        try:  # mpi4py's own DLPack import: the memory as writable bytes, kept alive by the array
            return numpy.asarray(MPI.buffer(buf))
        except Exception as error:
            raise ArgumentTypeError(collective, argument, f"{kind}: its DLPack export failed "
                                    f"({type(error).__name__}: {error})") from error
    raise ArgumentTypeError(collective, argument, f"{kind} is not a buffer (expected an array, a buffer object or a "
                            "list [buffer, ...])")


def _items(collective: str, argument: str, buf: Any, datatype: Any) -> Any:
    """The buffer's memory as a flat array of the datatype's elements (a view, never a copy), or
    as _Instances of a datatype of several elements (derived) or of long double."""
    if isinstance(buf, (MPI.Datatype, list, tuple)):
        raise ArgumentTypeError(collective, argument, f"expected a buffer first in the spec, got {type(buf).__name__}")
    refused = None  # why another library's array could not be seen with its own dtype
    if datatype is None and _foreign_host_array(buf):  # a tensor, a JAX array...: a view with its own dtype
        from mpiring import interop

        seen = interop.native(collective, argument, buf)
        if isinstance(seen, Unconverted):
            refused = seen.error.problem
        else:
            buf = seen
    if backend_for(buf) is not NUMPY:
        raise ArgumentTypeError(collective, argument, "device arrays are not supported by the uppercase API: "
                                "use the lowercase collectives (comm.allreduce(x, out=y), ...)")
    if not isinstance(buf, numpy.ndarray):
        buf = _host_array(collective, argument, buf, datatype, refused)
    if not (buf.flags.c_contiguous or buf.flags.f_contiguous):
        raise ArgumentError(collective, argument, "the buffer is not contiguous (MPI reads and writes it as one "
                            "block of memory): pass a contiguous array")
    flat = buf.reshape(-1, order="A")  # memory order: a view for C- and Fortran-contiguous arrays
    if datatype is None:
        if flat.dtype not in SUPPORTED_DTYPES:
            if flat.dtype not in _MOVED_AS_BYTES:
                raise ArgumentTypeError(collective, argument, f"buffers of dtype {flat.dtype} are not supported")
            size = flat.dtype.itemsize
            return _instances(collective, argument, flat, _Layout(f"long double ({flat.dtype})",
                                                                  numpy.dtype(numpy.uint8), 0, 1, size, size,
                                                                  moved_as_bytes=True))
        return flat
    dtype = _datatype_dtype(collective, argument, datatype)
    if isinstance(dtype, _Layout):
        return _instances(collective, argument, flat, dtype)
    if flat.dtype != dtype:  # the memory seen as the datatype's elements, as MPI sees it
        if flat.nbytes % dtype.itemsize:
            raise ArgumentError(collective, argument, f"the buffer's {flat.nbytes} bytes are not a whole number "
                                f"of {dtype} elements")
        flat = flat.view(numpy.uint8).view(dtype)
    return flat


def _foreign_host_array(buf: Any) -> bool:
    """Whether `buf` is another library's array in host memory without the buffer protocol
    (a CPU torch tensor, a JAX array: mpiring.interop decides, loaded only then), whose dtype
    comes with it through DLPack. Device buffers are refused as any other (_host_array)."""
    if buf is None or isinstance(buf, (numpy.ndarray, bytes, bytearray, memoryview)):
        return False
    from mpiring import interop

    if not interop.is_foreign(buf) or hasattr(buf, "__cuda_array_interface__"):
        return False
    try:
        return buf.__dlpack_device__()[0] == _DLPACK_CPU
    except Exception:  # noqa: BLE001 - the object's own failure: _host_array names it
        return False


def _count(collective: str, argument: str, value: Any) -> int:
    if value.__class__ is int and value >= 0:  # the common case, without the ABC check below
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ArgumentError(collective, argument, f"counts and displacements must be non-negative integers, "
                            f"got {value!r}")
    return int(value)


def _unpack(collective: str, argument: str, spec: Any, vector: bool) -> tuple[Any, Any, Any, Any]:
    """(buffer, count(s), displacement(s), datatype) from any of mpi4py's spec forms, missing
    parts None: buf; [buf, datatype]; [buf, count]; [buf, (count, displ)]; [buf, count, datatype];
    [buf, (count, displ), datatype]; [buf, count, displ, datatype]. A plain spec also takes the
    pair as a list; a v-variant's only as a tuple (a list there is the counts)."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    if not 2 <= len(spec) <= 4:
        raise ArgumentError(collective, argument, f"expected a buffer or a list of 2 to 4 items, got {len(spec)}")
    if len(spec) == 4:
        return tuple(spec)
    buf, counts, datatype = spec[0], spec[1], spec[2] if len(spec) == 3 else None
    if len(spec) == 2 and isinstance(counts, (MPI.Datatype, str)):
        return buf, None, None, counts
    pair = isinstance(counts, tuple) or (not vector and isinstance(counts, list))
    if pair:
        if len(counts) != 2:
            raise ArgumentError(collective, argument, f"expected a pair (count, displacement), got {counts!r}")
        return buf, counts[0], counts[1], datatype
    return buf, counts, None, datatype


def _named_datatypes() -> dict[int, tuple[Any, numpy.dtype]]:
    """{id: (datatype, dtype)} of mpi4py's predefined datatype objects whose elements mpiring
    moves as they are (MPI.FLOAT, MPI.DOUBLE, ...): a spec [array, MPI.FLOAT] of an array of that
    dtype is read at once (`simple`). Each object is kept, so no other can take its id."""
    named = {}
    for name in dir(MPI):
        datatype = getattr(MPI, name)
        if isinstance(datatype, MPI.Datatype) and datatype != MPI.DATATYPE_NULL:
            with contextlib.suppress(Exception):  # pair types, MPI-only types: the generic path names them
                dtype = dtlib.to_numpy_dtype(datatype)
                if dtype in SUPPORTED_DTYPES:
                    named[id(datatype)] = (datatype, dtype)
    return named


_NAMED = _named_datatypes()


def _named_items(buf: Any, datatype: Any) -> Any:
    """The flat elements of a contiguous NumPy array seen as a predefined datatype (another
    datatype than the array's reinterprets its bytes, as in MPI), or None where the generic
    parse must look (any other buffer or datatype)."""
    named = _NAMED.get(id(datatype))
    if named is None or named[0] is not datatype or buf.__class__ is not _NDARRAY or not buf.flags.c_contiguous:
        return None
    dtype = buf.dtype
    if dtype is not named[1]:  # (NumPy's dtypes of one kind are one object: the common case ends here)
        if dtype not in SUPPORTED_DTYPES or buf.nbytes % named[1].itemsize:
            return None
        if dtype != named[1]:
            return buf.reshape(-1).view(named[1])
    return buf if buf.ndim == 1 else buf.reshape(-1)


def _same(buf: Any) -> Any:
    return buf


# Buffer objects of bytes that mpi4py's own programs pass (its OSU demos: an mmap), seen at once
# as a flat array of uint8; any other object takes _items' generic route.
_BYTE_BUFFERS = {bytearray: partial(numpy.frombuffer, dtype=numpy.uint8),
                 mmap.mmap: partial(numpy.frombuffer, dtype=numpy.uint8)}


def _common_items(spec: Any, blocks: int) -> Any:
    """The common forms of a spec at once, as native.spec_items reads them in C (and arrays of
    several axes, flattened): the elements, or None where the generic parse must look."""
    if spec.__class__ is _NDARRAY and spec.flags.c_contiguous and spec.dtype in SUPPORTED_DTYPES and (
            blocks == 1 or spec.size % blocks == 0):
        return spec if spec.ndim == 1 else spec.reshape(-1)  # the caller's own array, flat
    if spec.__class__ is list and 2 <= len(spec) <= 3:  # [array, MPI.FLOAT], [buffer, n, MPI.BYTE]
        buf = spec[0]
        flat = _named_items(buf if buf.__class__ is _NDARRAY else _BYTE_BUFFERS.get(buf.__class__, _same)(buf),
                            spec[-1])
        if flat is not None:
            if len(spec) == 2:
                if blocks == 1 or flat.size % blocks == 0:
                    return flat
            elif spec[1].__class__ is int and 0 <= spec[1] * blocks <= flat.size:
                return flat[: spec[1] * blocks]
    elif spec.__class__ in _BYTE_BUFFERS:  # bytearray(n), an mmap: their bytes
        flat = numpy.frombuffer(spec, numpy.uint8)
        if blocks == 1 or flat.size % blocks == 0:
            return flat
    return None


_SPEC_ITEMS = native.spec_items(_NAMED, SUPPORTED_DTYPES, _BYTE_BUFFERS)  # _common_items in C (None: not built)


def simple(collective: str, argument: str, spec: Any, blocks: int = 1) -> Any:
    """The elements a plain spec names: a view of the caller's memory.

    With blocks > 1 (the receive buffer of Gather and Allgather, the send buffer of Scatter and
    Reduce_scatter_block) the spec holds one block per rank: a count given is the count of one
    block, as MPI's recvcount is, and without one the buffer must split into equal blocks.
    """
    flat = None if _SPEC_ITEMS is None else _SPEC_ITEMS(spec, blocks)
    if flat is None:
        flat = _common_items(spec, blocks)
    if flat is not None:
        return flat
    buf, count, displ, datatype = _unpack(collective, argument, spec, vector=False)
    if buf is None:
        raise ArgumentError(collective, argument, "a buffer is needed here")
    items = _items(collective, argument, buf, datatype)
    displ = 0 if displ is None else _count(collective, argument, displ)
    if count is None:
        count, rest = divmod(items.size - displ, blocks)
        if rest:
            raise ArgumentError(collective, argument, f"{items.size - displ} elements do not split into {blocks} "
                                "equal blocks (one per rank)")
    count = _count(collective, argument, count) * blocks
    if displ + count > items.size:
        raise ArgumentError(collective, argument, f"{count} elements from displacement {displ} runs past the "
                            f"buffer's {items.size}")
    return items[displ : displ + count]


@dataclass
class Vector:
    """A v-variant's buffer: block k is items[displs[k] : displs[k] + spans[k]], counts[k]
    elements (spans and displacements count the datatype's instances, counts its elements: the
    same numbers unless items are _Instances of several elements each)."""

    items: Any
    counts: list[int]
    displs: list[int]
    spans: list[int]

    @property
    def packed(self) -> Any:
        """The view holding every block in rank order without gaps, or None when they are not."""
        start = self.displs[0] if self.displs else 0
        if all(d == start + s for d, s in zip(self.displs, _starts(self.spans), strict=True)):
            try:
                return self.items[start : start + sum(self.spans)]
            except ArgumentError:  # instances that make no one strided view: the blocks are copied
                return None
        return None

    def block(self, k: int) -> Any:
        return self.items[self.displs[k] : self.displs[k] + self.spans[k]]

    def scatter_from(self, whole: Any) -> None:
        """Copy a packed array of every block into place (blocks may be in any order)."""
        for k, start in enumerate(_starts(self.counts)):
            self.block(k)[...] = whole[start : start + self.counts[k]]

    def gather_into(self, whole: Any) -> None:
        """Copy every block, in rank order, into a packed array."""
        for k, start in enumerate(_starts(self.counts)):
            whole[start : start + self.counts[k]] = self.block(k)


def _starts(counts: Sequence[int]) -> list[int]:
    return list(accumulate(counts[:-1], initial=0)) if counts else []


def vector(collective: str, argument: str, spec: Any, size: int) -> Vector:
    """A v-variant spec: counts (a sequence, or one count for every rank; default: the buffer
    split as numpy.array_split does) and displacements (a sequence, or a stride; default: the
    blocks packed in rank order)."""
    buf, counts, displs, datatype = _unpack(collective, argument, spec, vector=True)
    if buf is None:
        raise ArgumentError(collective, argument, "a buffer is needed here")
    items = _items(collective, argument, buf, datatype)
    if counts is None:  # as mpi4py: the buffer split as numpy.array_split does
        counts = numpy.diff(split_bounds(items.size, size)).tolist()
    elif isinstance(counts, numbers.Integral):
        counts = [counts] * size
    counts = count_list(collective, argument, counts, size)
    if displs is None:  # the blocks packed in rank order
        displs = _starts(counts)
    elif isinstance(displs, numbers.Integral):  # a stride
        displs = [_count(collective, argument, displs) * k for k in range(size)]
    else:
        displs = count_list(collective, argument, displs, size)
    for k in range(size):
        if displs[k] + counts[k] > items.size:
            raise ArgumentError(collective, argument, f"block {k} (count {counts[k]} at displacement {displs[k]}) "
                                f"runs past the buffer's {items.size} elements")
    if type(items) is _Instances:  # counts in elements, the spans in instances
        return Vector(items, [c * items.unit for c in counts], displs, counts)
    return Vector(items, counts, displs, counts)


def packed_blocks(spec: Any, size: int) -> tuple[Any, tuple[int, ...]] | None:
    """The common v-variant specs, [buffer, counts, datatype] and [buffer, (counts, displs),
    datatype] with displacements that pack the blocks in rank order, `size` non-negative ints
    each, a contiguous NumPy array or a byte buffer and a predefined datatype: (the blocks'
    elements and the counts) at once; None where vector() must parse it."""
    if spec.__class__ is not list or len(spec) != 3:
        return None
    counts, displs = spec[1], None
    if counts.__class__ is tuple and len(counts) == 2:  # the pair (counts, displs)
        counts, displs = counts
    if counts.__class__ not in _COUNT_SEQUENCES or len(counts) != size:
        return None
    counts = tuple(counts)
    if not all(c.__class__ is int for c in counts) or (counts and min(counts) < 0):
        return None
    if displs is not None and (displs.__class__ not in _COUNT_SEQUENCES or len(displs) != size
                               or not all(d.__class__ is int for d in displs)
                               or tuple(displs) != tuple(accumulate(counts[:-1], initial=0))):
        return None
    items, total = _named_items(_BYTE_BUFFERS.get(spec[0].__class__, _same)(spec[0]), spec[2]), sum(counts)
    return None if items is None or total > items.size else (items[:total], counts)


_COUNT_SEQUENCES = (list, tuple, array.array)  # what mpi4py's programs pass as counts (its demos: array("i"))


def bytes_vector(collective: str, argument: str, spec: Any, size: int) -> Vector:
    """An Alltoallw spec as a Vector of the buffer's bytes: [buf, (counts, displs), datatypes],
    [buf, counts, displs, datatypes] or [buf, datatypes] (one element at byte 0 for every rank);
    block k is counts[k] elements of datatypes[k] (predefined) from byte displs[k]."""
    if not isinstance(spec, (list, tuple)) or not 2 <= len(spec) <= 4:
        raise ArgumentError(collective, argument, "expected [buffer, (counts, displacements), datatypes] or "
                            "[buffer, counts, displacements, datatypes]")
    if len(spec) == 2:
        buf, datatypes = spec
        counts, displs = [1] * size, [0] * size
    elif len(spec) == 3:
        buf, pair, datatypes = spec
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ArgumentError(collective, argument, f"expected a pair (counts, displacements), got {pair!r}")
        counts, displs = pair
    else:
        buf, counts, displs, datatypes = spec
    if buf is MPI.BOTTOM:
        raise ArgumentError(collective, argument, "MPI.BOTTOM is not supported (absolute addresses: mpiring "
                            "moves the elements of one buffer)")
    items = _items(collective, argument, buf, MPI.BYTE)
    counts = count_list(collective, argument, counts, size)
    displs = count_list(collective, argument, displs, size)
    if not isinstance(datatypes, (list, tuple)) or len(datatypes) != size:
        raise ArgumentError(collective, argument, f"needs {size} datatypes (one per rank), got {datatypes!r}")
    sizes = []
    for k in range(size):
        dtype = _datatype_dtype(collective, argument, datatypes[k])
        if isinstance(dtype, _Layout) and not dtype.moved_as_bytes:
            raise ArgumentTypeError(collective, argument, f"{dtype.name} is not supported (a derived datatype in "
                                    f"{collective}, which takes predefined datatypes)")
        sizes.append(counts[k] * (dtype.per if isinstance(dtype, _Layout) else dtype.itemsize))
        if displs[k] + sizes[k] > items.size:
            raise ArgumentError(collective, argument, f"block {k} ({sizes[k]} bytes at byte {displs[k]}) runs past "
                                f"the buffer's {items.size} bytes")
    return Vector(items, sizes, displs, sizes)


def count_list(collective: str, argument: str, values: Any, size: int) -> list[int]:
    """`size` counts or displacements (one per rank) as a list of non-negative ints."""
    try:
        values = list(values)
    except TypeError:
        raise ArgumentError(collective, argument, f"counts and displacements must be sequences, got "
                            f"{values!r}") from None
    if len(values) != size:
        raise ArgumentError(collective, argument, f"needs {size} counts and displacements (one per rank), "
                            f"got {len(values)}")
    return [_count(collective, argument, v) for v in values]


def own_block(call: str, argument: str, given: Any, whole: Any, rank: int, n: int, *,
               copy_in: bool) -> tuple[Any, Callable[[], None] | None]:
    """(this rank's block, what copies it in before each run): `given` checked to hold n items of
    whole's dtype, or, when `given` is IN_PLACE or `whole` itself, block `rank` of `whole` as an
    array of its own. A lowercase call whose x and out overlap could not be recorded, so every
    in-place call would take the slow path: a send block (`copy_in`) is copied out before each
    run (done once here); a receive block that already holds its data (Scatter's root) gets a
    throwaway array."""
    if not is_in_place(given):
        items = simple(call, argument, given)
        if items.size == n or not same_memory(items, whole):
            return matching(call, argument, items, n, whole.dtype), None
    block = whole[rank * n : (rank + 1) * n]
    if not copy_in:
        return numpy.empty(block.shape, block.dtype), None
    apart = block.copy()
    return apart, partial(numpy.copyto, apart, block)


def unit_of(collective: str, argument: str, spec: Any) -> int:
    """Elements per instance of a spec's datatype (1 but for derived datatypes and long double)."""
    buf, _, _, datatype = _unpack(collective, argument, spec, vector=False)
    items = _items(collective, argument, buf, datatype)
    return items.unit if type(items) is _Instances else 1


def own_block_v(call: str, argument: str, given: Any, v: Vector, rank: int) -> Any:
    """own_block for a v-variant: block `rank` of v when `given` is IN_PLACE or v's buffer itself."""
    if is_in_place(given):
        return v.block(rank)
    items = simple(call, argument, given)
    if items.size != v.counts[rank] and same_memory(items, v.items):
        return v.block(rank)
    return matching(call, argument, items, v.counts[rank], v.items.dtype)


def same_memory(a: Any, b: Any) -> bool:
    """Whether two views are the very same memory: the same array passed as both buffers. MPI
    forbids it; mpiring reads it as in place. Asked only where the sizes do not fit otherwise,
    so a call with separate buffers never pays for the check."""
    return (type(a) is type(b) is numpy.ndarray and a.size == b.size and a.dtype == b.dtype
            and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def matching(collective: str, argument: str, items: Any, expected: int, dtype: Any) -> Any:
    """`items` (a send buffer, or the receive buffer in place) checked against what the other
    buffer of the call needs: `expected` elements of `dtype`."""
    if items.dtype != dtype:
        raise ArgumentTypeError(collective, argument, f"has datatype {items.dtype} but the other buffer {dtype} "
                                "(MPI needs them to match)")
    if items.size != expected:
        raise ArgumentError(collective, argument, f"has {items.size} elements but the other buffer takes "
                            f"{expected} (MPI needs the counts to match)")
    return items

