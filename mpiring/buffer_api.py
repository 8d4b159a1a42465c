"""mpi4py's uppercase buffer API on mpiring's rings: code written for `MPI.COMM_WORLD.Allreduce(...)`
runs unchanged on `mpiring.Communicator(MPI.COMM_WORLD).Allreduce(...)`.

`BufferAPI` holds the uppercase methods of one Communicator, which makes it at its creation and
forwards its own uppercase methods to it (the blocking ones of COMMON_FORMS read their common
forms in C first, native.dropin_call, and forward only what C leaves). Every method parses
mpi4py's buffer specifications (mpiring.buffer_specs: views of the caller's memory), then runs
one of the communicator's lowercase collectives on them, so the result lands in the caller's
receive buffer. No native MPI collective runs here. `DROPIN` is the table each collective's three
forms are written out from: `Name` (blocking), `Iname` and `Name_init`, which return a `Request`.

Semantics are MPI's where the lowercase API differs: counts are the exact ones of the specs (a
count in a spec holding one block per rank is per block, as MPI's recvcount), a root-only buffer
is ignored off the root, displacements are honoured. A spec every rank can check alone raises
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
    Alltoallw                       alltoallv of the buffers' bytes (per-block datatypes, byte displacements)
    Scan / Exscan                   scan / exscan
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy
from mpi4py import MPI

from mpiring import entry_points
from mpiring.buffer_specs import (
    OPS,
    Vector,
    bytes_vector,
    count_list,
    is_in_place,
    matching,
    op_name,
    own_block,
    own_block_v,
    packed_blocks,
    same_memory,
    simple,
    unit_of,
    vector,
)
from mpiring.engine import native
from mpiring.errors import ArgumentError, ArgumentTypeError

if TYPE_CHECKING:
    from mpiring.engine.engine import Engine


def _check_info(collective: str, info: Any) -> None:
    if not isinstance(info, MPI.Info):
        raise ArgumentTypeError(collective, "info", f"must be an MPI.Info, got {info!r}")


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
        """Wait() for every request, in order; `statuses` is accepted and left untouched."""
        for request in requests:
            request.Wait()
        return True

    @staticmethod
    def Testall(requests: Sequence[Request], statuses: Any = None) -> bool:
        """Test() every request (each advances); True once all are done."""
        return all([request.Test() for request in requests])  # a list: every request advances

    @staticmethod
    def Startall(requests: Sequence[Request]) -> None:
        """Start() every persistent request, in order."""
        for request in requests:
            request.Start()


# An in-place all-to-all's algorithm, whatever the form of its buffers: MPI has every rank's call
# in place, so every rank runs it, and it exchanges each block in place (algorithms/alltoall_pairwise.py).
IN_PLACE_ALLTOALL = "pairwise"


class _Prepared:
    """A parsed uppercase call: the lowercase collective's arguments as the engine's entries take
    them (`run`, `start` and `persistent`: counts= as tuples, scatter's x None off the root), and
    what to copy into the caller's buffers once it is done."""

    __slots__ = ("call", "finish", "before")

    def __init__(self, collective: str, x: Any, out: Any = None, op: str | None = None, root: int | None = None,
                 counts: Any = None, finish: Callable[[], None] | None = None,
                 before: Callable[[], None] | None = None, algorithm: str | None = None) -> None:
        self.call = (collective, x, out, op, root, counts, algorithm, None)  # timeout: the default
        self.finish = finish  # after each run: copy the result into place
        self.before = before  # before each run (done once already): copy the input


class BufferAPI:
    """mpi4py's uppercase methods over one `Communicator`, which holds this object and forwards
    its own uppercase methods here.

    Each collective's method parses its buffer specs (mpiring.buffer_specs) and hands the
    lowercase call to the communicator's `engine`: its `run` (blocking), `start` (the I-forms) or
    `persistent` (the *_init forms). Everything else goes through `comm`'s public methods: the
    broadcast and all-gather of counts some v-variants need first, the barrier, free, Dup and
    ULFM's calls. `rank` and `size` are the communicator's. (`comm` is typed Any: this module
    cannot import mpiring.communicator, which imports it.)
    """

    def __init__(self, comm: Any, engine: Engine) -> None:
        self._comm = comm
        self._engine = engine
        self.rank: int = comm.rank
        self.size: int = comm.size

    # ---- communicator ----

    def Get_rank(self) -> int:
        """This rank's number in the communicator (`comm.rank`)."""
        return self.rank

    def Get_size(self) -> int:
        """The number of ranks (`comm.size`)."""
        return self.size

    def Dup(self, info: Any = None) -> Any:
        """A new communicator over the same ranks, with this one's timeout, check and survival (collective)."""
        comm = self._comm
        timeout = math.inf if comm.timeout is None else comm.timeout
        return type(comm)(comm.mpi, timeout=timeout, check=self._engine.check is not None, survive=comm.survives)

    def Free(self) -> None:
        """Release the communicator (mpiring's `free()`; collective)."""
        self._comm.free()

    # ---- ULFM's names (mpi4py 4), on any MPI: a lost rank (docs/lost-rank.md) ----

    def Revoke(self) -> None:
        """Revoke the communicator on every rank (`revoke()`; MPI_Comm_revoke)."""
        self._comm.revoke()

    def Is_revoked(self) -> bool:
        """Whether the communicator was revoked (`is_revoked()`; MPI_Comm_is_revoked)."""
        return self._comm.is_revoked()

    def Agree(self, flag: int) -> int:
        """The bitwise AND of `flag` over the live ranks (`agree()`; MPI_Comm_agree)."""
        return self._comm.agree(flag)

    def Shrink(self) -> Any:
        """A new communicator of the live ranks, in order (`shrink()`; MPI_Comm_shrink)."""
        return self._comm.shrink()

    def Get_failed(self) -> MPI.Group:
        """The group of the ranks known lost here (`lost()`; MPI_Comm_get_failed)."""
        group = self._comm.mpi.Get_group()
        try:
            return group.Incl(self._comm.lost())
        finally:
            group.Free()

    def Ack_failed(self, num_to_ack: int | None = None) -> int:
        """Acknowledge the ranks lost so far; returns how many are acknowledged (MPI_Comm_ack_failed).
        `num_to_ack`: at most this many, the first lost (None: all)."""
        acknowledged = self._comm.acknowledge_lost()
        return acknowledged if num_to_ack is None else min(acknowledged, num_to_ack)

    # ---- the calls: each parses its specs, then runs as blocking, I-form or persistent ----

    def _run(self, prepared: _Prepared) -> None:
        self._engine.run(*prepared.call)
        if prepared.finish is not None:
            prepared.finish()

    def _irun(self, prepared: _Prepared) -> Request:
        return Request(self._engine.start(*prepared.call), prepared.finish)

    def _init(self, prepared: _Prepared, info: Any) -> Request:
        _check_info(prepared.call[0], info)
        return Request(self._engine.persistent(*prepared.call), prepared.finish, prepared.before)

    def _parse_bcast(self, buf: Any, root: int) -> _Prepared:
        items = simple("Bcast", "buf", buf)
        return _Prepared("broadcast", items, items, None, root)

    def _parse_reduce(self, sendbuf: Any, recvbuf: Any, op: Any, root: int) -> _Prepared:
        name = op_name("Reduce", op)
        if self.rank == root:
            out = simple("Reduce", "recvbuf", recvbuf)
            x = out if is_in_place(sendbuf) else matching("Reduce", "sendbuf", simple("Reduce", "sendbuf", sendbuf),
                                                            out.size, out.dtype)
        else:  # the receive buffer is ignored off the root
            x, out = self._send_only("Reduce", sendbuf), None
        return _Prepared("reduce", x, out, name, root)

    def _parse_allreduce(self, sendbuf: Any, recvbuf: Any, op: Any) -> _Prepared:
        name = op_name("Allreduce", op)
        out = simple("Allreduce", "recvbuf", recvbuf)
        x = out if is_in_place(sendbuf) else matching("Allreduce", "sendbuf",
                                                        simple("Allreduce", "sendbuf", sendbuf), out.size, out.dtype)
        return _Prepared("allreduce", x, out, name)

    def _parse_gather(self, sendbuf: Any, recvbuf: Any, root: int) -> _Prepared:
        p, r = self.size, self.rank
        if r == root:
            out = simple("Gather", "recvbuf", recvbuf, blocks=p)
            n = out.size // p
            x, before = own_block("Gather", "sendbuf", sendbuf, out, r, n, copy_in=True)
        else:
            x, out, before = self._send_only("Gather", sendbuf), None, None
        return _Prepared("gather", x, out, None, root, (x.size,) * p, before=before)

    def _parse_allgather(self, sendbuf: Any, recvbuf: Any) -> _Prepared:
        p, r = self.size, self.rank
        out = simple("Allgather", "recvbuf", recvbuf, blocks=p)
        n = out.size // p
        x, before = own_block("Allgather", "sendbuf", sendbuf, out, r, n, copy_in=True)
        return _Prepared("allgather", x, out, None, None, (n,) * p, before=before)

    def _parse_gatherv(self, sendbuf: Any, recvbuf: Any, root: int) -> _Prepared:
        if self.rank != root:  # the row counts are exchanged: only the root knows them
            return _Prepared("gather", self._send_only("Gatherv", sendbuf), None, None, root)
        v = vector("Gatherv", "recvbuf", recvbuf, self.size)
        x = own_block_v("Gatherv", "sendbuf", sendbuf, v, root)
        out, finish = self._packed_target(v, x.dtype)
        return _Prepared("gather", x, out, None, root, None, finish)

    def _parse_allgatherv(self, sendbuf: Any, recvbuf: Any) -> _Prepared:
        v = vector("Allgatherv", "recvbuf", recvbuf, self.size)
        x = own_block_v("Allgatherv", "sendbuf", sendbuf, v, self.rank)
        out, finish = self._packed_target(v, x.dtype)
        return _Prepared("allgather", x, out, None, None, tuple(v.counts), finish)

    def _parse_scatter(self, sendbuf: Any, recvbuf: Any, root: int) -> _Prepared:
        p, r = self.size, self.rank
        if r == root:
            x = simple("Scatter", "sendbuf", sendbuf, blocks=p)
            n = x.size // p
            out, _ = own_block("Scatter", "recvbuf", recvbuf, x, r, n, copy_in=False)
        else:  # the send buffer is ignored off the root
            x, out = None, self._receive_only("Scatter", recvbuf)
        return _Prepared("scatter", x, out, None, root, (out.size,) * p)

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
            out = own_block_v("Scatterv", "recvbuf", recvbuf, v, root)
        else:
            out = self._receive_only("Scatterv", recvbuf)
        self._comm.broadcast(counts, root, out=counts)
        if out.size != counts[r]:
            raise ArgumentError("Scatterv", "recvbuf", f"takes {out.size} elements but the root sends rank {r} "
                                f"{counts[r]}")
        return _Prepared("scatter", x, out, None, root, tuple(counts.tolist()), None, before)

    def _parse_reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any) -> _Prepared:
        p = self.size
        name = op_name("Reduce_scatter_block", op)
        in_place = is_in_place(sendbuf)
        if not in_place:
            out = simple("Reduce_scatter_block", "recvbuf", recvbuf)
            n = out.size
            x = simple("Reduce_scatter_block", "sendbuf", sendbuf, blocks=p)
            in_place = x.size != n * p and same_memory(x, out)
            if not in_place:
                x = matching("Reduce_scatter_block", "sendbuf", x, n * p, out.dtype)
        finish = None
        if in_place:  # the receive buffer holds every block; the result lands in the first, by a
            # copy after the run (an out= inside x could not be recorded: every call would take the slow path)
            x = simple("Reduce_scatter_block", "recvbuf", recvbuf, blocks=p)
            n = x.size // p
            out = numpy.empty(n, x.dtype)
            finish = partial(numpy.copyto, x[:n], out)
        return _Prepared("reduce_scatter", x, out, name, None, (n,) * p, finish)

    def _parse_reduce_scatter_v(self, sendbuf: Any, recvbuf: Any, recvcounts: Any, op: Any) -> _Prepared:
        """Without recvcounts every rank's receive count is all-gathered first (as mpi4py does)."""
        p, r = self.size, self.rank
        name = op_name("Reduce_scatter", op)
        whole = simple("Reduce_scatter", "recvbuf", recvbuf)
        in_place = is_in_place(sendbuf)
        x = None if in_place else simple("Reduce_scatter", "sendbuf", sendbuf)
        if recvcounts is not None:
            counts = count_list("Reduce_scatter", "recvcounts", recvcounts, p)
            if whole.size != (sum(counts) if in_place else counts[r]):  # maybe several elements per instance
                unit = unit_of("Reduce_scatter", "recvbuf", recvbuf)
                counts = [c * unit for c in counts] if unit != 1 else counts
        elif in_place:
            raise ArgumentError("Reduce_scatter", "recvcounts", "must be given with an in-place send buffer")
        else:
            counts = self._comm.allgather(numpy.array([whole.size], numpy.int64), counts=[1] * p).tolist()
        if not in_place and whole.size != counts[r] and same_memory(x, whole):
            in_place = True
        if in_place:  # the receive buffer holds the whole input; the result lands at its start
            x = matching("Reduce_scatter", "recvbuf", whole, sum(counts), whole.dtype)
            out = whole[: counts[r]]
        else:
            out = matching("Reduce_scatter", "recvbuf", whole, counts[r], whole.dtype)
            x = matching("Reduce_scatter", "sendbuf", x, sum(counts), whole.dtype)
        return _Prepared("reduce_scatter", x, out, name, None, None if counts is None else tuple(counts))

    def _parse_alltoall(self, sendbuf: Any, recvbuf: Any) -> _Prepared:
        p = self.size
        out = simple("Alltoall", "recvbuf", recvbuf, blocks=p)
        if is_in_place(sendbuf):
            return _Prepared("alltoall", out, out, algorithm=IN_PLACE_ALLTOALL)
        x = matching("Alltoall", "sendbuf", simple("Alltoall", "sendbuf", sendbuf, blocks=p), out.size, out.dtype)
        return _Prepared("alltoall", x, out)

    def _parse_alltoallv(self, sendbuf: Any, recvbuf: Any) -> _Prepared:
        p = self.size
        receive = packed_blocks(recvbuf, p)
        send = receive if receive is not None and is_in_place(sendbuf) else packed_blocks(sendbuf, p)
        if receive is not None and send is not None and receive[0].dtype == send[0].dtype:
            if send is not receive:
                return _Prepared("alltoallv", send[0], receive[0], None, None, (send[1], receive[1]))
            return _Prepared("alltoallv", receive[0], receive[0], None, None, (receive[1], receive[1]),
                             algorithm=IN_PLACE_ALLTOALL)
        receive = vector("Alltoallv", "recvbuf", recvbuf, p)
        send = receive if is_in_place(sendbuf) else vector("Alltoallv", "sendbuf", sendbuf, p)
        return self._alltoallv_of("Alltoallv", send, receive)

    def _parse_alltoallw(self, sendbuf: Any, recvbuf: Any) -> _Prepared:
        """Alltoallv over bytes: each block's count times its datatype's size, at its byte displacement."""
        p = self.size
        receive = bytes_vector("Alltoallw", "recvbuf", recvbuf, p)
        send = receive if is_in_place(sendbuf) else bytes_vector("Alltoallw", "sendbuf", sendbuf, p)
        return self._alltoallv_of("Alltoallw", send, receive)

    def _alltoallv_of(self, collective: str, send: Vector, receive: Vector) -> _Prepared:
        if send.items.dtype != receive.items.dtype:
            raise ArgumentTypeError(collective, "sendbuf", f"has datatype {send.items.dtype} but the receive "
                                    f"buffer {receive.items.dtype} (MPI needs them to match)")
        x, before = send.packed, None
        if x is None or send is receive:  # in place, the input is copied out before the result lands
            x = numpy.empty(sum(send.counts), send.items.dtype)
            before = partial(send.gather_into, x)
            before()
        out, finish = self._packed_target(receive, receive.items.dtype)
        return _Prepared("alltoallv", x, out, None, None, (tuple(send.counts), tuple(receive.counts)), finish, before,
                         IN_PLACE_ALLTOALL if send is receive else None)

    def _parse_scan(self, sendbuf: Any, recvbuf: Any, op: Any, collective: str) -> _Prepared:
        """Scan and Exscan (whose rank 0 receives nothing: its receive buffer is left as it was)."""
        upper = "Scan" if collective == "scan" else "Exscan"
        name = op_name(upper, op)
        out = simple(upper, "recvbuf", recvbuf)
        x = out if is_in_place(sendbuf) else matching(upper, "sendbuf", simple(upper, "sendbuf", sendbuf),
                                                        out.size, out.dtype)
        return _Prepared(collective, x, out, name)

    @staticmethod
    def _send_only(collective: str, sendbuf: Any) -> Any:
        if is_in_place(sendbuf):
            raise ArgumentError(collective, "sendbuf", "MPI.IN_PLACE (or None) is for the root only")
        return simple(collective, "sendbuf", sendbuf)

    @staticmethod
    def _receive_only(collective: str, recvbuf: Any) -> Any:
        if is_in_place(recvbuf):
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

    # ---- the barrier; every other collective's three forms are written out from DROPIN, below ----

    def Barrier(self) -> None:
        """Return once every rank has entered (mpiring's `barrier`)."""
        self._comm.barrier()

    def Ibarrier(self) -> Request:
        """Nonblocking Barrier: Wait() returns once every rank has entered."""
        return Request(self._comm.ibarrier(), None)

    def Barrier_init(self, info: Any = MPI.INFO_NULL) -> Request:
        """Persistent Barrier: Start() and Wait() per use."""
        _check_info("Barrier_init", info)
        return Request(self._comm.barrier_init(), None)


