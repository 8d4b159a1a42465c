"""Host arrays in 2 MiB pages: the memory MPI moves fastest on Linux.

On one node an MPI library moves a large message with one copy out of the sender's pages
(CMA or a shared-memory pipeline), and it pays per page of the source: from the sender's 4 KiB
pages a message takes longer than from 2 MiB pages from 64 KiB up, with either MPI wheel
(docs/benchmarks.md, "Buffers and pages", has the figures). NumPy asks the
kernel for huge pages only for arrays of 4 MiB and up, and only memory that was never touched
can get them: whether a malloc'd array gets them depends on what the process freed before. So
the same call on two equal arrays can differ that much.

`empty` gives a large array its own anonymous mapping, 2 MiB-aligned and marked MADV_HUGEPAGE
before the first touch, so that every whole 2 MiB of it can be a huge page wherever the
kernel's transparent huge pages are "always" or "madvise". The last page is whole: an array
holds up to 2 MiB more memory than it asks for. Smaller arrays, kernels without transparent
huge pages, and MPIRING_HUGE_PAGES=0 get numpy.empty.

Users allocate with it as `mpiring.empty`, mpiring its pooled scratch (NumpyBackend.empty_kept,
from OWN_HUGE_FROM_BYTES), and the benchmark the buffers of mpiring and of the MPI library alike.
A call's result is numpy.empty's: a new mapping per call would pay its page faults every time.
"""

from __future__ import annotations

import math
import mmap
from functools import cache
from pathlib import Path
from typing import Any

import numpy

from mpiring import environment

HUGE_PAGE_BYTES = 2 << 20
# From these sizes up an array gets huge pages: a user's buffers (mpiring.empty) from 64 KiB,
# where they already halve a message's time; mpiring's pooled scratch from 1 MiB, where a whole
# 2 MiB page at most doubles it.
HUGE_FROM_BYTES = 64 << 10
OWN_HUGE_FROM_BYTES = 1 << 20
_THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@cache
def _kernel_offers_huge_pages() -> bool:
    """Whether transparent huge pages are "always" or "madvise" (the selected word is bracketed)."""
    try:
        setting = _THP_SETTING.read_text()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


def huge_pages() -> bool:
    """Whether `empty` puts large arrays in huge pages: the kernel offers them, mmap can ask for
    them, and MPIRING_HUGE_PAGES is not 0."""
    wanted = environment.flag("MPIRING_HUGE_PAGES", "mpiring.empty") is not False
    return wanted and hasattr(mmap, "MADV_HUGEPAGE") and _kernel_offers_huge_pages()


def describe() -> str:
    """Which pages `empty` gives, in words (the benchmark's header, `mpiring info`)."""
    if huge_pages():
        return (f"2 MiB pages from {HUGE_FROM_BYTES >> 10} KiB (mpiring.empty; mpiring's pooled scratch from "
                f"{OWN_HUGE_FROM_BYTES >> 20} MiB)")
    why = "MPIRING_HUGE_PAGES=0" if _kernel_offers_huge_pages() else "the kernel offers no transparent huge pages"
    return f"numpy.empty ({why})"


def empty(shape: int | tuple[int, ...], dtype: Any = numpy.float64, *,
          huge_from: int = HUGE_FROM_BYTES) -> numpy.ndarray:
    """An uninitialized C-contiguous host array like numpy.empty, in 2 MiB pages from
    `huge_from` bytes (64 KiB) up where the kernel offers them (see the module's text).

    Allocate long-lived communication buffers (gradients, parameters, receive buffers) with it:
    on one node MPI sends from them faster than from 4 KiB pages from 64 KiB up (docs/benchmarks.md,
    "Buffers and pages"). An array takes whole 2 MiB pages: a 64 KiB one holds 2 MiB of memory.
    """
    dtype = numpy.dtype(dtype)
    nbytes = (int(shape) if isinstance(shape, (int, numpy.integer)) else math.prod(shape)) * dtype.itemsize
    if nbytes < huge_from or not huge_pages():
        return numpy.empty(shape, dtype)
    return in_huge_pages(nbytes).view(dtype).reshape(shape)


def in_huge_pages(nbytes: int) -> numpy.ndarray:
    """`nbytes` uninitialized bytes at the start of a fresh, 2 MiB-aligned mapping marked
    MADV_HUGEPAGE (whatever the size and MPIRING_HUGE_PAGES say; `empty` decides when)."""
    # never touched yet: the kernel backs each whole 2 MiB of it with a huge page on first touch
    length = -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES + HUGE_PAGE_BYTES  # + room to align
    mapping = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    raw = numpy.frombuffer(mapping, numpy.uint8)  # keeps the mapping alive as long as any view
    start = -raw.ctypes.data % HUGE_PAGE_BYTES
    return raw[start:start + nbytes]
