"""mpi4py's uppercase buffer API on mpiring's rings: code written for `MPI.COMM_WORLD.Allreduce(...)`
runs unchanged on `mpiring.Communicator(MPI.COMM_WORLD).Allreduce(...)`.

Every method parses mpi4py's buffer specifications (an array; [array, datatype];
[array, count, datatype]; [array, (count, displ), datatype]; [array, (counts, displs), datatype]
for the v-variants; MPI.IN_PLACE or None for an in-place send buffer), then runs one of the
communicator's lowercase collectives on views of the caller's memory, so the result lands in the
caller's receive buffer. No native MPI collective runs here.

Semantics are MPI's where the lowercase API differs: counts are the exact ones of the specs (a
count in a spec holding one block per rank is per block, as MPI's recvcount), a root-only buffer
is ignored off the root, displacements are honoured. A spec every rank can
check alone (an unsupported datatype or op, a count that does not fit its buffer) raises
ArgumentError before any message moves.

    mpi4py                          mpiring lowercase call it runs
    Bcast(buf)                      broadcast(buf, out=buf)
    Reduce / Allreduce              reduce / allreduce, out= the receive buffer
    Gather / Allgather              gather / allgather with counts= (every rank's count known)
    Gatherv                         gather, row counts exchanged (only the root knows them)
    Allgatherv                      allgather with counts=
    Scatter                         scatter with counts=
    Scatterv                        broadcast of the root's counts, then scatter with counts=
    Reduce_scatter_block            reduce_scatter with counts=
    Reduce_scatter                  reduce_scatter with counts= (all-gathered when not given)
    Alltoall / Alltoallv            alltoall / alltoallv with recv_counts= (each rank knows its own)
    Scan / Exscan                   scan / exscan
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy
from mpi4py import MPI
from mpi4py.util import dtlib

from mpiring.backend import NUMPY, SUPPORTED_DTYPES, backend_for
from mpiring.engine.partition import split_bounds
from mpiring.errors import ArgumentError, ArgumentTypeError, Unconverted

# mpi4py's predefined ops and the lowercase op each one runs as
_OPS = (
    (MPI.SUM, "sum"), (MPI.PROD, "prod"), (MPI.MIN, "min"), (MPI.MAX, "max"),
    (MPI.LAND, "land"), (MPI.LOR, "lor"), (MPI.LXOR, "lxor"),
    (MPI.BAND, "band"), (MPI.BOR, "bor"), (MPI.BXOR, "bxor"),
)
_OP_NAMES = ", ".join(f"MPI.{name.upper()}" for _, name in _OPS)
_NDARRAY = numpy.ndarray


def op_name(collective: str, op: Any) -> str:
    """The lowercase op name for an mpi4py MPI.Op (MAXLOC, MINLOC, REPLACE, user ops: refused)."""
    for known, name in _OPS:  # the predefined objects themselves: the common case, without a comparison in MPI
        if op is known:
            return name
    if isinstance(op, MPI.Op):
        for known, name in _OPS:
            if op == known:
                return name
        label = next((f"MPI.{n}" for n in ("MAXLOC", "MINLOC", "REPLACE", "NO_OP")
                      if getattr(MPI, n, None) is not None and op == getattr(MPI, n)), "a user-defined MPI.Op")
        raise ArgumentError(collective, "op", f"{label} is not supported; supported: {_OP_NAMES}")
    raise ArgumentTypeError(collective, "op", f"must be an MPI.Op ({_OP_NAMES}), got {op!r}")


def _is_in_place(spec: Any) -> bool:
    return spec is None or spec is MPI.IN_PLACE


def _datatype_dtype(collective: str, argument: str, datatype: Any) -> numpy.dtype:
    """The NumPy dtype of a predefined MPI datatype (or mpi4py typecode string)."""
    if isinstance(datatype, str):
        try:
            datatype = dtlib.from_numpy_dtype(datatype)
        except (TypeError, ValueError, KeyError) as error:
            raise ArgumentTypeError(collective, argument, f"unknown typecode {datatype!r} ({error})") from None
    if not isinstance(datatype, MPI.Datatype):
        raise ArgumentTypeError(collective, argument, f"expected an MPI.Datatype, got {datatype!r}")
    # A derived datatype is accepted only where it is one predefined element (a Dup of one, as
    # mpi4py.util.dtlib makes): anything else maps to a structured or subarray dtype, refused below.
    name = datatype.Get_name() or ("a derived datatype" if datatype.combiner != MPI.COMBINER_NAMED else "")
    try:
        dtype = dtlib.to_numpy_dtype(datatype)
    except (TypeError, ValueError, KeyError) as error:
        raise ArgumentTypeError(collective, argument, f"{name or datatype!r} is not supported (it has no "
                                f"NumPy dtype: {error})") from None
    if dtype not in SUPPORTED_DTYPES:
        kind = "derived datatypes are not" if datatype.combiner != MPI.COMBINER_NAMED else f"its dtype {dtype} is not"
        raise ArgumentTypeError(collective, argument, f"{name} is not supported ({kind}; mpiring takes one "
                                "predefined element type: bool, (unsigned) integers, float16/32/64, complex64/128)")
    return dtype


def _items(collective: str, argument: str, buf: Any, datatype: Any) -> Any:
    """The buffer's memory as a flat array of the datatype's elements (a view, never a copy)."""
    if isinstance(buf, (MPI.Datatype, list, tuple)):
        raise ArgumentTypeError(collective, argument, f"expected a buffer first in the spec, got {type(buf).__name__}")
    if _foreign(buf):  # another library's array (PyTorch, JAX, ...), as mpi4py takes it: a view of its memory
        from mpiring import interop

        buf = interop.native(collective, argument, buf)
        if isinstance(buf, Unconverted):
            raise buf.error
    if backend_for(buf) is not NUMPY:
        raise ArgumentTypeError(collective, argument, "device arrays are not supported by the uppercase API: "
                                "use the lowercase collectives (comm.allreduce(x, out=y), ...)")
    if not isinstance(buf, numpy.ndarray):
        try:
            buf = numpy.asarray(memoryview(buf))
        except TypeError:
            raise ArgumentTypeError(collective, argument, f"{type(buf).__name__} is not a buffer "
                                    "(expected an array, a buffer object or a list [buffer, ...])") from None
    if not (buf.flags.c_contiguous or buf.flags.f_contiguous):
        raise ArgumentError(collective, argument, "the buffer is not contiguous (MPI reads and writes it as one "
                            "block of memory): pass a contiguous array")
    flat = buf.reshape(-1, order="A")  # memory order: a view for C- and Fortran-contiguous arrays
    dtype = flat.dtype if datatype is None else _datatype_dtype(collective, argument, datatype)
    if datatype is None and dtype not in SUPPORTED_DTYPES:
        raise ArgumentTypeError(collective, argument, f"buffers of dtype {dtype} are not supported")
    if flat.dtype != dtype:  # the memory seen as the datatype's elements, as MPI sees it
        if flat.nbytes % dtype.itemsize:
            raise ArgumentError(collective, argument, f"the buffer's {flat.nbytes} bytes are not a whole number "
                                f"of {dtype} elements")
        flat = flat.view(numpy.uint8).view(dtype)
    return flat


def _foreign(buf: Any) -> bool:
    """Whether `buf` may be another library's array (mpiring.interop decides; loaded only then)."""
    if buf is None or isinstance(buf, (numpy.ndarray, bytes, bytearray, memoryview)):
        return False
    from mpiring import interop

    return interop.is_foreign(buf)


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


