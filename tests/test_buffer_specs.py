"""The C first look at an mpi4py buffer spec (mpiring.engine.native.spec_items, which
buffer_specs.simple asks first) against the generic parse in Python: on every spec it takes (NumPy
arrays and byte buffers, alone or with a datatype and a count) it gives the same elements (the
same memory, length and dtype), and it leaves every other one, those the parse refuses
included, to the parse (serial tests)."""

from __future__ import annotations

import itertools
import mmap
import sys
from array import array as int_array
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

from mpiring import buffer_api, buffer_specs
from mpiring.errors import ArgumentError, CollectiveTimeout, CommunicationError

pytestmark = pytest.mark.skipif(buffer_specs._SPEC_ITEMS is None, reason="the C extension was not built")

DTYPES = ["float32", "float64", "int8", "uint16", "int64", "complex64", "bool", "float16"]
DATATYPES = [MPI.FLOAT, MPI.DOUBLE, MPI.BYTE, MPI.INT64_T, MPI.C_BOOL, MPI.INT, MPI.C_FLOAT_COMPLEX]


def arrays() -> list[np.ndarray]:
    made = []
    for name in DTYPES:
        flat = np.arange(12).astype(name)
        swapped = flat.astype(flat.dtype.newbyteorder())
        made += [flat, flat[:0], flat.reshape(3, 4), flat[::2], flat.reshape(3, 4).T, swapped]
    readonly = np.arange(6.0)
    readonly.flags.writeable = False
    return [*made, readonly, np.arange(12, dtype=np.longdouble)]


def specs() -> list[object]:
    made: list[object] = []
    for array in arrays():
        made.append(array)
        for datatype in DATATYPES:
            made += [[array, datatype], (array, datatype), [array, 0, datatype], [array, array.size, datatype],
                     [array, 5, datatype], [array, array.size + 1, datatype], [array, -1, datatype],
                     [array, True, datatype], [array, np.int64(3), datatype], [array, 2**70, datatype],
                     [array, (2, 1), datatype]]
    for buffer in (bytearray(24), mmap.mmap(-1, 24), bytes(24), memoryview(bytearray(24))):
        made += [buffer, [buffer, MPI.BYTE], [buffer, 8, MPI.BYTE], [buffer, 30, MPI.BYTE], [buffer, MPI.DOUBLE],
                 [buffer, 2, MPI.DOUBLE], [buffer, MPI.INT64_T], [buffer, (4, 2), MPI.BYTE]]
    made += [[bytearray(7), MPI.DOUBLE], [mmap.mmap(-1, 12), MPI.DOUBLE]]
    return [*made, [np.arange(4.0)], [np.arange(4.0), MPI.DOUBLE, MPI.DOUBLE, MPI.DOUBLE], None,
            [np.arange(4.0), "d"]]


def generic(spec: object, blocks: int) -> object:
    """simple() with the C look switched off: the elements, or the error it raises."""
    kept = buffer_specs._SPEC_ITEMS
    buffer_specs._SPEC_ITEMS = None
    try:
        return buffer_specs.simple("Gather", "recvbuf", spec, blocks)
    except (ArgumentError, TypeError, ValueError) as error:
        return error
    finally:
        buffer_specs._SPEC_ITEMS = kept


@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_the_c_look_takes_only_what_the_parse_takes_and_gives_the_same_elements(blocks: int) -> None:
    taken = 0
    for spec in specs():
        fast = buffer_specs._SPEC_ITEMS(spec, blocks)
        if fast is None:
            continue
        taken += 1
        want = generic(spec, blocks)
        assert isinstance(want, np.ndarray), (spec, blocks, want)
        assert fast.dtype == want.dtype and fast.shape == want.shape, (spec, blocks)
        assert fast.__array_interface__["data"][0] == want.__array_interface__["data"][0], (spec, blocks)
        assert fast.ndim == 1 and fast.flags.c_contiguous
    assert taken > 20  # the common forms are taken in C


def test_what_the_c_look_leaves_is_still_parsed_or_refused_by_name() -> None:
    """Every spec, through simple() as the drop-in calls it: the C look first, then the parse."""
    for spec, blocks in itertools.product(specs(), [1, 2]):
        try:
            got = buffer_specs.simple("Gather", "recvbuf", spec, blocks)
        except (ArgumentError, TypeError, ValueError) as error:
            got = error
        want = generic(spec, blocks)
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want), (spec, blocks)
        else:
            assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
            assert got.__array_interface__["data"][0] == want.__array_interface__["data"][0]


def _parser(rank: int, size: int) -> buffer_api.BufferAPI:
    """The drop-in's Python parse alone, as a rank of a communicator of `size` ranks (no engine)."""
    return buffer_api.BufferAPI(SimpleNamespace(rank=rank, size=size), None)


