"""The C replay (mpiring/engine/replay_c/), from Python: binding the MPI library, making
Programs from schedules and plans as plain data, and the Shortcut that takes a cached blocking
call without entering Python (`shortcut`, below).

A Program changes where the loop runs, not what it does: the same messages posted in the same
order, waited for the same way, the same byte counts checked, the same work done (copies and
arithmetic in C exactly as NumPy does them, the rest as calls). A wait longer than `spin`, a
wrong byte count or an MPI error goes back to Python (waiting.poll, check_sizes, mpi_error), so
timeouts, mismatch detection and error messages stay in one place. Without the extension, or
with MPIRING_COMPILED=0, everything runs in Python (schedule.py, run.py), from the same
recorded data: `work_in_python` does a C work item's arithmetic in NumPy.
"""

from __future__ import annotations

import array
import ctypes
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from mpiring import environment
from mpiring.engine import state
from mpiring.errors import CollectiveTimeout, CommunicationError
from mpiring.ops import AVG, BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MIN, PROD, SUM, UFUNC_NAMES

try:
    from mpiring.engine import _replay
except ImportError:  # not built (no compiler at install time): everything replays in Python
    _replay = None

# A communicator's hot state and its traffic's fields: C fields where the extension was built,
# which the C paths below read directly; else the same fields in Python (mpiring.engine.state).
HotState: Any = state.HotState if _replay is None else _replay.HotState
Counters: Any = state.Counters if _replay is None else _replay.Counters
RequestFields: Any = state.RequestFields if _replay is None else _replay.RequestFields
CallFields: Any = state.CallFields if _replay is None else _replay.CallFields

# Program.run's reasons for stopping
STOPPED_WAITING, STOPPED_SIZE, STOPPED_ERROR, STOPPED_CHANGED, STOPPED_NOTICE = 0, 1, 2, 3, 4
# kinds of work a Program does itself (WORK_CALL is any callable)
WORK_COPY, WORK_OP, WORK_DIVIDE, WORK_EXPECT = 1, 2, 3, 4


class LayoutChanged(Exception):
    """The layout a schedule's first exchanges brought is not the one it was recorded for (its
    WORK_EXPECT): the Python replay raises this where the C one stops with STOPPED_CHANGED."""
RESULT_CODES = {"none": 0, "out": 1, "x": 2}
_INT_MAX = 2**31 - 1
_NOWHERE = (-1, 0)

# dtype and op codes, as replay_c/replay.h numbers them
DTYPE_CODES = {np.dtype(name): code for code, name in enumerate(
    ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64",
     "complex64", "complex128"))}
OP_CODES = {op: code for code, op in enumerate((SUM, PROD, MIN, MAX, BAND, BOR, BXOR, LAND, LOR, LXOR))}
OP_CODES[AVG] = OP_CODES[SUM]  # avg sums; its division is separate work
_OP_NAMES = {code: op for op, code in OP_CODES.items() if op != AVG}
_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def itemsize(dtype_code: int) -> int:
    """The bytes of one element of a work spec's dtype."""
    return _DTYPES[dtype_code].itemsize


def exact_in_c(op_code: int, dtype_code: int) -> bool:
    """Whether the C replay does this op on this dtype with NumPy's exact results (op_supported in
    replay_c/work.c): every op on bool and integers; sum and product on float32/float64; sum on
    complex. Float min and max (NaN and signed zeros), complex products and float16 stay with NumPy."""
    kind = _DTYPES[dtype_code].kind
    if kind == "f":
        return op_code in (OP_CODES[SUM], OP_CODES[PROD])
    if kind == "c":
        return op_code == OP_CODES[SUM]
    return True


_bound: bool | None = None  # None: not tried yet


def available() -> bool:
    """Whether the extension was built and can reach the MPI library."""
    return _replay is not None and _bind()


def enabled() -> bool:
    """Whether new schedules and plans replay in C: the extension is there and MPIRING_COMPILED is not 0."""
    return environment.flag("MPIRING_COMPILED", "plan") is not False and available()