def simple(collective: str, argument: str, spec: Any, blocks: int = 1) -> Any:
    """The elements a plain spec names: a view of the caller's memory.

    With blocks > 1 (the receive buffer of Gather and Allgather, the send buffer of Scatter and
    Reduce_scatter_block) the spec holds one block per rank: a count given is the count of one
    block, as MPI's recvcount is, and without one the buffer must split into equal blocks.
    """
    if spec.__class__ is _NDARRAY and blocks == 1 and spec.flags.c_contiguous and spec.dtype in SUPPORTED_DTYPES:
        return spec if spec.ndim == 1 else spec.reshape(-1)  # the common case: the caller's own array, flat
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
    """A v-variant's buffer: block k is items[displs[k] : displs[k] + counts[k]]."""

    items: Any
    counts: list[int]
    displs: list[int]

    @property
    def packed(self) -> Any:
        """The view holding every block in rank order without gaps, or None when they are not."""
        start = self.displs[0] if self.displs else 0
        if all(d == start + s for d, s in zip(self.displs, _starts(self.counts), strict=True)):
            return self.items[start : start + sum(self.counts)]
        return None

    def block(self, k: int) -> Any:
        return self.items[self.displs[k] : self.displs[k] + self.counts[k]]

    def scatter_from(self, whole: Any) -> None:
        """Copy a packed array of every block into place (blocks may be in any order)."""
        for k, start in enumerate(_starts(self.counts)):
            self.block(k)[...] = whole[start : start + self.counts[k]]

    def gather_into(self, whole: Any) -> None:
        """Copy every block, in rank order, into a packed array."""
        for k, start in enumerate(_starts(self.counts)):
            whole[start : start + self.counts[k]] = self.block(k)


