"""The public face of mpiring: `Communicator`, one method per collective, blocking and
nonblocking (the `i` prefix, as in MPI).

Each method hands its call to the communicator's `Engine` (mpiring.engine.engine), which has the
collective's builder, below, check the arguments (raising before any message moves) and make its
generator of ring steps, then finds, records or runs it: to the end for a blocking call, or step
by step from the returned request's test()/wait(). Names follow mpi4py's lowercase API.

mpi4py's uppercase methods (`Allreduce`, `Iallreduce`, `Allreduce_init`, `Get_rank`, `Dup`, ...)
are forwards to the `BufferAPI` (mpiring.buffer_api) each communicator holds, written out by
`buffer_api.add_uppercase`; the blocking ones of its common forms run from C's reading of their
specs without it.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from mpi4py import MPI

from mpiring import collectives, consistency, entry_points, environment, identity, survival
from mpiring.backend import NUMPY, backend_for
from mpiring.buffer_api import BufferAPI, add_uppercase
from mpiring.catalogue import CATALOGUE
from mpiring.engine.engine import Built, Engine, counts_key, counts_pair, plannable
from mpiring.engine.farewell import private_ring
from mpiring.engine.partition import row_bounds
from mpiring.engine.plan import Plan
from mpiring.engine.schedule import Schedule
from mpiring.engine.transport import Traffic
from mpiring.errors import ArgumentError
from mpiring.launch import check_world_size
from mpiring.ops import SUM
from mpiring.selection import read_environment
from mpiring.validation import (
    check_array,
    check_counts,
    check_op,
    check_out,
    check_root,
    check_timeout,
)

# How long a collective step waits by default before raising CollectiveTimeout (torch.distributed's
# default): long enough for any honest imbalance, short enough that a lost rank ends the job.
DEFAULT_TIMEOUT = 600.0


class Communicator:
    """Ring collectives over an mpi4py intracommunicator (COMM_WORLD by default).

    Creating one is collective: every rank of `comm` must do it. mpiring's messages travel on
    a private duplicate of `comm`, so they never mix with the caller's own messages.

    `timeout` (seconds; default from the MPIRING_TIMEOUT environment variable, else 10 minutes,
    as in torch.distributed) bounds how long any collective of this communicator waits for a
    step before raising `CollectiveTimeout`, so no job hangs for ever by default; `math.inf` (or
    MPIRING_TIMEOUT=none) waits without limit. Each call may override it with its own `timeout=`.

    `check` (default from the MPIRING_CHECK environment variable, else off) makes every
    collective first compare a fingerprint of its call across the ranks and raise
    `CollectiveMismatchError` on every rank where they differ (see mpiring.consistency).

    `busy_poll` (default from the MPIRING_BUSY_POLL environment variable, else on where the
    machine has a core for each of its ranks) makes waits test again and again without offering
    the core between tests; off, a wait offers it to other runnable work. A communicator called
    from a helper thread beside a busy one (a torch process group's progress thread) wants it off.

    `survive` (default from the MPIRING_SURVIVE environment variable, else off) makes the
    communicator survive a lost rank (docs/lost-rank.md): it watches its peers, every survivor's
    wait ends with `RankLostError` within a fraction of a second of a loss, and `revoke()`,
    `agree()` and `shrink()` let the survivors go on. The job must be launched so that a lost
    rank does not end it (MPICH: ``mpiexec -disable-auto-cleanup``).

    It has mpi4py's uppercase buffer methods too (`Allreduce`, `Iallreduce`, `Allreduce_init`, ...),
    which take mpi4py's buffer specs and leave the result in the receive buffer (docs/dropin.md).
    """

    def __init__(self, comm: MPI.Intracomm | None = None, *, timeout: float | None = None,
                 check: bool | None = None, survive: bool | None = None, busy_poll: bool | None = None) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm) or base == MPI.COMM_NULL:
            raise ArgumentError("Communicator", "comm", f"must be an mpi4py intracommunicator, got {base!r}")
        if comm is None:  # a launcher that started N processes but not one N-rank job: say so now
            check_world_size(base.Get_size())
        read_environment()
        if timeout is None:
            from_environment = environment.seconds("MPIRING_TIMEOUT", "Communicator")
            timeout = DEFAULT_TIMEOUT if from_environment is None else from_environment
        timeout = check_timeout("Communicator", timeout)  # None: no limit
        surviving = survival.requested(survive)
        if surviving and timeout is None:
            timeout = math.inf  # every wait polls, so that a loss can end it (Engine.limit)
        self._mpi = base
        self._ring = private_ring(base)
        self._ring.describe = identity.describe
        self._ring.read_settings(busy_poll)
        self._busy_poll = busy_poll  # (as given: shrink passes it on)
        if surviving:
            survival.watch(self._ring)
        builders = {name: getattr(self, "_" + name) for name in CATALOGUE}  # _allreduce and the like, below
        self._engine = Engine(self._ring, consistency.make_checker(self._ring, check, timeout), timeout, builders)
        # what the methods call: the engine's `run`, held here too so that a call finds it in one look-up
        self._blocking = self._engine.run
        self._place = (self._ring.rank, self._ring.size)  # what the drop-in's C reading of a call needs
        self._buffers = BufferAPI(self, self._engine)  # the uppercase methods' parse of mpi4py's buffer specs

    @property
    def timeout(self) -> float | None:
        """The default timeout of this communicator's calls, in seconds (None: no limit)."""
        return self._engine.timeout

    @timeout.setter
    def timeout(self, seconds: float | None) -> None:
        self._engine.timeout = math.inf if seconds is None and self._ring.liveness is not None else seconds

    # ---- surviving a lost rank (docs/lost-rank.md; the work is mpiring.survival's) ----

    @property
    def survives(self) -> bool:
        """Whether this communicator survives a lost rank (`survive=True` or MPIRING_SURVIVE=1)."""
        return self._ring.liveness is not None

    def lost(self) -> list[int]:
        """The ranks this rank knows to be lost, in this communicator's numbers (ULFM's
        MPI_Comm_get_failed); always empty without survival."""
        return survival.lost(self._ring.liveness)

    def is_revoked(self) -> bool:
        """Whether this communicator was revoked, here or by a peer (ULFM's MPI_Comm_is_revoked)."""
        return survival.is_revoked(self._ring.liveness)

    def revoke(self) -> None:
        """Revoke the communicator (ULFM's MPI_Comm_revoke; not collective): every rank's call waiting
        on it ends with CommunicatorRevokedError (or RankLostError where a rank is lost), and it takes
        only agree(), shrink() and free() from then on. Needs survival (it travels on its connections)."""
        survival.revoke(self._ring.liveness)

    def agree(self, flag: int = 1) -> int:
        """The bitwise AND of `flag` over the live ranks, the same on every one of them, even when ranks
        are lost before or during it (ULFM's MPI_Comm_agree; collective over the survivors). Works
        on a failed or revoked communicator. Without survival it is an allreduce with BAND."""
        return survival.agree(self._ring, self._mpi, flag)

    def shrink(self) -> Communicator:
        """A new Communicator of the live ranks, in the same order, every survivor agreeing on who
        they are (ULFM's MPI_Comm_shrink; collective over the survivors). A rank lost while it
        runs is left out too. The new communicator has this one's timeout, check, survival and
        busy_poll. Where MPI does not make it within the timeout, CommunicationError.
        Without survival, no rank can be known lost: a new communicator of the same ranks."""
        check = self._engine.check is not None
        timeout = math.inf if self.timeout is None else self.timeout
        liveness = self._ring.liveness
        if liveness is None:
            return type(self)(self._mpi, timeout=timeout, check=check, busy_poll=self._busy_poll)
        self._ring.claim("shrink")
        return survival.shrink(liveness, self._ring.comm, lambda comm: type(self)(
            comm, timeout=timeout, check=check, survive=True, busy_poll=self._busy_poll), timeout)

    def acknowledge_lost(self) -> int:
        """Acknowledge the ranks lost so far (ULFM's MPI_Comm_ack_failed); returns how many."""
        return survival.acknowledge_lost(self._ring.liveness)

    @property
    def rank(self) -> int:
        return self._ring.rank

    @property
    def size(self) -> int:
        return self._ring.size

    @property
    def mpi(self) -> MPI.Intracomm:
        """The mpi4py communicator this one wraps."""
        return self._mpi

    @property
    def traffic(self) -> Traffic:
        """Bytes and messages this communicator has handed to MPI; `traffic.reset()` zeroes them."""
        return self._ring.traffic

    def plan_of(self, collective: str, x: Any = None, out: Any = None, **arguments: Any) -> Schedule | Plan | None:
        """The schedule (host arrays: any of this layout) or plan (device arrays: these very ones) a
        blocking `collective` call with these arrays replays, None if it has none yet: for tools,
        tests and the benchmark (docs/engine.md). `arguments`: the call's op, root, counts and
        algorithm where they are not the defaults (op "sum", root 0 for rooted calls)."""
        return self._engine.plan_of(collective, x, out, **arguments)

    def free(self) -> None:
        """Release the private MPI communicator (collective; a second call does nothing).

        Nonblocking collectives still in flight finish first (each up to its timeout; an error
        stays with its request, whose wait() raises it). Collectives called afterwards raise
        CommunicatorFreedError. The MPI communicator is freed once every peer's farewell has
        come (engine.farewell): free() never waits for it, a later free() or Communicator()
        of the process finishes the job. A rank where a call was abandoned with messages in
        flight (a timeout) keeps its MPI communicator (one context id): MPI may still use them.
        """
        self._engine.free()
        self._blocking = self._engine.run  # the shortcut's memo of its last hit goes too

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.free()

    # ---- the collectives: builders check arguments and return what running the call needs ----

    def _broadcast(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("broadcast", "x", x, backend)
        root = check_root("broadcast", root, self.size)
        out = check_out("broadcast", out, x.shape, x.dtype, backend)
        call = self._engine.call("broadcast", algorithm, timeout, x, None, root)
        body = partial(collectives.broadcast, self._ring, call=call, x=x, root=root, out=out)
        return Built(call, backend, body, plannable(backend, x))

    def _reduce(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("reduce", "x", x, backend)
        op = check_op("reduce", op, x.dtype)
        root = check_root("reduce", root, self.size)
        if self.rank == root:
            out = check_out("reduce", out, x.shape, x.dtype, backend)
        call = self._engine.call("reduce", algorithm, timeout, x, op, root)
        body = partial(collectives.reduce, self._ring, call=call, x=x, op=op, root=root, out=out)
        return Built(call, backend, body, plannable(backend, x))

    def _allreduce(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("allreduce", "x", x, backend)
        op = check_op("allreduce", op, x.dtype)
        out = check_out("allreduce", out, x.shape, x.dtype, backend)
        call = self._engine.call("allreduce", algorithm, timeout, x, op)
        body = partial(collectives.allreduce, self._ring, call=call, x=x, op=op, out=out)
        return Built(call, backend, body, plannable(backend, x))

    def _gather(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("gather", "x", x, backend, split=True)
        root = check_root("gather", root, self.size)
        rows = self._known_rows("gather", x, out if self.rank == root else None, counts, backend)
        call = self._engine.call("gather", algorithm, timeout, x, None, root, rows)
        body = partial(collectives.gather, self._ring, call=call, x=x, root=root, out=out, rows=rows)
        return Built(call, backend, body, rows is not None and plannable(backend, x), rows is None)

    def _allgather(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("allgather", "x", x, backend, split=True)
        rows = self._known_rows("allgather", x, out, counts, backend)
        call = self._engine.call("allgather", algorithm, timeout, x, None, None, rows)
        body = partial(collectives.allgather, self._ring, call=call, x=x, out=out, rows=rows)
        return Built(call, backend, body, rows is not None and plannable(backend, x), rows is None)

    def _known_rows(self, collective: str, x: Any, out: Any, counts: Any, backend: Any) -> list[int] | None:
        """Every rank's row count when `counts=` gives them (the same list on every rank), else
        None: they are exchanged. An out= cannot tell: one rank's rows times the world size may
        equal the total of ragged rows, and a rank that skipped the exchange while the others
        ran it would wait for ever (or, blocking, raise a mismatch)."""
        counts = check_counts(collective, counts, self.size)
        if counts is None:
            return None
        if x.shape[0] != counts[self.rank]:
            raise ArgumentError(collective, "counts", f"gives rank {self.rank} {counts[self.rank]} rows "
                                f"but its x has {x.shape[0]}")
        check_out(collective, out, (sum(counts), *x.shape[1:]), x.dtype, backend)
        return list(counts)

    def _scatter(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        root = check_root("scatter", root, self.size)
        counts = check_counts("scatter", counts, self.size)
        backend = backend_for(out) if out is not None else NUMPY
        root_problem, layout = None, None
        if self.rank == root:
            backend = backend_for(x)
            try:
                x = check_array("scatter", "x", x, backend, split=True)
                if counts is not None and sum(counts) != x.shape[0]:
                    raise ArgumentError("scatter", "counts", f"add up to {sum(counts)} rows but x has {x.shape[0]}")
            except ArgumentError as problem:
                if counts is not None:
                    raise  # no header goes out with counts=: the other ranks time out
                root_problem = problem  # every rank must hear of it in the header, or they would wait for data
            if counts is not None:
                layout = (x.shape, x.dtype)
        elif counts is not None:
            if out is None or not backend.is_array(out) or out.ndim == 0:
                raise ArgumentError("scatter", "out", "must be given on every rank with counts= (it gives the "
                                    "dtype and row shape, which only the root's x has)")
            check_array("scatter", "out", out, backend)  # a dtype it can take, in native byte order
            check_out("scatter", out, out.shape, out.dtype, backend)  # writable
            layout = ((sum(counts), *out.shape[1:]), out.dtype)
        checked = self._engine.checked("scatter", x, out, None, root, counts)
        call = self._engine.call("scatter", algorithm, timeout, *checked)
        body = partial(collectives.scatter, self._ring, call=call, x=x, root=root, out=out, root_problem=root_problem,
                       counts=counts, layout=layout)
        recordable = layout is not None and plannable(backend, x if self.rank == root else None)
        return Built(call, backend, body, recordable, layout is None)

    def _reduce_scatter(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("reduce_scatter", "x", x, backend, split=True)
        op = check_op("reduce_scatter", op, x.dtype)
        counts = check_counts("reduce_scatter", counts, self.size)
        if counts is not None and sum(counts) != x.shape[0]:
            raise ArgumentError("reduce_scatter", "counts", f"add up to {sum(counts)} rows but x has {x.shape[0]}")
        rows = row_bounds(x.shape[0], self.size, counts)
        check_out("reduce_scatter", out, (rows[self.rank + 1] - rows[self.rank], *x.shape[1:]), x.dtype, backend)
        call = self._engine.call("reduce_scatter", algorithm, timeout, x, op, None, counts)
        body = partial(collectives.reduce_scatter, self._ring, call=call, x=x, op=op, out=out, counts=counts)
        return Built(call, backend, body, plannable(backend, x))

    def _barrier(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        call = self._engine.call("barrier", algorithm, timeout)
        return Built(call, NUMPY, partial(collectives.barrier, self._ring, call=call), True)

    def _alltoall(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("alltoall", "x", x, backend, split=True)
        if x.shape[0] % self.size:
            raise ArgumentError("alltoall", "x", f"has {x.shape[0]} rows, not a multiple of the {self.size} ranks "
                                "(every rank gets an equal block; alltoallv takes uneven ones)")
        out = check_out("alltoall", out, x.shape, x.dtype, backend)
        call = self._engine.call("alltoall", algorithm, timeout, x)
        body = partial(collectives.alltoall, self._ring, call=call, x=x, out=out)
        return Built(call, backend, body, plannable(backend, x))

    def _alltoallv(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        send_counts, recv_counts = counts  # as counts_pair made them
        backend = backend_for(x)
        x = check_array("alltoallv", "x", x, backend, split=True)
        send_counts = check_counts("alltoallv", send_counts, self.size, "send_counts")
        if send_counts is None or sum(send_counts) != x.shape[0]:
            have = "are missing" if send_counts is None else f"add up to {sum(send_counts)} rows"
            raise ArgumentError("alltoallv", "send_counts", f"{have}, but x has {x.shape[0]}")
        recv_counts = check_counts("alltoallv", recv_counts, self.size, "recv_counts")
        if recv_counts is not None:  # else out= is checked in the count exchange, on every rank alike
            out = check_out("alltoallv", out, (sum(recv_counts), *x.shape[1:]), x.dtype, backend)
        call = self._engine.call("alltoallv", algorithm, timeout, x)
        body = partial(collectives.alltoallv, self._ring, call=call, x=x, out=out, send_counts=send_counts,
                       recv_counts=recv_counts)
        return Built(call, backend, body, recv_counts is not None and plannable(backend, x), recv_counts is None)

    def _scan(self, x, out, op, root, counts, algorithm, timeout, collective: str = "scan") -> Built:
        backend = backend_for(x)
        x = check_array(collective, "x", x, backend)
        op = check_op(collective, op, x.dtype)
        exclusive = collective == "exscan"
        if not (exclusive and self.rank == 0):  # exscan's rank 0 has no result: its out= is ignored
            out = check_out(collective, out, x.shape, x.dtype, backend)
        call = self._engine.call(collective, algorithm, timeout, x, op)
        body = partial(collectives.scan, self._ring, call=call, x=x, op=op, out=out, exclusive=exclusive)
        return Built(call, backend, body, plannable(backend, x))

    def _exscan(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        return self._scan(x, out, op, root, counts, algorithm, timeout, "exscan")

    # ---- blocking ----

    def broadcast(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> Any:
        """Every rank gets root's `x`. Every rank passes an array of root's shape and dtype."""
        return self._blocking("broadcast", x, out, None, root, None, algorithm, timeout)

    def reduce(self, x: Any, op: str = SUM, root: int = 0, *, out: Any = None, algorithm: str | None = None,
               timeout: float | None = None) -> Any:
        """The root gets the elementwise reduction of every rank's `x`; other ranks get None."""
        return self._blocking("reduce", x, out, op, root, None, algorithm, timeout)

    def allreduce(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> Any:
        """Every rank gets the elementwise reduction of every rank's `x` (bitwise the same)."""
        return self._blocking("allreduce", x, out, op, None, None, algorithm, timeout)

    def gather(self, x: Any, root: int = 0, *, out: Any = None, counts: Any = None, algorithm: str | None = None,
               timeout: float | None = None) -> Any:
        """The root gets every rank's `x` concatenated along axis 0 in rank order; others get None.

        Ranks may pass different numbers of rows; the other dimensions and the dtype must agree.
        `counts=` (every rank's rows, the same list on every rank) saves the exchange of row counts.
        """
        return self._blocking("gather", x, out, None, root, counts_key(counts), algorithm, timeout)

    def allgather(self, x: Any, *, out: Any = None, counts: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> Any:
        """Every rank gets every rank's `x` concatenated along axis 0 in rank order.

        Ranks may pass different numbers of rows. `counts=` (every rank's rows, the same on every
        rank) saves the exchange of row counts.
        """
        return self._blocking("allgather", x, out, None, None, counts_key(counts), algorithm, timeout)

    def scatter(self, x: Any = None, root: int = 0, *, out: Any = None, counts: Any = None,
                algorithm: str | None = None, timeout: float | None = None) -> Any:
        """Root's `x` is split along axis 0 as numpy.array_split does; rank r gets part r.

        Non-root ranks pass None (anything they pass is ignored). With `counts=` (the rows of
        each part, the same on every rank) rank r gets counts[r] rows, and every rank passes
        `out=`; the call then skips the header the root otherwise sends first.
        """
        x = x if root == self.rank else None  # ignored off the root: kept out of the plan's key
        return self._blocking("scatter", x, out, None, root, counts_key(counts), algorithm, timeout)

    def reduce_scatter(self, x: Any, op: str = SUM, *, out: Any = None, counts: Any = None,
                       algorithm: str | None = None, timeout: float | None = None) -> Any:
        """`x` is split along axis 0 into size parts; rank r gets part r reduced over all ranks.

        The parts are cut as numpy.array_split does, or with `counts=` (every rank's rows, the
        same list on every rank, adding up to x's rows) rank r gets counts[r] rows, as in MPI's
        Reduce_scatter with recvcounts.
        """
        return self._blocking("reduce_scatter", x, out, op, None, counts_key(counts), algorithm, timeout)

    def barrier(self, *, algorithm: str | None = None, timeout: float | None = None) -> None:
        """Return only once every rank has entered the barrier."""
        self._blocking("barrier", None, None, None, None, None, algorithm, timeout)

    def alltoall(self, x: Any, *, out: Any = None, algorithm: str | None = None,
                 timeout: float | None = None) -> Any:
        """`x` is cut along axis 0 into size equal blocks (its rows must be a multiple of size);
        block j goes to rank j. Row block i of the result (x's shape and dtype) came from rank i."""
        return self._blocking("alltoall", x, out, None, None, None, algorithm, timeout)

    def alltoallv(self, x: Any, send_counts: Any, recv_counts: Any = None, *, out: Any = None,
                  algorithm: str | None = None, timeout: float | None = None) -> Any:
        """The first send_counts[0] rows of `x` go to rank 0, the next send_counts[1] to rank 1, ...;
        the result holds recv_counts[i] rows from each rank i, in rank order.

        Without `recv_counts` the ranks first exchange their counts (every rank checks them all);
        with them, they must match what each peer sends (a mismatch is a CommunicationError).
        """
        return self._blocking("alltoallv", x, out, None, None, counts_pair(send_counts, recv_counts), algorithm,
                              timeout)

    def scan(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
             timeout: float | None = None) -> Any:
        """Inclusive prefix reduction: rank r gets `x` of ranks 0..r reduced elementwise, in rank
        order (avg: their mean)."""
        return self._blocking("scan", x, out, op, None, None, algorithm, timeout)

    def exscan(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
               timeout: float | None = None) -> Any:
        """Exclusive prefix reduction: rank r gets `x` of ranks 0..r-1 reduced elementwise. MPI
        leaves rank 0's result undefined; here rank 0 gets None (as mpi4py's lowercase exscan)
        and its out= is left untouched."""
        return self._blocking("exscan", x, out, op, None, None, algorithm, timeout)


# ---- nonblocking and persistent: generated from the blocking methods, one per collective ----

# What each variant says beyond "Nonblocking `name`." / "Persistent `name`.".
_VARIANT_NOTES = {
    "ibarrier": "wait() returns once every rank has entered.",
    "iexscan": "Rank 0's wait() returns None.",
    "broadcast_init": "Each start() broadcasts root's contents of `x` at that time.",
    "allreduce_init": "`req = comm.allreduce_init(x, out=y)`, then `req.start()` and `req.wait()` per use, "
                      "with new contents in `x` each time.",
    "alltoallv_init": "Give `recv_counts` to have it planned (without them every start() exchanges the "
                      "counts first).",
}
entry_points.add_variants(Communicator, CATALOGUE, _VARIANT_NOTES)

add_uppercase(Communicator)  # mpi4py's uppercase methods: forwards to the communicator's BufferAPI
