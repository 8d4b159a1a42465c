"""The public face of mpiring: `Communicator`, one method per collective, blocking and
nonblocking (the `i` prefix, as in MPI).

Each method checks its arguments (raising before any message moves), then drives the
collective's generator of ring steps: to the end for a blocking call, or step by step from
the returned request's test()/wait(). Names follow mpi4py's lowercase API.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from mpiring import collectives, consistency
from mpiring.backend import NUMPY, backend_for
from mpiring.errors import ArgumentError, CommunicationError, CommunicatorBrokenError, CommunicatorFreedError
from mpiring.launch import check_world_size
from mpiring.ops import SUM
from mpiring.ring import Call, CollectiveRequest, Ring, Steps, Traffic, run_to_end
from mpiring.selection import read_environment
from mpiring.validation import check_algorithm, check_array, check_op, check_out, check_root, check_timeout


class Communicator:
    """Ring collectives over an mpi4py intracommunicator (COMM_WORLD by default).

    Creating one is collective: every rank of `comm` must do it. mpiring's messages travel on
    a private duplicate of `comm`, so they never mix with the caller's own messages.

    `timeout` (seconds; default from the MPIRING_TIMEOUT environment variable, else none) bounds
    how long any collective of this communicator waits for a step before raising
    `CollectiveTimeout`; each call may override it with its own `timeout=`.

    `check` (default from the MPIRING_CHECK environment variable, else off) makes every
    collective first compare a fingerprint of its call across the ranks and raise
    `CollectiveMismatchError` on every rank where they differ (see mpiring.consistency).
    """

    def __init__(self, comm: MPI.Intracomm | None = None, *, timeout: float | None = None,
                 check: bool | None = None) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm) or base == MPI.COMM_NULL:
            raise ArgumentError("Communicator", "comm", f"must be an mpi4py intracommunicator, got {base!r}")
        if comm is None:  # a launcher that started N processes but not one N-rank job: say so now
            check_world_size(base.Get_size())
        read_environment()
        if timeout is None and os.environ.get("MPIRING_TIMEOUT"):
            timeout = _env_timeout()
        self.timeout = check_timeout("Communicator", timeout)
        self._mpi = base
        self._freed = False
        try:
            private = base.Dup()
        except MPI.Exception as error:  # most often: every context id in use
            raise CommunicationError(
                "Communicator", f"MPI could not make a communicator ({_last_line(error.Get_error_string())}); "
                "if the program makes many, free() each one it no longer needs, or use "
                "`with mpiring.Communicator() as comm:`",
            ) from error
        self._ring = Ring(private)
        self._ring.node_local = _all_on_one_node(self._ring.comm)
        self._check = consistency.make_checker(self._ring, check, self.timeout)

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

    def free(self) -> None:
        """Release the private MPI communicator (collective; a second call does nothing).

        Collectives called afterwards raise CommunicatorFreedError.
        """
        if not self._freed:
            self._freed = True
            self._ring.comm.Free()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.free()

    # ---- plumbing: every public method is one of these two around a builder below ----

    def _call(self, collective: str, algorithm: Any, timeout: Any, x: Any = None, op: Any = None,
              root: Any = None) -> Call:
        if self._freed:
            raise CommunicatorFreedError(collective)
        if self._ring.broken is not None:
            raise CommunicatorBrokenError(collective, self._ring.broken)
        algorithm = check_algorithm(collective, algorithm)
        timeout = self.timeout if timeout is None else check_timeout(collective, timeout)
        call = Call(collective, algorithm, self._ring.next_tag(), timeout)
        if self._check is not None:  # MPIRING_CHECK: the ranks compare x, op and root first
            self._check.compare(call, x, op, root)  # its exchange, like every call, breaks the ring on failure
        return call

    def _build(self, builder: Callable[..., tuple[Call, Steps]], *args: Any) -> tuple[Call, Steps]:
        """Run a builder. A call that raises before it took its sequence number (a bad argument
        on some ranks only) takes it anyway, so every rank's next call has the same number and
        no message of this call can ever be matched by the next one. Only the communicator's
        own thread may call (Ring.claim)."""
        self._ring.claim(builder.__name__)
        taken = self._ring.calls
        try:
            return builder(*args)
        except BaseException:
            if self._ring.calls == taken:
                self._ring.next_tag()
            raise

    def _wait(self, builder: Callable[..., tuple[Call, Steps]], *args: Any) -> Any:
        call, steps = self._build(builder, *args)
        return run_to_end(self._ring, steps, call)

    def _start(self, builder: Callable[..., tuple[Call, Steps]], *args: Any) -> CollectiveRequest:
        call, steps = self._build(builder, *args)
        return CollectiveRequest(self._ring, steps, call)

    # ---- the collectives: builders check arguments and return (call, steps) ----

    def _broadcast(self, x, root, out, algorithm, timeout) -> tuple[Call, Steps]:
        backend = backend_for(x)
        x = check_array("broadcast", "x", x, backend)
        root = check_root("broadcast", root, self.size)
        out = check_out("broadcast", out, x.shape, x.dtype, backend)
        call = self._call("broadcast", algorithm, timeout, x, None, root)
        return call, collectives.broadcast(self._ring, backend, call, x, root, out)

    def _reduce(self, x, op, root, out, algorithm, timeout) -> tuple[Call, Steps]:
        backend = backend_for(x)
        x = check_array("reduce", "x", x, backend)
        op = check_op("reduce", op, x.dtype)
        root = check_root("reduce", root, self.size)
        if self.rank == root:
            out = check_out("reduce", out, x.shape, x.dtype, backend)
        call = self._call("reduce", algorithm, timeout, x, op, root)
        return call, collectives.reduce(self._ring, backend, call, x, op, root, out)

    def _allreduce(self, x, op, out, algorithm, timeout) -> tuple[Call, Steps]:
        backend = backend_for(x)
        x = check_array("allreduce", "x", x, backend)
        op = check_op("allreduce", op, x.dtype)
        out = check_out("allreduce", out, x.shape, x.dtype, backend)
        call = self._call("allreduce", algorithm, timeout, x, op)
        return call, collectives.allreduce(self._ring, backend, call, x, op, out)

    def _gather(self, x, root, out, algorithm, timeout) -> tuple[Call, Steps]:
        backend = backend_for(x)
        x = check_array("gather", "x", x, backend, split=True)
        root = check_root("gather", root, self.size)
        call = self._call("gather", algorithm, timeout, x, None, root)
        return call, collectives.gather(self._ring, backend, call, x, root, out)

    def _allgather(self, x, out, algorithm, timeout) -> tuple[Call, Steps]:
        backend = backend_for(x)
        x = check_array("allgather", "x", x, backend, split=True)
        call = self._call("allgather", algorithm, timeout, x)
        return call, collectives.allgather(self._ring, backend, call, x, out)

    def _scatter(self, x, root, out, algorithm, timeout) -> tuple[Call, Steps]:
        root = check_root("scatter", root, self.size)
        backend = backend_for(out) if out is not None else NUMPY
        root_problem = None
        if self.rank == root:
            backend = backend_for(x)
            try:
                x = check_array("scatter", "x", x, backend, split=True)
            except ArgumentError as problem:
                root_problem = problem  # every rank must hear of it, or they would wait for data
        call = self._call("scatter", algorithm, timeout, None, None, root)
        return call, collectives.scatter(self._ring, backend, call, x, root, out, root_problem)

    def _reduce_scatter(self, x, op, out, algorithm, timeout) -> tuple[Call, Steps]:
        backend = backend_for(x)
        x = check_array("reduce_scatter", "x", x, backend, split=True)
        op = check_op("reduce_scatter", op, x.dtype)
        call = self._call("reduce_scatter", algorithm, timeout, x, op)
        return call, collectives.reduce_scatter(self._ring, backend, call, x, op, out)

    def _barrier(self, algorithm, timeout) -> tuple[Call, Steps]:
        call = self._call("barrier", algorithm, timeout)
        return call, collectives.barrier(self._ring, call)

    # ---- blocking ----

    def broadcast(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> Any:
        """Every rank gets root's `x`. Every rank passes an array of root's shape and dtype."""
        return self._wait(self._broadcast, x, root, out, algorithm, timeout)

    def reduce(self, x: Any, op: str = SUM, root: int = 0, *, out: Any = None, algorithm: str | None = None,
               timeout: float | None = None) -> Any:
        """The root gets the elementwise reduction of every rank's `x`; other ranks get None."""
        return self._wait(self._reduce, x, op, root, out, algorithm, timeout)

    def allreduce(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> Any:
        """Every rank gets the elementwise reduction of every rank's `x` (bitwise the same)."""
        return self._wait(self._allreduce, x, op, out, algorithm, timeout)

    def gather(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None,
               timeout: float | None = None) -> Any:
        """The root gets every rank's `x` concatenated along axis 0 in rank order; others get None.

        Ranks may pass different numbers of rows; the other dimensions and the dtype must agree.
        """
        return self._wait(self._gather, x, root, out, algorithm, timeout)

    def allgather(self, x: Any, *, out: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> Any:
        """Every rank gets every rank's `x` concatenated along axis 0 in rank order."""
        return self._wait(self._allgather, x, out, algorithm, timeout)

    def scatter(self, x: Any = None, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                timeout: float | None = None) -> Any:
        """Root's `x` is split along axis 0 as numpy.array_split does; rank r gets part r.

        Non-root ranks pass None (anything they pass is ignored).
        """
        return self._wait(self._scatter, x, root, out, algorithm, timeout)

    def reduce_scatter(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                       timeout: float | None = None) -> Any:
        """`x` is split along axis 0 into size parts; rank r gets part r reduced over all ranks."""
        return self._wait(self._reduce_scatter, x, op, out, algorithm, timeout)

    def barrier(self, *, algorithm: str | None = None, timeout: float | None = None) -> None:
        """Return only once every rank has entered the barrier."""
        self._wait(self._barrier, algorithm, timeout)

    # ---- nonblocking: same arguments, return a request; wait() returns the result ----

    def ibroadcast(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                   timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `broadcast`."""
        return self._start(self._broadcast, x, root, out, algorithm, timeout)

    def ireduce(self, x: Any, op: str = SUM, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `reduce`."""
        return self._start(self._reduce, x, op, root, out, algorithm, timeout)

    def iallreduce(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                   timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `allreduce`."""
        return self._start(self._allreduce, x, op, out, algorithm, timeout)

    def igather(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `gather`."""
        return self._start(self._gather, x, root, out, algorithm, timeout)

    def iallgather(self, x: Any, *, out: Any = None, algorithm: str | None = None,
                   timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `allgather`."""
        return self._start(self._allgather, x, out, algorithm, timeout)

    def iscatter(self, x: Any = None, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                 timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `scatter`."""
        return self._start(self._scatter, x, root, out, algorithm, timeout)

    def ireduce_scatter(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                        timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `reduce_scatter`."""
        return self._start(self._reduce_scatter, x, op, out, algorithm, timeout)

    def ibarrier(self, *, algorithm: str | None = None, timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `barrier`: wait() returns once every rank has entered."""
        return self._start(self._barrier, algorithm, timeout)


def _env_timeout() -> float:
    text = os.environ["MPIRING_TIMEOUT"]
    try:
        return float(text)
    except ValueError:
        raise ArgumentError("Communicator", "MPIRING_TIMEOUT", f"must be a number of seconds, got {text!r}") from None


def _all_on_one_node(comm: MPI.Intracomm) -> bool:
    """Collective: whether every rank of `comm` shares one node (and so may use CUDA IPC)."""
    if comm.Get_size() == 1:
        return True
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return shared.Get_size() == comm.Get_size()
    finally:
        shared.Free()


def _last_line(text: str) -> str:
    """The most specific part of an MPI error stack (MPICH puts it last, after the call chain)."""
    line = text.strip().splitlines()[-1]
    return line.split(": ", 1)[-1].strip() if ": " in line else line