def _starts(counts: Sequence[int]) -> list[int]:
    return [sum(counts[:k]) for k in range(len(counts))]


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
    counts = _sequence(collective, argument, counts, size)
    if displs is None:  # the blocks packed in rank order
        displs = _starts(counts)
    elif isinstance(displs, numbers.Integral):  # a stride
        displs = [_count(collective, argument, displs) * k for k in range(size)]
    else:
        displs = _sequence(collective, argument, displs, size)
    for k in range(size):
        if displs[k] + counts[k] > items.size:
            raise ArgumentError(collective, argument, f"block {k} (count {counts[k]} at displacement {displs[k]}) "
                                f"runs past the buffer's {items.size} elements")
    return Vector(items, counts, displs)


def _sequence(collective: str, argument: str, values: Any, size: int) -> list[int]:
    try:
        values = list(values)
    except TypeError:
        raise ArgumentError(collective, argument, f"counts and displacements must be sequences, got "
                            f"{values!r}") from None
    if len(values) != size:
        raise ArgumentError(collective, argument, f"needs {size} counts and displacements (one per rank), "
                            f"got {len(values)}")
    return [_count(collective, argument, v) for v in values]


def _check_info(collective: str, info: Any) -> None:
    if not isinstance(info, MPI.Info):
        raise ArgumentTypeError(collective, "info", f"must be an MPI.Info, got {info!r}")


def _own_block(call: str, argument: str, given: Any, whole: Any, rank: int, n: int) -> Any:
    """This rank's block of `whole` (n items) when `given` is IN_PLACE, else `given` checked to
    hold n items of whole's dtype."""
    if _is_in_place(given):
        return whole[rank * n : (rank + 1) * n]
    return _matching(call, argument, simple(call, argument, given), n, whole.dtype)


def _matching(collective: str, argument: str, items: Any, expected: int, dtype: Any) -> Any:
    """`items` (a send buffer, or the receive buffer in place) checked against what the other
    buffer of the call needs: `expected` elements of `dtype`."""
    if items.dtype != dtype:
        raise ArgumentTypeError(collective, argument, f"has datatype {items.dtype} but the other buffer {dtype} "
                                "(MPI needs them to match)")
    if items.size != expected:
        raise ArgumentError(collective, argument, f"has {items.size} elements but the other buffer takes "
                            f"{expected} (MPI needs the counts to match)")
    return items