def _parse(parser: buffer_api.BufferAPI, name: str, sendbuf: object, recvbuf: object, op: object,
           root: object) -> object:
    """The Python parse of a blocking uppercase call: the engine's arguments, or the error."""
    arguments = {"Bcast": (sendbuf, root), "Reduce": (sendbuf, recvbuf, op, root), "Allreduce": (sendbuf, recvbuf, op),
                 "Gather": (sendbuf, recvbuf, root), "Allgather": (sendbuf, recvbuf),
                 "Scatter": (sendbuf, recvbuf, root), "Alltoall": (sendbuf, recvbuf),
                 "Scan": (sendbuf, recvbuf, op, "scan"), "Exscan": (sendbuf, recvbuf, op, "exscan"),
                 "Alltoallv": (sendbuf, recvbuf), "Reduce_scatter_block": (sendbuf, recvbuf, op)}[name]
    parse = {"Scan": "_parse_scan", "Exscan": "_parse_scan"}.get(name, f"_parse_{name.lower()}")
    try:
        return getattr(parser, parse)(*arguments)
    except (ArgumentError, TypeError, ValueError) as error:
        return error


def _same_elements(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    return (a.dtype == b.dtype and a.shape == b.shape
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _buffers(name: str, size: int) -> list[object]:
    floats = np.arange(12, dtype=np.float32)
    if name == "Alltoallv":  # v-variant specs, packed or not
        two = [2] * size
        packed = [0, *itertools.accumulate(two)][:-1]
        return [[floats, two, MPI.FLOAT], [floats, (two, packed), MPI.FLOAT],
                [floats, (int_array("i", two), int_array("i", packed)), MPI.FLOAT],
                [floats, (two, packed[::-1]), MPI.FLOAT], [floats, [3] * size, MPI.FLOAT],
                [floats, (two, packed), MPI.INT], [np.arange(12.0), two, MPI.DOUBLE],
                [mmap.mmap(-1, 48), (int_array("i", [8] * size), int_array("i", [8 * i for i in range(size)])),
                 MPI.BYTE], [floats, [-1] * size, MPI.FLOAT], [floats, (two, [0.0] * size), MPI.FLOAT],
                [floats, two], floats, MPI.IN_PLACE, None]
    return [floats, floats[:4], floats[:6], floats[:3], np.arange(12.0), np.arange(4.0), [floats, MPI.FLOAT],
            [floats, 2, MPI.FLOAT], [floats, 4, MPI.FLOAT], [floats, MPI.BYTE], [np.arange(6.0), MPI.DOUBLE],
            bytearray(16), [mmap.mmap(-1, 48), 12, MPI.BYTE], floats.reshape(3, 4), floats[::2], [floats, MPI.INT],
            MPI.IN_PLACE, None]


def _as_run(*call):
    """The engine's blocking run, for COMMON_CALL: its arguments back, having written, where it has
    an out= apart from x, x's first elements there (so that C's copy of an in-place
    Reduce_scatter_block's result leaves the buffers as they were)."""
    collective, x, out = call[:3]
    if collective == "reduce_scatter" and not np.shares_memory(x, out):
        out[...] = x[:out.size]
    return call


@pytest.mark.skipif(buffer_api.COMMON_CALL is None, reason="the C extension was not built")
@pytest.mark.parametrize("name", list(buffer_api.COMMON_FORMS))
def test_the_c_reading_of_common_calls_is_the_parse_s(name: str) -> None:
    """native.dropin_call against the Python parse, on every pair of buffers, op and root, at
    several ranks of 1-4: where C reads a call it gives the parse's very arguments (the same
    memory, counts, op and root; an in-place gather's own block where it lies in the receive
    buffer, which the parse copies apart, an in-place all-to-all's input as a copy, and an
    in-place scatter's root block as an array of its own); everything else, errors included, is
    left to the parse."""
    taken = 0
    code = buffer_api.COMMON_FORMS[name]
    for size, root, op in itertools.product([1, 2, 3, 4], [0, 1, 2, 7, -1, True, "0"], [MPI.SUM, MPI.MAX, MPI.MAXLOC,
                                                                                        "sum", None]):
        for rank in {0, size - 1, min(1, size - 1)}:
            parser = _parser(rank, size)
            for sendbuf, recvbuf in itertools.product(_buffers(name, size), repeat=2):
                fast = buffer_api.COMMON_CALL(code, sendbuf, recvbuf, op, root, (rank, size), _as_run)
                if fast is NotImplemented:
                    continue
                taken += 1
                want = _parse(parser, name, sendbuf, recvbuf, op, root)
                case = (name, rank, size, root, op, sendbuf, recvbuf)
                assert isinstance(want, buffer_api._Prepared), (case, want)
                # in place, a Reduce_scatter_block's result goes to the first block of the receive
                # buffer after the run: the parse's `finish`, C's own copy (of what _as_run left)
                in_place_result = name == "Reduce_scatter_block" and (sendbuf is MPI.IN_PLACE or sendbuf is None)
                assert (want.finish is not None) == in_place_result, case
                collective, x, out, op_name, at, counts, algorithm, timeout = fast
                assert (collective, op_name, at, counts, algorithm, timeout) == (
                    want.call[0], want.call[3], want.call[4], want.call[5], want.call[6], None), case
                kept_apart = want.before is not None  # in place: its own block (or its input), copied
                # an array of its own: an in-place scatter root's block, an in-place Reduce_scatter_block's result
                throwaway = in_place_result or (name == "Scatter" and rank == root
                                                and (recvbuf is MPI.IN_PLACE or recvbuf is None))
                if kept_apart:
                    assert x.dtype == want.call[1].dtype and np.array_equal(x, want.call[1]), case
                    if name in ("Gather", "Allgather"):  # C reads the own block where it lies in out
                        offset = x.__array_interface__["data"][0] - out.__array_interface__["data"][0]
                        assert offset == rank * x.nbytes and x.size * size == out.size, case
                    else:
                        assert not np.shares_memory(x, out), case
                else:
                    assert _same_elements(x, want.call[1]), case
                if throwaway:  # the root's block stays in its send buffer
                    assert out.dtype == want.call[2].dtype and out.shape == want.call[2].shape, case
                    assert not np.shares_memory(out, x), case
                else:
                    assert _same_elements(out, want.call[2]), case
                if want.call[1] is want.call[2]:  # in place where the parse is
                    assert x is out, case
                elif x is out:  # one buffer passed twice (MPI forbids it): the parse's two views of it
                    assert np.shares_memory(want.call[1], want.call[2]), case
    assert taken > 50  # the common forms are read in C


def _address(buffer: object) -> int:
    return np.frombuffer(buffer, np.uint8).__array_interface__["data"][0]


def _arrays_of_a_call(send: object, receive: object, datatype: object = MPI.FLOAT, count: int | None = 3,
                      raising: Exception | None = None) -> tuple:
    """The (x, out) COMMON_CALL hands a blocking Allreduce's run, at 1 rank; or the run raises."""
    seen = []

    def run(*call: object) -> None:
        seen.append(call[1:3])
        if raising is not None:
            raise raising

    def spec(buffer: object) -> list:
        return [buffer, datatype] if count is None else [buffer, count, datatype]

    assert buffer_api.COMMON_CALL(buffer_api.COMMON_FORMS["Allreduce"], spec(send), spec(receive), MPI.SUM, None,
                                  (0, 1), run) is None
    return seen[0]


@pytest.mark.skipif(buffer_api.COMMON_CALL is None, reason="the C extension was not built")
@pytest.mark.parametrize("count", [3, None])
def test_a_blocking_call_borrows_byte_buffers_without_holding_them(count: int | None) -> None:
    """A byte buffer's array in a blocking drop-in call is kept by its address (not made anew by
    numpy.frombuffer each call) and holds no export of the buffer: between calls the caller may
    resize or close it, and the next call reads its memory where it is then."""
    send, receive = mmap.mmap(-1, 12), bytearray(12)
    x, out = _arrays_of_a_call(send, receive, count=count)
    assert (x.dtype, x.size, out.size) == (np.float32, 3, 3)
    assert x.__array_interface__["data"][0] == _address(send) and not x.flags.owndata
    assert out.__array_interface__["data"][0] == _address(receive) and out.flags.writeable
    again = _arrays_of_a_call(send, receive, count=count)
    assert again[0] is x and again[1] is out  # kept, where the buffers still are
    receive.extend(bytes(1 << 20))  # moves it: no export holds it in place
    send.close()
    other = mmap.mmap(-1, 12 if count is None else 4096)
    x, out = _arrays_of_a_call(other, receive, count=3) if count else _arrays_of_a_call(other, receive[:12], count=None)
    assert x.__array_interface__["data"][0] == _address(other)
    if count:
        assert out.__array_interface__["data"][0] == _address(receive) and out.size == 3
    np.frombuffer(other, np.float32)[:3] = [1, 2, 3]
    assert x.tolist() == [1, 2, 3]  # the buffer's memory itself
    other.close()


@pytest.mark.skipif(buffer_api.COMMON_CALL is None, reason="the C extension was not built")
@pytest.mark.parametrize("count", [12, None])
def test_a_blocking_call_borrows_a_numpy_array_seen_as_another_datatype(count: int | None) -> None:
    """[floats, MPI.BYTE]: the array's memory as bytes, kept by address as a byte buffer's (not a
    new view each call), holding no reference to the array; a new array is read where it is."""
    send, receive = np.arange(3, dtype=np.float32), np.zeros(3, np.float32)
    before = sys.getrefcount(send), sys.getrefcount(receive)
    x, out = _arrays_of_a_call(send, receive, MPI.BYTE, count)
    assert (x.dtype, x.size, out.size) == (np.uint8, 12, 12)
    assert x.__array_interface__["data"][0] == send.ctypes.data and x.base is not send
    assert out.__array_interface__["data"][0] == receive.ctypes.data and out.flags.writeable
    assert (sys.getrefcount(send), sys.getrefcount(receive)) == before
    again = _arrays_of_a_call(send, receive, MPI.BYTE, count)
    assert again[0] is x and again[1] is out
    assert x.view(np.float32).tolist() == [0, 1, 2]  # the array's memory itself
    other = np.ones(3, np.float32)
    moved = _arrays_of_a_call(other, receive, MPI.BYTE, count)
    assert moved[0].__array_interface__["data"][0] == other.ctypes.data and moved[1] is out
    readonly = np.arange(3, dtype=np.float32)
    readonly.flags.writeable = False
    assert not _arrays_of_a_call(readonly, receive, MPI.BYTE, count)[0].flags.writeable
    for error, pinned in ((CommunicationError("allreduce", "rank 1 is gone"), 1),
                          (ArgumentError("allreduce", "op", "no such op"), 0)):
        send = np.arange(3, dtype=np.float32)
        held = sys.getrefcount(send)
        with pytest.raises(type(error)) as raised:
            _arrays_of_a_call(send, receive, MPI.BYTE, count, raising=error)
        del raised
        error.__traceback__ = None  # (its frames hold the array too)
        assert sys.getrefcount(send) == held + pinned  # an abandoned call's stays: MPI may still use it


@pytest.mark.skipif(buffer_api.COMMON_CALL is None, reason="the C extension was not built")
def test_an_in_place_block_of_a_borrowed_array_is_kept_with_it() -> None:
    """mpi4py's OSU gather: MPI.IN_PLACE at the root, an mmap receive buffer. The root's own block
    is the same array at every call (so the engine's memo of the last call takes it), where it lies."""
    seen = []
    receive = mmap.mmap(-1, 64)
    for rank in (1, 1, 2, 1):
        buffer_api.COMMON_CALL(buffer_api.COMMON_FORMS["Gather"], MPI.IN_PLACE, [receive, 4, MPI.FLOAT], None, rank,
                               (rank, 4), lambda *call: seen.append(call[1:3]))
    (x, out), (again, same_out), (other, _), (last, _) = seen
    assert again is x and same_out is out and other is not x and last is not other
    assert x.__array_interface__["data"][0] == _address(receive) + 16 and x.size == 4
    assert other.__array_interface__["data"][0] == _address(receive) + 32
    assert np.shares_memory(last, x) and last.size == 4


@pytest.mark.skipif(buffer_api.COMMON_CALL is None, reason="the C extension was not built")
def test_a_borrowed_array_keeps_the_buffer_s_access_and_a_short_buffer_is_left_to_the_parse() -> None:
    readonly = mmap.mmap(-1, 12, prot=mmap.PROT_READ)
    x, out = _arrays_of_a_call(readonly, readonly)  # (the engine refuses an out= it cannot write)
    assert not x.flags.writeable and not out.flags.writeable
    x, out = _arrays_of_a_call(bytearray(12), bytearray(12))
    assert x.flags.writeable and out.flags.writeable
    assert buffer_api.COMMON_CALL(buffer_api.COMMON_FORMS["Allreduce"], [bytearray(8), 3, MPI.FLOAT],
                                  [bytearray(12), 3, MPI.FLOAT], MPI.SUM, None, (0, 1), _as_run) is NotImplemented


@pytest.mark.skipif(buffer_api.COMMON_CALL is None, reason="the C extension was not built")
def test_after_a_timeout_or_a_lost_peer_the_byte_buffers_stay_exported() -> None:
    """A call a timeout or a lost peer ended leaves its buffers to MPI, which may still write into
    them (Ring.abandon): their memory must stay, so they can be neither closed nor resized. An
    error before any message moved leaves them free."""
    for error in (CollectiveTimeout("allreduce", "ring", 0, ["rank 1"], 1.0),
                  CommunicationError("allreduce", "rank 1 is gone")):
        send, receive = mmap.mmap(-1, 12), bytearray(12)
        with pytest.raises(type(error)):
            _arrays_of_a_call(send, receive, raising=error)
        with pytest.raises(BufferError):
            send.close()
        with pytest.raises(BufferError):
            receive.extend(b"more")
    send, receive = mmap.mmap(-1, 12), bytearray(12)
    with pytest.raises(ArgumentError):
        _arrays_of_a_call(send, receive, raising=ArgumentError("allreduce", "op", "no such op"))
    receive.extend(b"more")
    send.close()
