"""The public face of mpiring: `Communicator`, one method per collective.

Each method checks its arguments (raising before any message moves), then drives the
collective's generator of ring steps to the end. Names follow mpi4py's lowercase API.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from mpiring import collectives
from mpiring.backend import NUMPY, backend_for
from mpiring.errors import ArgumentError
from mpiring.ops import SUM
from mpiring.ring import Ring, Traffic, run_to_end
from mpiring.validation import check_algorithm, check_array, check_op, check_out, check_root


class Communicator:
    """Ring collectives over an mpi4py intracommunicator (COMM_WORLD by default).

    Creating one is collective: every rank of `comm` must do it. mpiring's messages travel on
    a private duplicate of `comm`, so they never mix with the caller's own messages.
    """

    def __init__(self, comm: MPI.Intracomm | None = None) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm) or base == MPI.COMM_NULL:
            raise ArgumentError("Communicator", "comm", f"must be an mpi4py intracommunicator, got {base!r}")
        self._mpi = base
        self._ring = Ring(base.Dup())

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
        """Release the private MPI communicator (collective). The object is unusable afterwards."""
        self._ring.comm.Free()

    def _run(self, collective: str, steps: Any) -> Any:
        return run_to_end(self._ring, steps, collective)

    def broadcast(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None) -> Any:
        """Every rank gets root's `x`. Every rank passes an array of root's shape and dtype."""
        backend = backend_for(x)
        x = check_array("broadcast", "x", x, backend)
        root = check_root("broadcast", root, self.size)
        algorithm = check_algorithm("broadcast", algorithm)
        out = check_out("broadcast", out, x.shape, x.dtype, backend)
        return self._run(
            "broadcast",
            collectives.broadcast(self._ring, backend, self._ring.next_tag(), algorithm, x, root, out),
        )

    def reduce(
        self, x: Any, op: str = SUM, root: int = 0, *, out: Any = None, algorithm: str | None = None
    ) -> Any:
        """The root gets the elementwise reduction of every rank's `x`; other ranks get None."""
        backend = backend_for(x)
        x = check_array("reduce", "x", x, backend)
        op = check_op("reduce", op, x.dtype)
        root = check_root("reduce", root, self.size)
        algorithm = check_algorithm("reduce", algorithm)
        if self.rank == root:
            out = check_out("reduce", out, x.shape, x.dtype, backend)
        return self._run(
            "reduce",
            collectives.reduce(self._ring, backend, self._ring.next_tag(), algorithm, x, op, root, out),
        )

    def allreduce(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None) -> Any:
        """Every rank gets the elementwise reduction of every rank's `x` (bitwise the same)."""
        backend = backend_for(x)
        x = check_array("allreduce", "x", x, backend)
        op = check_op("allreduce", op, x.dtype)
        algorithm = check_algorithm("allreduce", algorithm)
        out = check_out("allreduce", out, x.shape, x.dtype, backend)
        return self._run(
            "allreduce",
            collectives.allreduce(self._ring, backend, self._ring.next_tag(), algorithm, x, op, out),
        )

    def gather(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None) -> Any:
        """The root gets every rank's `x` concatenated along axis 0 in rank order; others get None.

        Ranks may pass different numbers of rows; the other dimensions and the dtype must agree.
        """
        backend = backend_for(x)
        x = check_array("gather", "x", x, backend, split=True)
        root = check_root("gather", root, self.size)
        algorithm = check_algorithm("gather", algorithm)
        return self._run(
            "gather",
            collectives.gather(self._ring, backend, self._ring.next_tag(), algorithm, x, root, out),
        )

    def allgather(self, x: Any, *, out: Any = None, algorithm: str | None = None) -> Any:
        """Every rank gets every rank's `x` concatenated along axis 0 in rank order."""
        backend = backend_for(x)
        x = check_array("allgather", "x", x, backend, split=True)
        algorithm = check_algorithm("allgather", algorithm)
        return self._run(
            "allgather",
            collectives.allgather(self._ring, backend, self._ring.next_tag(), algorithm, x, out),
        )

    def scatter(self, x: Any = None, root: int = 0, *, out: Any = None, algorithm: str | None = None) -> Any:
        """Root's `x` is split along axis 0 as numpy.array_split does; rank r gets part r.

        Non-root ranks pass None (anything they pass is ignored).
        """
        root = check_root("scatter", root, self.size)
        algorithm = check_algorithm("scatter", algorithm)
        backend = backend_for(out) if out is not None else NUMPY
        root_problem = None
        if self.rank == root:
            backend = backend_for(x)
            try:
                x = check_array("scatter", "x", x, backend, split=True)
            except ArgumentError as problem:
                root_problem = problem  # every rank must hear of it, or they would wait for data
        return self._run(
            "scatter",
            collectives.scatter(
                self._ring, backend, self._ring.next_tag(), algorithm, x, root, out, root_problem
            ),
        )

    def reduce_scatter(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None) -> Any:
        """`x` is split along axis 0 into size parts; rank r gets part r reduced over all ranks."""
        backend = backend_for(x)
        x = check_array("reduce_scatter", "x", x, backend, split=True)
        op = check_op("reduce_scatter", op, x.dtype)
        algorithm = check_algorithm("reduce_scatter", algorithm)
        return self._run(
            "reduce_scatter",
            collectives.reduce_scatter(self._ring, backend, self._ring.next_tag(), algorithm, x, op, out),
        )

    def barrier(self, *, algorithm: str | None = None) -> None:
        """Return only once every rank has entered the barrier."""
        algorithm = check_algorithm("barrier", algorithm)
        self._run("barrier", collectives.barrier(self._ring, self._ring.next_tag(), algorithm))