class Request:
    """An mpi4py-style request for a nonblocking (I-form) or persistent (`*_init`) collective.

    Wait() and Test() advance the collective; once it is done the result is in the caller's
    receive buffer. Persistent requests also have Start() and Free().
    """

    def __init__(self, inner: Any, finish: Callable[[], None] | None,
                 before: Callable[[], None] | None = None) -> None:
        self._inner = inner
        self._finish = finish
        self._before = before  # a persistent request's copy of the send buffer ahead of each start
        self._pending = finish is not None  # the copy into the caller's buffer is still to do

    def _finished(self) -> None:
        if self._pending:
            self._pending = False
            self._finish()

    def Wait(self, status: Any = None) -> bool:
        """Block until the collective is done."""
        self._inner.wait()
        self._finished()
        return True

    def Test(self, status: Any = None) -> bool:
        """True once the collective is done (advancing it, never blocking)."""
        done = self._inner.test()
        if done:
            self._finished()
        return done

    def Start(self) -> None:
        """Begin a run of a persistent collective (the previous one must have completed)."""
        if not hasattr(self._inner, "start"):
            raise ArgumentError("Start", "request", "only persistent requests (from the *_init forms) start")
        if self._before is not None:
            self._before()
        self._inner.start()
        self._pending = self._finish is not None

    def Free(self) -> None:
        """Release a persistent request (not while a run is in flight)."""
        if hasattr(self._inner, "free"):
            self._inner.free()

    @staticmethod
    def Waitall(requests: Sequence[Request], statuses: Any = None) -> bool:
        for request in requests:
            request.Wait()
        return True

    @staticmethod
    def Testall(requests: Sequence[Request], statuses: Any = None) -> bool:
        return all([request.Test() for request in requests])  # a list: every request advances

    @staticmethod
    def Startall(requests: Sequence[Request]) -> None:
        for request in requests:
            request.Start()


@dataclass
class _Prepared:
    """A parsed uppercase call: the lowercase collective and its arguments, and what to copy
    into the caller's buffers once it is done."""

    collective: str
    args: tuple
    kwargs: dict
    finish: Callable[[], None] | None = None  # after each run: copy the result into place
    before: Callable[[], None] | None = None  # before each run (done once already): copy the input