def spec_items(datatypes: dict, dtypes: frozenset, byte_buffers: dict) -> Callable[[Any, int], Any] | None:
    """The C form of the first look of mpiring.buffer_specs.simple (the common forms of a buffer
    spec, else None), reading these tables; None where the extension is not there."""
    if not available():
        return None
    _replay.spec_tables(datatypes, dtypes, byte_buffers, np.frombuffer, array_at)
    return _replay.spec_items


def array_at(address: int, nbytes: int, dtype: Any, count: int, readonly: bool) -> Any:
    """An array of `count` elements of `dtype` (-1: as many as `nbytes` hold; None: bytes) at a
    byte buffer's address, holding no export of it: the arrays a blocking drop-in call borrows
    (replay_c/specs.c, borrowed_bytes). None where the buffer is too short or not whole elements."""
    dtype = _BYTES if dtype is None else dtype
    size = dtype.itemsize
    if count < 0:
        count, rest = divmod(nbytes, size)
        if rest:
            return None
    elif count * size > nbytes:
        return None
    return np.frombuffer(MPI.buffer.fromaddress(address, count * size, readonly), dtype, count)


_BYTES = np.dtype(np.uint8)


def dropin_call(ops: dict, in_place: Any, in_place_alltoall: str) -> Callable[..., Any] | None:
    """The C reading of the drop-in's common calls (mpiring.buffer_api.COMMON_FORMS, asked first by
    Communicator's blocking uppercase methods: `dropin_call(kind, sendbuf, recvbuf, op, root,
    (rank, size), run)` calls `run` with the engine's blocking run's arguments, else returns
    NotImplemented), knowing these ops ({id(op): (op, name)}), MPI.IN_PLACE and the algorithm an
    in-place all-to-all runs; None where the extension is not there."""
    if not available():
        return None
    _replay.dropin_tables(ops, in_place, np.empty, array.array, in_place_alltoall,
                          (CollectiveTimeout, CommunicationError))
    return _replay.dropin_call


def describe() -> str:
    """Where schedules replay, in words (`mpiring info`)."""
    if _replay is None:
        return "in Python (the C replay was not built: no C compiler or Python headers at install)"
    if not enabled():
        return "in Python (MPIRING_COMPILED=0)"
    return "in C (mpiring.engine._replay)"


def _bind() -> bool:
    """Hand the extension the MPI functions of the library mpi4py loaded, and its handle sizes
    (once; False, and everything replays in Python, where they cannot be found). dlsym on mpi4py's
    own module finds them, since it searches the libraries that module links."""
    global _bound
    if _bound is None:
        try:
            library = ctypes.CDLL(MPI.__file__)

            def address(name: str) -> int:
                return ctypes.cast(getattr(library, name), ctypes.c_void_p).value

            if MPI._sizeof(MPI.Comm) != MPI._sizeof(MPI.Datatype):  # replay_c/mpi.c passes both as one kind
                raise ValueError("communicator and datatype handles differ in size")
            probe = MPI.Request()
            request_offset = MPI._addressof(probe) - id(probe)  # where a Request object keeps its handle
            persistent = MPI.Prequest()  # one object: two temporaries need not share an address
            if MPI._addressof(persistent) - id(persistent) != request_offset or request_offset <= 0:
                raise ValueError("request objects keep their handles at different places")
            _replay.bind(address("MPI_Startall"), address("MPI_Testall"), address("MPI_Waitall"),
                         address("MPI_Get_count"), address("MPI_Isend"), address("MPI_Irecv"), address("MPI_Iprobe"),
                         MPI._sizeof(MPI.Request), MPI._sizeof(MPI.Status), MPI._sizeof(MPI.Datatype),
                         request_offset, MPI._handleof(MPI.BYTE), MPI.ANY_SOURCE)
            _replay.read_arrays(_array_samples())
            _bound = True
        except (OSError, AttributeError, ValueError, TypeError):  # an MPI this was not made for
            _bound = False
    return _bound