# mpi4py's uppercase collectives (but the barrier): name, the BufferAPI parser of its specs
# (its parameters after `self` are the method's, but for scan's `collective`, which gets the
# collective's name), and what the blocking form does. Each gets `Name` (blocking), `Iname`
# (nonblocking: a Request whose Wait() leaves the result in the receive buffer) and `Name_init`
# (persistent, MPI-4: buffers bound at init, Start() and Wait() per use), as mpi4py names them.
DROPIN = (
    ("Bcast", "_parse_bcast", "Broadcast root's `buf` to every rank's `buf`."),
    ("Reduce", "_parse_reduce", "Reduce every rank's `sendbuf` into root's `recvbuf` (ignored elsewhere)."),
    ("Allreduce", "_parse_allreduce", "Reduce every rank's `sendbuf` into every rank's `recvbuf`."),
    ("Gather", "_parse_gather", "Gather equal blocks into root's `recvbuf`, in rank order."),
    ("Gatherv", "_parse_gatherv", "Gather blocks of any size into root's `recvbuf` at its counts and displacements."),
    ("Allgather", "_parse_allgather", "Gather equal blocks into every rank's `recvbuf`, in rank order."),
    ("Allgatherv", "_parse_allgatherv",
     "Gather blocks of any size into every rank's `recvbuf` at its counts and displacements."),
    ("Scatter", "_parse_scatter", "Scatter equal blocks of root's `sendbuf` (ignored elsewhere), block k to rank k."),
    ("Scatterv", "_parse_scatterv",
     "Scatter blocks of root's `sendbuf` at its counts and displacements, block k to rank k."),
    ("Reduce_scatter_block", "_parse_reduce_scatter_block",
     "Reduce, then block k (of recvbuf's count) of the result to rank k."),
    ("Reduce_scatter", "_parse_reduce_scatter_v", "Reduce, then recvcounts[k] elements of the result to rank k."),
    ("Alltoall", "_parse_alltoall",
     "Block j of every rank's `sendbuf` to rank j, into block i of its `recvbuf` (from rank i)."),
    ("Alltoallv", "_parse_alltoallv", "Alltoall with counts and displacements on both sides."),
    ("Alltoallw", "_parse_alltoallw",
     "Alltoallv with a datatype per block and displacements in bytes (predefined datatypes)."),
    ("Scan", "_parse_scan", "Rank r's `recvbuf` gets the reduction of ranks 0..r's `sendbuf`."),
    ("Exscan", "_parse_scan", "Rank r's `recvbuf` gets the reduction of ranks 0..r-1's `sendbuf` (rank 0's is "
                              "left alone)."),
)
# nonblocking forms that do a blocking step first
_NONBLOCKING_NOTES = {
    "Iscatterv": "Nonblocking Scatterv, after a blocking broadcast of the root's counts.",
    "Ireduce_scatter": "Nonblocking Reduce_scatter (without recvcounts, after a blocking all-gather of them).",
}
# the defaults mpi4py gives these parameters
_DEFAULTS = {"root": 0, "op": MPI.SUM, "recvcounts": None}
# The blocking calls whose common forms C reads straight into the engine's arguments
# (native.dropin_call: plain specs, predefined ops, MPI.IN_PLACE); their codes there. Any other
# form, and every error, is the Python parse's. `Communicator`'s own blocking method of each asks
# COMMON_CALL first, which runs the call, and forwards here only where it returns NotImplemented
# (COMMON_CALL is None where C was not built).
COMMON_FORMS = {"Bcast": 0, "Reduce": 1, "Allreduce": 2, "Gather": 3, "Allgather": 4, "Scatter": 5, "Alltoall": 6,
                "Scan": 7, "Exscan": 8, "Alltoallv": 9, "Reduce_scatter_block": 10}