class BufferAPI:
    """mpi4py's uppercase methods, for `Communicator` (which provides the lowercase collectives,
    `rank`, `size`, `mpi`, `timeout`, `free`)."""

    # ---- communicator ----

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def Dup(self, info: Any = None) -> Any:
        """A new communicator over the same ranks, with this one's timeout and check (collective)."""
        timeout = math.inf if self.timeout is None else self.timeout
        return type(self)(self.mpi, timeout=timeout, check=self._check is not None)

    def Free(self) -> None:
        self.free()

    # ---- the calls: each parses its specs, then runs as blocking, I-form or persistent ----

    def _run(self, prepared: _Prepared) -> None:
        getattr(self, prepared.collective)(*prepared.args, **prepared.kwargs)
        if prepared.finish is not None:
            prepared.finish()

    def _irun(self, prepared: _Prepared) -> Request:
        return Request(getattr(self, "i" + prepared.collective)(*prepared.args, **prepared.kwargs), prepared.finish)

    def _init(self, prepared: _Prepared, info: Any) -> Request:
        _check_info(prepared.collective, info)
        return Request(getattr(self, prepared.collective + "_init")(*prepared.args, **prepared.kwargs),
                       prepared.finish, prepared.before)

    def _parse_bcast(self, buf: Any, root: int) -> _Prepared:
        items = simple("Bcast", "buf", buf)
        return _Prepared("broadcast", (items, root), {"out": items})

    def _parse_reduce(self, sendbuf: Any, recvbuf: Any, op: Any, root: int) -> _Prepared:
        name = op_name("Reduce", op)
        if self.rank == root:
            out = simple("Reduce", "recvbuf", recvbuf)
            x = out if _is_in_place(sendbuf) else _matching("Reduce", "sendbuf", simple("Reduce", "sendbuf", sendbuf),
                                                            out.size, out.dtype)
        else:  # the receive buffer is ignored off the root
            x, out = self._send_only("Reduce", sendbuf), None
        return _Prepared("reduce", (x, name, root), {"out": out})

    def _parse_allreduce(self, sendbuf: Any, recvbuf: Any, op: Any) -> _Prepared:
        name = op_name("Allreduce", op)
        out = simple("Allreduce", "recvbuf", recvbuf)
        x = out if _is_in_place(sendbuf) else _matching("Allreduce", "sendbuf",
                                                        simple("Allreduce", "sendbuf", sendbuf), out.size, out.dtype)
        return _Prepared("allreduce", (x, name), {"out": out})

    def _parse_gather(self, sendbuf: Any, recvbuf: Any, root: int) -> _Prepared:
        p, r = self.size, self.rank
        if r == root:
            out = simple("Gather", "recvbuf", recvbuf, blocks=p)
            n = out.size // p
            x = _own_block("Gather", "sendbuf", sendbuf, out, r, n)
        else:
            x, out = self._send_only("Gather", sendbuf), None
        return _Prepared("gather", (x, root), {"out": out, "counts": [x.size] * p})

    def _parse_allgather(self, sendbuf: Any, recvbuf: Any) -> _Prepared:
        p, r = self.size, self.rank
        out = simple("Allgather", "recvbuf", recvbuf, blocks=p)
        n = out.size // p
        x = _own_block("Allgather", "sendbuf", sendbuf, out, r, n)
        return _Prepared("allgather", (x,), {"out": out, "counts": [n] * p})

    def _parse_gatherv(self, sendbuf: Any, recvbuf: Any, root: int) -> _Prepared:
        if self.rank != root:  # the row counts are exchanged: only the root knows them
            return _Prepared("gather", (self._send_only("Gatherv", sendbuf), root), {})
        v = vector("Gatherv", "recvbuf", recvbuf, self.size)
        x = v.block(root) if _is_in_place(sendbuf) else _matching(
            "Gatherv", "sendbuf", simple("Gatherv", "sendbuf", sendbuf), v.counts[root], v.items.dtype)
        out, finish = self._packed_target(v, x.dtype)
        return _Prepared("gather", (x, root), {"out": out}, finish)

    def _parse_allgatherv(self, sendbuf: Any, recvbuf: Any) -> _Prepared:
        v = vector("Allgatherv", "recvbuf", recvbuf, self.size)
        x = v.block(self.rank) if _is_in_place(sendbuf) else _matching(
            "Allgatherv", "sendbuf", simple("Allgatherv", "sendbuf", sendbuf), v.counts[self.rank], v.items.dtype)
        out, finish = self._packed_target(v, x.dtype)
        return _Prepared("allgather", (x,), {"out": out, "counts": v.counts}, finish)

    def _parse_scatter(self, sendbuf: Any, recvbuf: Any, root: int) -> _Prepared:
        p, r = self.size, self.rank
        if r == root:
            x = simple("Scatter", "sendbuf", sendbuf, blocks=p)
            n = x.size // p
            out = _own_block("Scatter", "recvbuf", recvbuf, x, r, n)
        else:  # the send buffer is ignored off the root
            x, out = None, self._receive_only("Scatter", recvbuf)
        return _Prepared("scatter", (x, root), {"out": out, "counts": [out.size] * p})

    def _parse_scatterv(self, sendbuf: Any, recvbuf: Any, root: int) -> _Prepared:
        """Only the root knows the counts: it broadcasts them first (a small blocking step)."""
        p, r = self.size, self.rank
        counts = numpy.zeros(p, numpy.int64)
        x = before = None
        if r == root:
            v = vector("Scatterv", "sendbuf", sendbuf, p)
            counts[:] = v.counts
            x = v.packed
            if x is None:  # blocks with gaps or out of order: packed in rank order first
                x = numpy.empty(sum(v.counts), v.items.dtype)
                before = partial(v.gather_into, x)
                before()
            out = v.block(root) if _is_in_place(recvbuf) else _matching(
                "Scatterv", "recvbuf", simple("Scatterv", "recvbuf", recvbuf), v.counts[root], v.items.dtype)
        else:
            out = self._receive_only("Scatterv", recvbuf)
        self.broadcast(counts, root, out=counts)
        if out.size != counts[r]:
            raise ArgumentError("Scatterv", "recvbuf", f"takes {out.size} elements but the root sends rank {r} "
                                f"{counts[r]}")
        return _Prepared("scatter", (x, root), {"out": out, "counts": counts.tolist()}, None, before)

    def _parse_reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any) -> _Prepared:
        p = self.size
        name = op_name("Reduce_scatter_block", op)
        if _is_in_place(sendbuf):  # the receive buffer holds every block; the result lands in the first
            x = simple("Reduce_scatter_block", "recvbuf", recvbuf, blocks=p)
            n = x.size // p
            out = x[:n]
        else:
            out = simple("Reduce_scatter_block", "recvbuf", recvbuf)
            n = out.size
            x = _matching("Reduce_scatter_block", "sendbuf",
                          simple("Reduce_scatter_block", "sendbuf", sendbuf, blocks=p), n * p, out.dtype)
        return _Prepared("reduce_scatter", (x, name), {"out": out, "counts": [n] * p})

    def _parse_reduce_scatter_v(self, sendbuf: Any, recvbuf: Any, recvcounts: Any, op: Any) -> _Prepared:
        """Without recvcounts every rank's receive count is all-gathered first (as mpi4py does)."""
        p, r = self.size, self.rank
        name = op_name("Reduce_scatter", op)
        whole = simple("Reduce_scatter", "recvbuf", recvbuf)
        in_place = _is_in_place(sendbuf)
        x = None if in_place else simple("Reduce_scatter", "sendbuf", sendbuf)
        if recvcounts is not None:
            counts = _sequence("Reduce_scatter", "recvcounts", recvcounts, p)
        elif in_place:
            raise ArgumentError("Reduce_scatter", "recvcounts", "must be given with an in-place send buffer")
        else:
            counts = self.allgather(numpy.array([whole.size], numpy.int64), counts=[1] * p).tolist()
        if in_place:  # the receive buffer holds the whole input; the result lands at its start
            x = _matching("Reduce_scatter", "recvbuf", whole, sum(counts), whole.dtype)
            out = whole[: counts[r]]
        else:
            out = _matching("Reduce_scatter", "recvbuf", whole, counts[r], whole.dtype)
            x = _matching("Reduce_scatter", "sendbuf", x, sum(counts), whole.dtype)
        return _Prepared("reduce_scatter", (x, name), {"out": out, "counts": counts})

    def _parse_alltoall(self, sendbuf: Any, recvbuf: Any) -> _Prepared:
        p = self.size
        out = simple("Alltoall", "recvbuf", recvbuf, blocks=p)
        x = out if _is_in_place(sendbuf) else _matching(
            "Alltoall", "sendbuf", simple("Alltoall", "sendbuf", sendbuf, blocks=p), out.size, out.dtype)
        return _Prepared("alltoall", (x,), {"out": out})

    def _parse_alltoallv(self, sendbuf: Any, recvbuf: Any) -> _Prepared:
        p = self.size
        receive = vector("Alltoallv", "recvbuf", recvbuf, p)
        send = receive if _is_in_place(sendbuf) else vector("Alltoallv", "sendbuf", sendbuf, p)
        if send.items.dtype != receive.items.dtype:
            raise ArgumentTypeError("Alltoallv", "sendbuf", f"has datatype {send.items.dtype} but the receive "
                                    f"buffer {receive.items.dtype} (MPI needs them to match)")
        x, before = send.packed, None
        if x is None or send is receive:  # in place, the input is copied out before the result lands
            x = numpy.empty(sum(send.counts), send.items.dtype)
            before = partial(send.gather_into, x)
            before()
        out, finish = self._packed_target(receive, receive.items.dtype)
        return _Prepared("alltoallv", (x, send.counts, receive.counts), {"out": out}, finish, before)

    def _parse_scan(self, sendbuf: Any, recvbuf: Any, op: Any, collective: str) -> _Prepared:
        """Scan and Exscan (whose rank 0 receives nothing: its receive buffer is left as it was)."""
        upper = "Scan" if collective == "scan" else "Exscan"
        name = op_name(upper, op)
        out = simple(upper, "recvbuf", recvbuf)
        x = out if _is_in_place(sendbuf) else _matching(upper, "sendbuf", simple(upper, "sendbuf", sendbuf),
                                                        out.size, out.dtype)
        return _Prepared(collective, (x, name), {"out": out})

    @staticmethod
    def _send_only(collective: str, sendbuf: Any) -> Any:
        if _is_in_place(sendbuf):
            raise ArgumentError(collective, "sendbuf", "MPI.IN_PLACE (or None) is for the root only")
        return simple(collective, "sendbuf", sendbuf)

    @staticmethod
    def _receive_only(collective: str, recvbuf: Any) -> Any:
        if _is_in_place(recvbuf):
            raise ArgumentError(collective, "recvbuf", "MPI.IN_PLACE (or None) is for the root only")
        return simple(collective, "recvbuf", recvbuf)

    @staticmethod
    def _packed_target(v: Vector, dtype: Any) -> tuple[Any, Callable[[], None] | None]:
        """Where a gather of v's blocks writes: v's own memory when its blocks lie packed in
        rank order, else a packed array copied into place afterwards."""
        packed = v.packed
        if packed is not None:
            return packed, None
        whole = numpy.empty(sum(v.counts), dtype)
        return whole, lambda: v.scatter_from(whole)

    # ---- blocking ----

    def Bcast(self, buf: Any, root: int = 0) -> None:
        """Broadcast root's `buf` to every rank's `buf`."""
        self._run(self._parse_bcast(buf, root))

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0) -> None:
        """Reduce every rank's `sendbuf` into root's `recvbuf` (ignored elsewhere)."""
        self._run(self._parse_reduce(sendbuf, recvbuf, op, root))

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        """Reduce every rank's `sendbuf` into every rank's `recvbuf`."""
        self._run(self._parse_allreduce(sendbuf, recvbuf, op))

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Gather equal blocks into root's `recvbuf`, in rank order."""
        self._run(self._parse_gather(sendbuf, recvbuf, root))

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Gather blocks of any size into root's `recvbuf` at its counts and displacements."""
        self._run(self._parse_gatherv(sendbuf, recvbuf, root))

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        """Gather equal blocks into every rank's `recvbuf`, in rank order."""
        self._run(self._parse_allgather(sendbuf, recvbuf))

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        """Gather blocks of any size into every rank's `recvbuf` at its counts and displacements."""
        self._run(self._parse_allgatherv(sendbuf, recvbuf))

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Scatter equal blocks of root's `sendbuf` (ignored elsewhere), block k to rank k."""
        self._run(self._parse_scatter(sendbuf, recvbuf, root))

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Scatter blocks of root's `sendbuf` at its counts and displacements, block k to rank k."""
        self._run(self._parse_scatterv(sendbuf, recvbuf, root))

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        """Reduce, then block k (of recvbuf's count) of the result to rank k."""
        self._run(self._parse_reduce_scatter_block(sendbuf, recvbuf, op))

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM) -> None:
        """Reduce, then recvcounts[k] elements of the result to rank k."""
        self._run(self._parse_reduce_scatter_v(sendbuf, recvbuf, recvcounts, op))

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        """Block j of every rank's `sendbuf` to rank j, into block i of its `recvbuf` (from rank i)."""
        self._run(self._parse_alltoall(sendbuf, recvbuf))

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        """Alltoall with counts and displacements on both sides."""
        self._run(self._parse_alltoallv(sendbuf, recvbuf))

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        """Rank r's `recvbuf` gets the reduction of ranks 0..r's `sendbuf`."""
        self._run(self._parse_scan(sendbuf, recvbuf, op, "scan"))

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        """Rank r's `recvbuf` gets the reduction of ranks 0..r-1's `sendbuf` (rank 0's is left alone)."""
        self._run(self._parse_scan(sendbuf, recvbuf, op, "exscan"))

    def Barrier(self) -> None:
        self.barrier()

    # ---- nonblocking: the result is in the receive buffer once Wait() returns or Test() is True ----

    def Ibcast(self, buf: Any, root: int = 0) -> Request:
        return self._irun(self._parse_bcast(buf, root))

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0) -> Request:
        return self._irun(self._parse_reduce(sendbuf, recvbuf, op, root))

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> Request:
        return self._irun(self._parse_allreduce(sendbuf, recvbuf, op))

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        return self._irun(self._parse_gather(sendbuf, recvbuf, root))

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        return self._irun(self._parse_gatherv(sendbuf, recvbuf, root))

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Request:
        return self._irun(self._parse_allgather(sendbuf, recvbuf))

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any) -> Request:
        return self._irun(self._parse_allgatherv(sendbuf, recvbuf))

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        return self._irun(self._parse_scatter(sendbuf, recvbuf, root))

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        """Nonblocking Scatterv, after a blocking broadcast of the root's counts."""
        return self._irun(self._parse_scatterv(sendbuf, recvbuf, root))

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> Request:
        return self._irun(self._parse_reduce_scatter_block(sendbuf, recvbuf, op))

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM) -> Request:
        """Nonblocking Reduce_scatter (without recvcounts, after a blocking all-gather of them)."""
        return self._irun(self._parse_reduce_scatter_v(sendbuf, recvbuf, recvcounts, op))

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> Request:
        return self._irun(self._parse_alltoall(sendbuf, recvbuf))

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any) -> Request:
        return self._irun(self._parse_alltoallv(sendbuf, recvbuf))

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> Request:
        return self._irun(self._parse_scan(sendbuf, recvbuf, op, "scan"))

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> Request:
        return self._irun(self._parse_scan(sendbuf, recvbuf, op, "exscan"))

    def Ibarrier(self) -> Request:
        return Request(self.ibarrier(), None)

    # ---- persistent (MPI-4): Start() and Wait() per use; the buffers are bound at init ----

    def Bcast_init(self, buf: Any, root: int = 0, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_bcast(buf, root), info)

    def Reduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0,
                    info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_reduce(sendbuf, recvbuf, op, root), info)

    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_allreduce(sendbuf, recvbuf, op), info)

    def Gather_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_gather(sendbuf, recvbuf, root), info)

    def Gatherv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_gatherv(sendbuf, recvbuf, root), info)

    def Allgather_init(self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_allgather(sendbuf, recvbuf), info)

    def Allgatherv_init(self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_allgatherv(sendbuf, recvbuf), info)

    def Scatter_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_scatter(sendbuf, recvbuf, root), info)

    def Scatterv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_scatterv(sendbuf, recvbuf, root), info)

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                                  info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_reduce_scatter_block(sendbuf, recvbuf, op), info)

    def Reduce_scatter_init(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM,
                            info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_reduce_scatter_v(sendbuf, recvbuf, recvcounts, op), info)

    def Alltoall_init(self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_alltoall(sendbuf, recvbuf), info)

    def Alltoallv_init(self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_alltoallv(sendbuf, recvbuf), info)

    def Scan_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_scan(sendbuf, recvbuf, op, "scan"), info)

    def Exscan_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: Any = MPI.INFO_NULL) -> Request:
        return self._init(self._parse_scan(sendbuf, recvbuf, op, "exscan"), info)

    def Barrier_init(self, info: Any = MPI.INFO_NULL) -> Request:
        _check_info("Barrier_init", info)
        return Request(self.barrier_init(), None)