def _array_samples() -> tuple:
    """Arrays of several shapes, strides and flags, with what NumPy says of each: replay_c/arrays.c
    reads an array's fields directly only if it finds these there (`read_arrays`)."""
    base = np.arange(24.0).reshape(4, 6)
    frozen = np.zeros(3, np.int32)
    frozen.flags.writeable = False
    arrays = (base, base[:, ::2], base[1:3], frozen, np.empty((0, 2), np.complex64), np.float32(1) + base[0])
    return tuple((a, a.__array_interface__["data"][0], a.shape, a.strides, a.flags.c_contiguous, a.flags.writeable)
                 for a in arrays)


# ---- work ----

def expect_spec(ref: tuple[int, int], expected: bytes) -> tuple:
    """Work that compares the bytes at `ref` with `expected` (a layout as recorded)."""
    return (WORK_EXPECT, 0, 0, ref, _NOWHERE, _NOWHERE, len(expected), 0, expected)


def work_spec(kind: str, op: str | None, arrays: tuple, refs: tuple, divisor: int) -> tuple | None:
    """Recorded work as plain data the C replay (and `work_in_python`) do exactly as NumPy:
    (kind, op code, dtype code, out ref, a ref, b ref, length, divisor); None for work only NumPy
    does exactly (it stays a call). Operands must be C-contiguous arrays of one shape and native
    dtype, the output the same as each input or apart from it (C's loop, unlike NumPy, does not
    buffer an overlap)."""
    if not all(a.flags.c_contiguous and a.dtype.isnative for a in arrays):
        return None
    out, a = arrays[0], arrays[1]
    if any(other.shape != out.shape for other in arrays[1:]):
        return None
    if not all(_same_or_apart(out, other) for other in arrays[1:]):
        return None
    if kind == "copy":
        if a.dtype != out.dtype:
            return None  # a conversion (bfloat16 to float32 and back): NumPy's
        return (WORK_COPY, 0, 0, refs[0], refs[1], _NOWHERE, out.nbytes, 0)
    dtype_code = DTYPE_CODES.get(out.dtype)
    if dtype_code is None or any(other.dtype != out.dtype for other in arrays[1:]):
        return None
    if kind == "divide":
        if out.dtype.kind != "f" or out.dtype.itemsize not in (4, 8):
            return None
        return (WORK_DIVIDE, 0, dtype_code, refs[0], refs[1], _NOWHERE, out.size, divisor)
    op_code = OP_CODES[op]
    if not exact_in_c(op_code, dtype_code):
        return None
    return (WORK_OP, op_code, dtype_code, refs[0], refs[1], refs[2], out.size, 0)


def _same_or_apart(a: np.ndarray, b: np.ndarray) -> bool:
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0] or not np.shares_memory(a, b)


def python_form(spec: tuple, roots: list) -> tuple:
    """A work spec as the Python replay runs it, decoded once against `roots` (the flat arrays its
    roots stand for, as recorded: their dtypes and sizes, which every binding shares): (kind,
    ufunc, divisor or expected bytes, out, a, b), each operand (root, index, dtype) as
    `_operand` resolves it on a call's roots."""
    kind, op_code, dtype_code, out_ref, a_ref, b_ref, n, divisor = spec[:8]
    if kind == WORK_EXPECT:
        return kind, None, spec[8], _operand_of(roots, out_ref, n, _UINT8), _NO_OPERAND, None
    if kind == WORK_COPY:  # bytes: in the out root's dtype where that moves whole elements
        dtype = roots[out_ref[0]].dtype if out_ref[0] >= 0 else _UINT8
        dtype = dtype if n % dtype.itemsize == 0 else _UINT8
        return kind, None, None, _operand_of(roots, out_ref, n, dtype), _operand_of(roots, a_ref, n, dtype), None
    dtype = _DTYPES[dtype_code]
    nbytes = n * dtype.itemsize
    out, a = _operand_of(roots, out_ref, nbytes, dtype), _operand_of(roots, a_ref, nbytes, dtype)
    if kind == WORK_DIVIDE:
        return kind, np.true_divide, divisor, out, a, None
    ufunc = getattr(np, UFUNC_NAMES[_OP_NAMES[op_code]])
    return kind, ufunc, None, out, a, _operand_of(roots, b_ref, nbytes, dtype)