COMMON_CALL = native.dropin_call({id(op): (op, name) for op, name in OPS}, MPI.IN_PLACE, IN_PLACE_ALLTOALL)


def _forms(name: str, parser: str, doc: str) -> list[Callable[..., Any]]:
    """`name`, `I<name>` and `<name>_init`, each parsing its specs with `parser`."""
    taken = [p for p in entry_points.parameters_of(getattr(BufferAPI, parser)) if p.name != "collective"]
    parameters = [p.replace(default=_DEFAULTS.get(p.name, p.empty)) for p in taken]
    constant = f", {name.lower()!r}" if parser == "_parse_scan" else ""  # scan and exscan share the parser
    parse = f"self.{parser}({', '.join(p.name for p in parameters)}{constant})"
    info = inspect.Parameter("info", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=MPI.INFO_NULL, annotation="Any")
    nonblocking = "I" + name[0].lower() + name[1:]
    module = __name__
    return [
        entry_points.method(BufferAPI, name, parameters, f"self._run({parse})", doc, "None", module),
        entry_points.method(BufferAPI, nonblocking, parameters, f"return self._irun({parse})",
                            _NONBLOCKING_NOTES.get(nonblocking, f"Nonblocking {name}: the result is in the "
                                                   "receive buffer once Wait() returns."),
                            "Request", module),
        entry_points.method(BufferAPI, f"{name}_init", [*parameters, info], f"return self._init({parse}, info)",
                            f"Persistent {name}: buffers bound now; Start() and Wait() per use.", "Request", module),
    ]


