"""The notice board: the calls each rank of a one-node communicator left, in memory its ranks
share, so that a call that completed looks there for a peer that left it (a few loads) rather
than asking MPI for that peer's notice (an `MPI_Iprobe`, which runs the library's progress and,
where Open MPI yields an oversubscribed core when idle, gives the core away after every call).

A rank that leaves a call (waiting.leave_notice) writes the call's key in its own row before it
sends its notices, so before its caller can write the call's arrays again: a peer whose call
completed with data that rank may have rewritten since finds the key when it looks, after its
last receive. A key is the call's notice tag and its number (so no key of a call 2**k calls
back, whose tag was the same, is taken for this one's). Each row keeps the last SLOTS keys its
rank wrote; only that rank writes it.

    rows, int64 (-1: empty)    rank 0 | key key -1 ... (SLOTS)
                               rank 1 | -1  -1  -1 ...
    posted, a byte             0 until any rank posts (then 1)

A rank sets `posted` after it writes its key, so a look finds nothing to search while no rank
ever left a call: one load on every completed call rather than a search of the rows.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import struct

import numpy
from mpi4py import MPI

SLOTS = 8
_EMPTY = -1
_KEY_BYTES = 8
_ROW_BYTES = SLOTS * _KEY_BYTES
_PACK = struct.Struct("<q").pack


def key(tag: int, number: int) -> int:
    """The board's key of the call numbered `number` whose notice tag is `tag`."""
    return tag << 32 | number & 0xFFFFFFFF


class NoticeBoard:
    """One communicator's board, mapped in this process (`open_board` makes it)."""

    __slots__ = ("rows", "rank", "address", "_memory", "_end", "_written")

    def __init__(self, memory: mmap.mmap, size: int, rank: int) -> None:
        self._memory = memory
        self.rows = numpy.frombuffer(memory, numpy.int64, size * SLOTS).reshape(size, SLOTS)
        self.address = self.rows.ctypes.data  # where the C replay reads it
        self.rank = rank
        self._end = self.rows.nbytes  # where `posted` is
        self._written = 0

    def c_form(self) -> tuple:
        """What the C replay takes (mpiring.engine.native.program): this object, kept alive while a
        program reads the rows; their address; ranks; slots; this rank."""
        return self, self.address, self.rows.shape[0], SLOTS, self.rank

    def post(self, tag: int, number: int) -> None:
        """This rank left the call numbered `number` (notice tag `tag`)."""
        self.rows[self.rank, self._written % SLOTS] = key(tag, number)
        self._memory[self._end] = 1  # posted
        self._written += 1

    def who_left(self, tag: int, number: int) -> int:
        """A peer that left the call numbered `number` (notice tag `tag`), or -1 where none did."""
        memory, end = self._memory, self._end
        if not memory[end]:  # no rank ever posted
            return -1
        wanted = _PACK(tag << 32 | number & 0xFFFFFFFF)  # (key, inline: every completed call asks)
        found = memory.find(wanted, 0, end)
        while found >= 0:
            peer = found // _ROW_BYTES
            if found % _KEY_BYTES == 0 and peer != self.rank:
                return peer
            found = memory.find(wanted, found + 1, end)
        return -1


def open_board(comm: MPI.Intracomm) -> NoticeBoard | None:
    """Collective over `comm`, whose ranks share one node: its notice board, in a file of
    /dev/shm that rank 0 makes and removes once every rank has mapped it; None on every rank
    where any rank cannot have it (then calls ask MPI for notices)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    nbytes = max(size * SLOTS * _KEY_BYTES + 1, mmap.PAGESIZE)  # the rows, then `posted`
    path = ""
    if rank == 0:
        path = os.path.join("/dev/shm", f"mpiring-notices-{os.getpid()}-{secrets.token_hex(6)}")
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(descriptor, nbytes)
                os.pwrite(descriptor, numpy.full(size * SLOTS, _EMPTY, numpy.int64).tobytes(), 0)  # (the rest: 0)
            finally:
                os.close(descriptor)
        except OSError:
            path = ""
    path = comm.bcast(path, root=0)
    memory = None
    if path:
        with contextlib.suppress(OSError, ValueError):
            descriptor = os.open(path, os.O_RDWR)
            try:
                memory = mmap.mmap(descriptor, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(descriptor)
    everyone = comm.allreduce(memory is not None, op=MPI.LAND)
    if rank == 0 and path:
        with contextlib.suppress(OSError):
            os.unlink(path)
    if not everyone:
        if memory is not None:
            memory.close()
        return None
    return NoticeBoard(memory, size, rank)