_UINT8 = np.dtype(np.uint8)
_NO_OPERAND = (-1, None, None)


def _operand_of(roots: list, ref: tuple[int, int], nbytes: int, dtype: np.dtype) -> tuple:
    """How the Python replay finds the `nbytes` at `ref` as `dtype`: (root, None, None) the whole
    root; (root, slice, None) elements of it, where its dtype is `dtype`; (root, byte slice,
    dtype) a byte range viewed so; (-1, the view, None) a view made now, of part of an array the
    schedule owns (roots 2 on: they stay)."""
    root, offset = ref
    array = roots[root]
    size = dtype.itemsize
    if array.dtype == dtype and offset % size == 0:
        start, stop = offset // size, (offset + nbytes) // size
        operand = (root, None if start == 0 and stop == array.size else slice(start, stop), None)
    else:
        operand = (root, slice(offset, offset + nbytes), dtype)
    if root < 2 or operand[1] is None:  # (a whole root of its own stays where it is)
        return operand
    return -1, _operand(roots, operand), None


def _operand(roots: list, operand: tuple) -> Any:
    root, index, dtype = operand
    if root < 0:
        return index
    array = roots[root]
    if index is None:
        return array
    return array[index] if dtype is None else array.view(_UINT8)[index].view(dtype)


def python_work(spec: tuple, roots: list) -> Callable[[], None]:
    """A work spec as one call of the Python replay (on the arrays `roots` hold when it runs):
    an op on whole roots, the common case of a small call, calls its ufunc on them directly."""
    form = python_form(spec, roots)
    kind, ufunc, _, out, a, b = form
    if kind == WORK_OP and out[1] is None and a[1] is None and b[1] is None:
        return partial(_op_on_roots, roots, ufunc, out[0], a[0], b[0])
    return partial(work_in_python, roots, form)


def _op_on_roots(roots: list, ufunc: Any, out: int, a: int, b: int) -> None:
    ufunc(roots[a], roots[b], out=roots[out])


def work_in_python(roots: list, form: tuple) -> None:
    """A work spec's arithmetic in NumPy (its `python_form`) on the flat arrays the roots stand
    for now: what the C replay does, in the Python replay."""
    kind, ufunc, extra, out, a, b = form
    out, a = _operand(roots, out), _operand(roots, a)
    if kind == WORK_OP:
        ufunc(a, _operand(roots, b), out=out)
    elif kind == WORK_COPY:
        out[...] = a
    elif kind == WORK_EXPECT:
        if out.tobytes() != extra:
            raise LayoutChanged
    else:
        ufunc(a, extra, out=out)


# ---- programs ----

def program(schedule: Any, busy: bool, with_work: bool = True) -> Any:
    """The C form of a schedule (mpiring.engine.schedule), or None where it replays in Python;
    `busy`: its waits test without offering the core in between (Ring.busy_poll); without its
    work: its messages alone (the benchmark's ceiling), numbered as call 0 on every rank (the
    ranks may have recorded it at different calls: a cache evicts on each rank by itself)."""
    if not enabled():
        return None
    try:
        comm = MPI._handleof(schedule.comm)
    except TypeError:  # a stand-in for a communicator (tests record what reaches MPI): Python replays
        return None
    specs = []
    for exchange in schedule.exchanges:
        step = exchange.step
        checks = tuple((index, expected) for index, expected, _ in step.receives)
        if any(m.nbytes > _INT_MAX for m in exchange.messages):  # MPI's int counts: Python says why
            return None
        fresh = tuple((m.index, m.receive, m.ref, m.nbytes, m.peer, m.tag) for m in exchange.messages)
        after, during = (exchange.after, exchange.during) if with_work else ((), ())
        specs.append((b"", step.requests, _status_addresses(step), checks, after, fresh, during))
    roots = (0, 0, *(0 if a is None else a.__array_interface__["data"][0] for a in schedule.owned))
    tag, notice = schedule.call.tag, schedule.notice
    if not with_work:
        tag, notice = schedule.tags.with_sequence(tag, 0), -1
    return _replay.Program(schedule.prologue_works if with_work else (), tuple(specs), comm, busy, tag, roots,
                           schedule.owned, schedule.x_bytes, schedule.out_bytes, schedule.allocate,
                           schedule.result_kind, schedule.traffic, schedule, schedule.sequence, notice,
                           schedule.items, MPI._handleof(schedule.notice_comm), schedule.own_offset,
                           None if schedule.notice_board is None else schedule.notice_board.c_form())


