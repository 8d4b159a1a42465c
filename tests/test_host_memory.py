"""mpiring.empty / mpiring.host_memory: large host arrays in 2 MiB pages (serial tests)."""

from __future__ import annotations

import gc

import numpy
import pytest

import mpiring
from mpiring import host_memory
from mpiring.backend import NUMPY
from mpiring.errors import ArgumentError

needs_huge_pages = pytest.mark.skipif(
    not host_memory._kernel_offers_huge_pages(), reason="this kernel offers no transparent huge pages")


def mappings() -> list[tuple[int, int, dict[str, int]]]:
    """(start, end, {field: kB}) of every mapping of this process (/proc/self/smaps)."""
    found: list[tuple[int, int, dict[str, int]]] = []
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                start, end = (int(half, 16) for half in head[0].split("-"))
                found.append((start, end, {}))
            elif head[0].endswith(":") and len(head) >= 2 and head[1].isdigit():
                found[-1][2][head[0][:-1]] = int(head[1])
    return found


def huge_kib(array: numpy.ndarray) -> int:
    """kB of huge pages in the mappings that hold the array's bytes."""
    start, end = array.ctypes.data, array.ctypes.data + array.nbytes
    return sum(fields.get("AnonHugePages", 0) for lo, hi, fields in mappings() if lo < end and hi > start)


@pytest.mark.parametrize("shape", [(3, 1 << 17), 1 << 20, (5, 7, 1 << 15)])
def test_a_large_array_is_aligned_writable_and_shaped_as_asked(monkeypatch, shape):
    monkeypatch.delenv("MPIRING_HUGE_PAGES", raising=False)
    array = mpiring.empty(shape, numpy.float32)
    expected = numpy.empty(shape, numpy.float32)
    assert (array.shape, array.dtype, array.strides) == (expected.shape, expected.dtype, expected.strides)
    assert array.flags.writeable and array.flags.c_contiguous
    array[...] = numpy.arange(array.size, dtype=numpy.float32).reshape(array.shape)
    assert array.reshape(-1)[-1] == array.size - 1
    if host_memory.huge_pages():
        assert array.ctypes.data % host_memory.HUGE_PAGE_BYTES == 0


@needs_huge_pages
def test_a_large_array_gets_huge_pages_and_gives_them_back(monkeypatch):
    monkeypatch.delenv("MPIRING_HUGE_PAGES", raising=False)
    array = mpiring.empty(4 << 20, numpy.uint8)
    array.fill(1)  # first touch: the kernel backs the madvised, aligned range with 2 MiB pages
    assert huge_kib(array) >= host_memory.HUGE_PAGE_BYTES >> 10
    start = array.ctypes.data
    del array
    gc.collect()
    assert not any(lo <= start < hi for lo, hi, _ in mappings())  # the mapping went with the array


def test_small_arrays_and_huge_pages_off_are_plain_numpy(monkeypatch):
    monkeypatch.delenv("MPIRING_HUGE_PAGES", raising=False)
    small = mpiring.empty(host_memory.HUGE_FROM_BYTES // 8 - 1, numpy.float64)
    assert small.flags.owndata  # numpy.empty's own array, not a view of a mapping
    assert mpiring.empty(host_memory.HUGE_FROM_BYTES, numpy.uint8).flags.owndata is not host_memory.huge_pages()
    monkeypatch.setenv("MPIRING_HUGE_PAGES", "0")
    assert not host_memory.huge_pages()
    assert "MPIRING_HUGE_PAGES=0" in host_memory.describe() or "no transparent" in host_memory.describe()
    assert mpiring.empty(1 << 20, numpy.float64).flags.owndata
    monkeypatch.setenv("MPIRING_HUGE_PAGES", "sometimes")
    with pytest.raises(ArgumentError, match="MPIRING_HUGE_PAGES"):
        mpiring.empty(1 << 20, numpy.float64)


def test_mpirings_kept_buffers_come_from_host_memory_and_per_call_ones_from_numpy(monkeypatch):
    """The scratch pool's buffers (NumpyBackend.empty_kept) take the same pages as mpiring.empty;
    a call's result or temporary (NumpyBackend.empty) is numpy.empty's at every size."""
    monkeypatch.delenv("MPIRING_HUGE_PAGES", raising=False)
    scratch = NUMPY.empty_kept(host_memory.OWN_HUGE_FROM_BYTES, numpy.uint8)
    assert scratch.flags.owndata is not host_memory.huge_pages()
    assert NUMPY.empty_kept(host_memory.OWN_HUGE_FROM_BYTES - 1, numpy.uint8).flags.owndata
    assert NUMPY.empty(16 * host_memory.OWN_HUGE_FROM_BYTES, numpy.uint8).flags.owndata
