"""Letting go of a communicator's MPI communicator (Communicator.free) without leaving a message
behind that a later communicator could match.

MPI gives a freed communicator's context id to a later one, and a message still on its way to
(or waiting at) a rank would then match that communicator's receives. After a call raised, the
ranks may hold such messages: the notices of waiting.leave_notice, data a peer sent for a call
this rank left. So each rank says farewell: an empty message on the farewell tag to every peer,
sent after everything else it ever sent them. A rank takes every peer's messages in the order
they were sent (one receive for any tag keeps MPI's order between two ranks), dropping them,
until that peer's farewell: nothing that peer sent is then left in flight to it. Once every
peer's farewell is in, the MPI communicator is freed, unless this rank itself may still have
messages of an abandoned call active (Ring.broken), which MPI could complete into memory only
the ring keeps alive: that communicator is kept (one context id).

    rank 0: ... data --> ... farewell -->        rank 1: takes, drops ..., takes farewell
    rank 0: takes rank 1's messages up to its farewell; then MPI_Comm_free

Notices travel on a communicator of their own (Ring.notice_comm), which gets its own farewell
and is freed with the data communicator.

Nothing waits: what has not arrived when free() returns is taken by the next free() or
Communicator() of the process (`let_go`), so a rank that frees late never holds up the others.
At exit, before MPI is finalized, a process takes what is still coming for up to EXIT_SECONDS,
so that no message is left unmatched (which MPI libraries report, e.g. UCX's "unexpected
tag-receive descriptor ... was not matched").
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Collection, Iterator
from typing import Any

from mpi4py import MPI

from mpiring import topology
from mpiring.engine.notice_board import open_board
from mpiring.engine.ring import Ring
from mpiring.errors import CommunicationError

_NOTHING = bytearray(0)
EXIT_SECONDS = 1.0  # the most a process waits at exit for peers' farewells (a peer may never free)
_leaving: list[_Farewell] = []  # communicators whose farewells are not all in yet
_kept: list[Any] = []  # what kept communicators' abandoned calls hold, for the life of the process
# Communicators of different threads are freed and made at the same time: one thread at a time
# takes a communicator's messages (a probe and its receive) and frees it
_lock = threading.RLock()


class _Farewell:
    """One communicator being let go: the peers whose farewell has not come yet."""

    __slots__ = ("comms", "tag", "peers", "sends", "keep", "held", "status")

    def __init__(self, ring: Ring, keep: bool, lost: Collection[int] = ()) -> None:
        self.comms = [ring.comm] if ring.notice_comm is ring.comm else [ring.comm, ring.notice_comm]
        self.tag = ring.tags.farewell
        peers = [peer for peer in range(ring.size) if peer != ring.rank and peer not in lost]
        self.peers = [list(peers) for _ in self.comms]  # each communicator's peers whose farewell is still coming
        self.sends = [comm.Isend([_NOTHING, 0, MPI.BYTE], peer, self.tag) for comm in self.comms for peer in peers]
        self.keep = keep
        # what MPI may still read or write: the notices' requests, an abandoned call's buffers
        self.held: Any = (ring.notices, ring.abandoned)
        self.status = MPI.Status()

    def advance(self) -> bool:
        """Take and drop what the peers sent, up to each one's farewell; True once all are in
        (and the communicator is then freed, or kept for good)."""
        status = self.status
        for comm, peers in zip(self.comms, self.peers, strict=True):
            for peer in list(peers):
                while comm.Iprobe(peer, MPI.ANY_TAG, status):
                    tag, size = status.Get_tag(), status.Get_count(MPI.BYTE)
                    comm.Recv([bytearray(size), size, MPI.BYTE], peer, tag)
                    if tag == self.tag:
                        peers.remove(peer)
                        break
        if any(self.peers):
            return False
        if self.keep:
            _kept.append(self.held)
        else:
            for comm in self.comms:
                comm.Free()  # the farewell sends may still be completing: MPI lets them
        return True


def say_farewell(ring: Ring, lost: Collection[int] = ()) -> None:
    """Start letting go of `ring`'s MPI communicator (see the module's docstring); `lost`: ranks
    known to be gone (survival), which send no farewell and get none. A communicator that lost a
    rank is kept, not freed: MPI_Comm_free would wait for the lost rank."""
    farewell = _Farewell(ring, keep=ring.broken is not None or bool(lost), lost=lost)
    with _lock:
        if not farewell.advance():
            _leaving.append(farewell)
        let_go()


def let_go() -> None:
    """Take what has arrived for communicators still being let go; free those now complete."""
    with _lock:
        _leaving[:] = [farewell for farewell in _leaving if not farewell.advance()]


def leaving() -> int:
    """How many communicators wait for a peer's farewell (tests, and Communicator's advice)."""
    return len(_leaving)


def _at_exit() -> None:
    """Take the farewells still coming before MPI is finalized (atexit runs this first: mpiring
    registers it after mpi4py is imported)."""
    deadline = time.monotonic() + EXIT_SECONDS
    while _leaving and time.monotonic() < deadline and MPI.Is_initialized() and not MPI.Is_finalized():
        let_go()
        time.sleep(0.001)


atexit.register(_at_exit)


def private_ring(base: MPI.Intracomm) -> Ring:
    """A Ring on two private duplicates of `base`, one for its data and one for its notices, its
    nodes found (topology.discover; collective) and, on one node, its notice board;
    CommunicationError, with nothing left made, where MPI cannot make them."""
    let_go()  # communicators freed earlier whose peers' farewells have come since
    made: list[MPI.Intracomm] = []
    try:
        with communicator_made():
            made.append(base.Dup())
            made.append(made[0].Dup())
            ring = Ring(*made)
            ring.nodes, ring.node_local, ring.core_per_rank, ring.ranks_sharing_cores = topology.discover(ring.comm)
            if ring.node_local and ring.size > 1:
                ring.notice_board = open_board(ring.comm)
    except CommunicationError:
        for comm in made:
            comm.Free()
        raise
    return ring


@contextlib.contextmanager
def communicator_made() -> Iterator[None]:
    """Around an MPI call that makes a communicator: MPI's error, most often that every context
    id is in use, becomes CommunicationError."""
    try:
        yield
    except MPI.Exception as error:
        waiting = f"; {leaving()} freed here still wait for a peer's free()" if leaving() else ""
        raise CommunicationError(
            "Communicator", f"MPI could not make a communicator ({_last_line(error.Get_error_string())}{waiting}); "
            "if the program makes many, free() each one it no longer needs on every rank, or use "
            "`with mpiring.Communicator() as comm:`",
        ) from error


def _last_line(text: str) -> str:
    """The most specific part of an MPI error stack (MPICH puts it last, after the call chain)."""
    line = text.strip().splitlines()[-1]
    return line.split(": ", 1)[-1].strip() if ": " in line else line