def plan_program(plan: Any, prologue: tuple, exchanges: tuple | None, busy: bool) -> Any:
    """The C form of a device plan's prologue and exchanges (mpiring.engine.plan: persistent
    requests bound to its buffers for life, sends made anew at fixed addresses, work as calls),
    or None where it replays in Python."""
    if exchanges is None or not enabled():
        return None
    size = MPI._sizeof(MPI.Request)
    specs, comms = [], set()
    for exchange in exchanges:
        step, requests = exchange.step, exchange.step.requests
        checks = tuple((index, expected) for index, expected, _ in step.receives)
        if any(expected > _INT_MAX for _, expected in checks):
            return None
        fresh = []
        for index, message, dest, tag, comm in step.fresh_sends:
            buf = message[0]
            if not (type(buf) is np.ndarray and message[1] == MPI.BYTE and buf.nbytes <= _INT_MAX):
                return None  # host memory with MPI_Isend's int count (device or larger sends stay with mpi4py)
            fresh.append((index, False, (-1, buf.__array_interface__["data"][0]), buf.nbytes, dest, tag))
            comms.add(MPI._handleof(comm))
        persistent = requests[: len(requests) - len(fresh)]
        handles = b"".join(ctypes.string_at(MPI._addressof(request), size) for request in persistent)
        specs.append((handles, requests, _status_addresses(step), checks, exchange.after, tuple(fresh),
                      exchange.during))
    if len(comms) > 1:
        return None
    return _replay.Program(tuple(prologue), tuple(specs), comms.pop() if comms else 0, busy, 0, (0, 0), (), 0, 0,
                           None, RESULT_CODES["out"], plan.traffic, plan)


def _status_addresses(step: Any) -> tuple:
    statuses = step.statuses
    return tuple(map(MPI._addressof, statuses)) if statuses else (None,) * len(step.requests)


def start(program: Any, index: int) -> None:
    """Start exchange `index` of a program, for Python to wait for."""
    code = program.start(index)
    if code:
        raise MPI.Exception(code)


def shortcut(hot: Any, in_python: Any, after: Any, yield_seconds: float) -> Any:
    """A blocking call that takes a compiled schedule from `hot.programs` (layout key -> Program)
    without running Python (`Shortcut` in replay_c/shortcut.c), and otherwise calls `in_python`
    with the same arguments; `in_python` itself where schedules replay in Python (`enabled`: the
    extension was not built, cannot reach the MPI library, or MPIRING_COMPILED=0).
    It reads and counts in the communicator's HotState `hot` (its thread, default timeout, calls in
    flight, call count and traffic), and hands a call that stopped or raised to `after`
    (Engine._after_shortcut)."""
    if not enabled():
        return in_python
    return _replay.Shortcut(hot, np.ndarray, in_python, after, yield_seconds)


def persistent_shortcut(request: Any, hot: Any, program: Any, call: Any, spin: float,
                        handlers: tuple) -> tuple | None:
    """A persistent request's start() and wait() in C (`PersistentShortcut` in replay_c/persistent.c), each
    handing what it does not take to the request's own method (`handlers`: its _start_in_python,
    _wait_in_python, _failed_start and _resume_wait); it reads and counts in the communicator's
    HotState `hot`. None where there is no program."""
    if not available() or program is None:
        return None
    made = _replay.PersistentShortcut(request, hot, program, call, spin, handlers)
    return made.start, made.wait

