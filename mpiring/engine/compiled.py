"""The compiled replay: a plan's exchanges run in C (mpiring/engine/_replay.c) when the extension
was built at install time (it needs a C compiler and Python's headers, no MPI headers).

    executor.run_plan, run_exchanges ──► Program.run(first, started, spin) ──► None: every exchange done
                                                                          └──► (exchange, why, code): Python
                                                                               carries on from there
    a step started on its own (Plan) ──► Program.start(index)
    a blocking call with a cached plan ──► Shortcut: the Python hit path's checks and counts, then the
                                           same run, without entering Python (`shortcut`, below)

It changes where the loop runs, not what it does: the same persistent requests (and the same
sends made anew each run, where Ring.persistent_sends is off), waited for in the same order,
the same byte counts checked, the same recorded work called (plain copies and float32/float64
sums done in C, with the same IEEE additions as NumPy's). A wait longer than
`spin`, a wrong byte count or an MPI error goes back to Python (waiting.poll, check_sizes,
mpi_error), so timeouts, mismatch detection and error messages stay in one place. Without the
extension, or with MPIRING_COMPILED=0, plans replay in Python (executor.run_exchanges).
"""

from __future__ import annotations

import ctypes
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from mpiring import environment

try:
    from mpiring.engine import _replay
except ImportError:  # not built (no compiler at install time): plans replay in Python
    _replay = None

# Program.run's reasons for stopping, and the kinds of work it does itself (_replay.c)
STOPPED_WAITING, STOPPED_SIZE, STOPPED_ERROR = 0, 1, 2
_COPY = 1
_ADD = {np.dtype(np.float32): 2, np.dtype(np.float64): 3}

_bound: bool | None = None  # None: not tried yet
_INT_MAX = 2**31 - 1


def available() -> bool:
    """Whether the extension was built and can reach the MPI library."""
    return _replay is not None and _bind()


def enabled() -> bool:
    """Whether new plans replay in C: the extension is there and MPIRING_COMPILED is not 0."""
    return environment.flag("MPIRING_COMPILED", "plan") is not False and available()


def describe() -> str:
    """Where plans replay, in words (`mpiring info`)."""
    if _replay is None:
        return "in Python (the C replay was not built: no C compiler or Python headers at install)"
    if not enabled():
        return "in Python (MPIRING_COMPILED=0)"
    return "in C (mpiring.engine._replay)"


def _bind() -> bool:
    """Hand the extension the MPI functions of the library mpi4py loaded, and its handle sizes
    (once; False, and plans replay in Python, where they cannot be found). dlsym on mpi4py's
    own module finds them, since it searches the libraries that module links."""
    global _bound
    if _bound is None:
        try:
            library = ctypes.CDLL(MPI.__file__)

            def address(name: str) -> int:
                return ctypes.cast(getattr(library, name), ctypes.c_void_p).value

            if MPI._sizeof(MPI.Comm) != MPI._sizeof(MPI.Datatype):  # _replay.c passes both as one kind
                raise ValueError("communicator and datatype handles differ in size")
            _replay.bind(address("MPI_Startall"), address("MPI_Testall"), address("MPI_Waitall"),
                         address("MPI_Get_count"), address("MPI_Isend"), MPI._sizeof(MPI.Request),
                         MPI._sizeof(MPI.Status), MPI._sizeof(MPI.Datatype), MPI._handleof(MPI.BYTE))
            _bound = True
        except (OSError, AttributeError, ValueError, TypeError):  # an MPI this was not made for
            _bound = False
    return _bound