for _row in DROPIN:
    for _method in _forms(*_row):
        setattr(BufferAPI, _method.__name__, _method)
del _row, _method


def add_uppercase(owner: type) -> None:
    """Give `owner` (mpiring.Communicator, which holds a BufferAPI as `_buffers` and the engine's
    blocking run as `_blocking`) every uppercase method of BufferAPI, of the same name, signature
    and docstring, as a forward to its `_buffers`. A blocking call of COMMON_FORMS first has C
    read its specs (COMMON_CALL) and runs what it reads at once, with no other Python call on the
    way; only what C leaves goes to BufferAPI's parse."""
    for name, function in vars(BufferAPI).items():
        if name[:1].isupper():
            setattr(owner, name, uppercase(owner, function))


def uppercase(owner: type, function: Callable[..., Any], served: str = "") -> Callable[..., Any]:
    """`owner`'s method of BufferAPI `function`'s name, signature and docstring, on the Communicator
    `self.<served>` (`self` itself where `served` is empty; mpiring.dropin's Intracomm: `_mpiring`):
    a forward to its `_buffers`, which a blocking call of COMMON_FORMS takes only where C cannot
    read its specs."""
    name = function.__name__
    comm = f"self.{served}" if served else "self"
    if name == "Barrier":  # no buffers to read: the engine's blocking run at once
        return entry_points.method(owner, name, [], f"{comm}._blocking('barrier', None, None, None, None, None, None, "
                                   "None)", function.__doc__ or "", "None", owner.__module__)
    if name not in COMMON_FORMS or COMMON_CALL is None:
        return entry_points.forward(owner, function, f"{served}._buffers" if served else "_buffers", owner.__module__)
    parameters = entry_points.parameters_of(function)
    given = {p.name for p in parameters}
    send, receive = ("buf", "None") if name == "Bcast" else ("sendbuf", "recvbuf")
    read = ", ".join((str(COMMON_FORMS[name]), send, receive, "op" if "op" in given else "None",
                      "root" if "root" in given else "None", "comm._place", "comm._blocking"))
    body = (f"comm = {comm}\n    if common_call({read}) is NotImplemented:\n"
            f"        comm._buffers.{name}({entry_points.arguments_of(parameters)})")
    return entry_points.method(owner, name, parameters, body, function.__doc__ or "", "None", owner.__module__,
                               {"common_call": COMMON_CALL})
