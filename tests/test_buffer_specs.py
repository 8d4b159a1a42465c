"""The C first look at an mpi4py buffer spec (mpiring.engine.native.spec_items, which
buffer_api.simple asks first) against the generic parse in Python: on every spec it takes (NumPy
arrays and byte buffers, alone or with a datatype and a count) it gives the same elements (the
same memory, length and dtype), and it leaves every other one, those the parse refuses
included, to the parse (serial tests)."""

from __future__ import annotations

import itertools
import mmap

import numpy as np
import pytest
from mpi4py import MPI

from mpiring import buffer_api
from mpiring.errors import ArgumentError

pytestmark = pytest.mark.skipif(buffer_api._SPEC_ITEMS is None, reason="the C extension was not built")

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
    kept = buffer_api._SPEC_ITEMS
    buffer_api._SPEC_ITEMS = None
    try:
        return buffer_api.simple("Gather", "recvbuf", spec, blocks)
    except (ArgumentError, TypeError, ValueError) as error:
        return error
    finally:
        buffer_api._SPEC_ITEMS = kept


@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_the_c_look_takes_only_what_the_parse_takes_and_gives_the_same_elements(blocks: int) -> None:
    taken = 0
    for spec in specs():
        fast = buffer_api._SPEC_ITEMS(spec, blocks)
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
            got = buffer_api.simple("Gather", "recvbuf", spec, blocks)
        except (ArgumentError, TypeError, ValueError) as error:
            got = error
        want = generic(spec, blocks)
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want), (spec, blocks)
        else:
            assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
            assert got.__array_interface__["data"][0] == want.__array_interface__["data"][0]