def program(prologue: tuple, exchanges: tuple | None, busy: bool = False) -> Any:
    """The C form of a plan's prologue and exchanges (plan.fuse), or None where plans replay in
    Python; `busy`: its waits test without offering the core in between (Ring.busy_poll)."""
    if exchanges is None or not enabled():
        return None
    size = MPI._sizeof(MPI.Request)
    specs, comms = [], set()
    for step, requests, statuses, _, after, during in exchanges:
        checks = tuple((index, expected) for index, expected, _ in step.receives)
        if any(expected > _INT_MAX for _, expected in checks):  # MPI_Get_count's int: Python says why
            return None
        fresh = []
        for index, message, dest, tag, comm in step.fresh_sends:
            buf = message[0]
            if not (type(buf) is np.ndarray and message[1] == MPI.BYTE and buf.nbytes <= _INT_MAX):
                return None  # host memory with MPI_Isend's int count (device or larger sends stay with mpi4py)
            fresh.append((index, buf.ctypes.data, buf.nbytes, dest, tag, MPI._addressof(requests[index])))
            comms.add(MPI._handleof(comm))
        handles = b"".join(ctypes.string_at(MPI._addressof(request), size) for request in requests)
        status_objects = tuple(map(MPI._addressof, statuses)) if statuses else (None,) * len(requests)
        specs.append((handles, status_objects, checks, tuple(map(_work, after)), tuple(fresh),
                      tuple(map(_work, during))))
    if len(comms) > 1:
        return None
    return _replay.Program(tuple(map(_work, prologue)), tuple(specs), comms.pop() if comms else 0, busy)


def shortcut(cache: Any, ring: Any, communicator: Any, plan_type: type, host: Any, in_python: Any,
             after: Any, yield_seconds: float) -> Any:
    """A blocking call that takes a cached compiled plan without running Python (`Shortcut` in
    _replay.c), and otherwise calls `in_python` with the same arguments; `in_python` itself where
    the extension was not built or cannot reach the MPI library."""
    if not available():
        return in_python
    return _replay.Shortcut(cache, ring, communicator, plan_type, host, in_python, after, yield_seconds)


def persistent_shortcut(request: Any, communicator: Any, ring: Any, plan: Any, spin: float) -> tuple | None:
    """A persistent request's start() and wait() in C (`PersistentShortcut` in _replay.c), each
    handing what it does not take to the request's own method; None where the extension was not
    built or the plan is not compiled."""
    if not available() or plan.compiled is None:
        return None
    shortcut = _replay.PersistentShortcut(request, communicator, ring, plan, spin)
    return shortcut.start, shortcut.wait


def start(program: Any, index: int) -> None:
    """Start exchange `index` of a program, for Python to wait for: how a compiled plan's steps
    start (cheaper than mpi4py's Startall of a list; sends made anew keep their handles in the
    program, which copies them to the steps' MPI.Request objects)."""
    code = program.start(index)
    if code:
        raise MPI.Exception(code)


def _work(work: Any) -> Any:
    """Recorded work as _replay.c takes it: a plain copy or float sum of C-contiguous arrays as
    (kind, out, a, b, bytes, work), done there without calling NumPy; anything else as it is.
    An output that overlaps an input other than exactly would make C's loop differ from NumPy's
    (which buffers): that stays a call."""
    if not isinstance(work, partial) or not work.args or not all(isinstance(a, np.ndarray) and a.flags.c_contiguous
                                                for a in (*work.args, *work.keywords.values())):
        return work
    # a read-only output stays a call, so NumPy refuses it as it would have
    if not (work.args[0] if work.func is np.copyto else work.keywords.get("out", work.args[0])).flags.writeable:
        return work
    if work.func is np.copyto and len(work.args) == 2 and not work.keywords:
        out, a = work.args
        if out.dtype == a.dtype and out.shape == a.shape and _apart_or_same(out, a):
            return (_COPY, out.ctypes.data, a.ctypes.data, None, out.nbytes, work)
    if work.func is np.add and len(work.args) == 2 and list(work.keywords) == ["out"]:
        (a, b), out = work.args, work.keywords["out"]
        kind = _ADD.get(out.dtype)
        if (kind is not None and a.dtype == b.dtype == out.dtype and a.shape == b.shape == out.shape
                and _apart_or_same(out, a) and _apart_or_same(out, b)):
            return (kind, out.ctypes.data, a.ctypes.data, b.ctypes.data, out.nbytes, work)
    return work


def _apart_or_same(out: np.ndarray, a: np.ndarray) -> bool:
    return out.ctypes.data == a.ctypes.data or not np.shares_memory(out, a)
