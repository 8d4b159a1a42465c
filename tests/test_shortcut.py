"""The C replay on its own (engine/replay_c/, through mpiring.engine.native): a Program built
from plain data, whose one exchange has no messages, bound to arrays; the Shortcut of a cached
blocking call, over a communicator's HotState alone; and a persistent request's C
start() and wait(). What they take, what they count, what they compute and what they hand back
to Python are checked without peers; the MPI tests run them on real schedules (test_schedules.py,
test_plans.py, test_timeouts.py)."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from mpiring.engine import native
from mpiring.engine.schedule import layout_key
from mpiring.engine.transport import Traffic

pytestmark = pytest.mark.skipif(not native.available(), reason="the C replay was not built")

YIELD = 0.01
X, OUT = 0, 1


def program(works=(), during=(), prologue=(), exchanges=1, roots=(0, 0), owned=(), x_bytes=16, out_bytes=16,
            allocate=None, result=native.RESULT_CODES["out"], traffic=None, schedule=None):
    """A Program whose exchanges post no message: (handles, request objects, status objects,
    checks, work after, messages made anew, work in flight)."""
    spec = (b"", [], (), (), tuple(works), (), tuple(during))
    traffic = traffic or Traffic(bytes_sent=16, bytes_received=12, messages=2)
    items = (x_bytes // 4, out_bytes // 4)  # float32 elements
    return native._replay.Program(tuple(prologue), (spec,) * exchanges, 0, False, 0, roots, owned, x_bytes,
                                    out_bytes, allocate, result, traffic, schedule, items=items)


def add(out=(OUT, 0), a=(X, 0), b=(X, 0), n=4, dtype=np.float32, op="sum"):
    """out <- a op b, done in C (native.work_spec's form)."""
    return (native.WORK_OP, native.OP_CODES[op], native.DTYPE_CODES[np.dtype(dtype)], out, a, b, n, 0)


def hot_state() -> native.HotState:
    """A communicator's HotState as a Ring makes it, its first call's thread this one."""
    hot = native.HotState(Traffic())
    hot.owner = hot.served = threading.get_ident()  # what the C paths compare (None once broken or freed)
    return hot


class Rig:
    """A Shortcut over one compiled schedule, allreduce of 4 float32 (out <- x + x), and what
    reached Python."""

    def __init__(self, works=None, out_given=True, counts=None) -> None:
        self.x, self.out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
        self.counts = counts
        made = []
        self.made = made

        def allocate():
            made.append(np.empty(4, np.float32))
            return made[-1]

        self.program = program(works=works or (add(),), allocate=None if out_given else allocate)
        self.hot = hot_state()
        self.table = self.hot.programs
        self.table[self.key(self.x, self.out if out_given else None)] = self.program
        self.in_python, self.after = [], []
        self.shortcut = native.shortcut(self.hot, self._in_python, self._after, YIELD)

    def key(self, x, out, op="sum"):
        return layout_key("allreduce", x, out, op, None, self.counts, "auto")

    def call(self, x=None, out=None, op="sum", timeout=None, given=True, counts=None):
        x = self.x if x is None else x
        out = (self.out if out is None else out) if given else None
        return self.shortcut("allreduce", x, out, op, None, self.counts if counts is None else counts, "auto",
                             timeout)

    def _in_python(self, *args):
        self.in_python.append(args)
        return "python"

    def _after(self, program, stopped, spin, error):
        self.after.append((program, stopped, spin, error))
        return "after"


def test_a_hit_binds_the_arrays_runs_the_program_and_counts_as_python_does() -> None:
    rig = Rig()
    for n in (1, 2, 3):
        assert rig.call() is rig.out
        assert rig.in_python == [] and rig.hot.calls == rig.program.used == n
        np.testing.assert_array_equal(rig.out, 2 * rig.x)
    assert rig.hot.traffic == Traffic(bytes_sent=48, bytes_received=36, messages=6)
    assert rig.program.x is None and rig.program.out is None  # unbound after each call: it keeps no array


def test_any_arrays_of_the_layout_bind_views_and_new_ones_alike() -> None:
    rig = Rig()
    for k in range(3):
        x, out = np.full(4, k + 1.0, np.float32), np.empty(4, np.float32)
        assert rig.call(x=x, out=out) is out
        np.testing.assert_array_equal(out, np.full(4, 2 * (k + 1.0)))
    whole = np.arange(12, dtype=np.float32)
    view_x, view_out = whole[2:6], whole[8:12]  # views at offsets of one array: bound where they are
    assert rig.call(x=view_x, out=view_out) is view_out
    np.testing.assert_array_equal(whole[8:12], 2 * np.arange(2, 6, dtype=np.float32))
    in_place = np.ones(4, np.float32)  # x is out: another layout key, so not this schedule's
    assert rig.call(x=in_place, out=in_place) == "python"


def test_without_out_each_call_gets_a_new_result() -> None:
    rig = Rig(out_given=False)
    first, second = rig.call(given=False), rig.call(given=False)
    assert first is rig.made[0] and second is rig.made[1] and first is not second
    np.testing.assert_array_equal(first, 2 * rig.x)
    np.testing.assert_array_equal(second, 2 * rig.x)


@pytest.mark.parametrize("change", ["timeout per call", "another thread", "ring broken or freed", "in flight",
                                    "not a program",
                                    "program released", "unhashable op", "no schedule for the key", "shape",
                                    "dtype", "strided x", "read-only out", "resized x", "overlap", "subclass",
                                    "allocate fails"])
def test_anything_else_goes_to_python_untouched(change: str) -> None:
    rig = Rig()
    call = {}
    if change == "timeout per call":
        call["timeout"] = 5.0
    elif change == "another thread":
        rig.hot.served += 1
    elif change == "ring broken or freed":
        rig.hot.served = None
    elif change == "in flight":
        rig.hot.in_flight.append(object())
    elif change == "not a program":
        rig.table[rig.key(rig.x, rig.out)] = object()
    elif change == "program released":
        rig.program.release()
    elif change == "unhashable op":
        call["op"] = ["sum"]
    elif change == "no schedule for the key":
        call["op"] = "max"
    elif change == "shape":
        call["x"], call["out"] = np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)
    elif change == "dtype":
        call["x"] = np.ones(4, np.float64)
    elif change == "strided x":  # the same key (dtype and shape), memory that is not contiguous
        call["x"] = np.ones(8, np.float32)[::2]
        rig.table[rig.key(call["x"], rig.out)] = rig.program
    elif change == "read-only out":
        rig.out.flags.writeable = False
    elif change == "resized x":  # the key says 4 elements; the schedule was recorded for another size
        rig.program = program(works=(add(),), x_bytes=32, out_bytes=32)
        rig.table[rig.key(rig.x, rig.out)] = rig.program
    elif change == "overlap":
        whole = np.zeros(6, np.float32)
        call["x"], call["out"] = whole[:4], whole[2:]
    elif change == "subclass":
        call["x"] = rig.x.view(type("Sub", (np.ndarray,), {}))
    elif change == "allocate fails":
        rig = Rig(out_given=False)
        rig.program = program(works=(add(),), allocate=lambda: np.empty(3, np.float32))  # the wrong size
        rig.table[rig.key(rig.x, None)] = rig.program
        call["given"] = False
    assert rig.call(**call) == "python"
    x = call.get("x", rig.x)
    out = call.get("out", rig.out) if call.get("given", True) else None
    assert rig.in_python == [("allreduce", x, out, call.get("op", "sum"), None, None, "auto", call.get("timeout"))]
    assert rig.hot.calls == 0 and rig.hot.traffic == Traffic()
    if change not in ("overlap", "shape", "read-only out"):
        assert not rig.out.any(), "a miss changed nothing"


def test_the_shortcut_keeps_no_array_alive() -> None:
    rig = Rig()
    x = np.ones(4, np.float32)
    rig.call(x=x)
    gone = weakref.ref(x)
    del x
    gc.collect()
    assert gone() is None


def test_work_that_raises_is_handed_to_python_with_the_spin_and_the_binding() -> None:
    seen = []

    def failing() -> None:
        seen.append((rig.program.x, rig.program.out))
        raise ZeroDivisionError("recorded work failed")

    rig = Rig(works=(failing,))
    assert rig.call() == "after"
    program_, stopped, spin, error = rig.after[0]
    assert program_ is rig.program and stopped is None and spin == -1.0  # no timeout: MPI_Waitall
    assert isinstance(error, ZeroDivisionError) and error.__traceback__ is not None
    assert seen == [(rig.x, rig.out)]  # work done in Python sees the bound arrays
    rig.hot.timeout = 5.0
    rig.call()
    assert rig.after[1][2] == YIELD  # the spin is the timeout, at most YIELD
    assert rig.hot.calls == 2  # the call counted, as a Python call that raised counts


@pytest.mark.parametrize("name", ["HotState", "Counters", "RequestFields"])
def test_the_python_forms_of_the_c_fields_have_their_names(name: str) -> None:
    """mpiring.engine.state, used where the extension was not built, has the C types' fields."""
    from mpiring.engine import state

    def fields(kind: type) -> set:
        return {field for field in dir(kind) if not field.startswith("__")}

    c_form, python_form = getattr(native._replay, name), getattr(state, name)
    assert fields(c_form) == fields(python_form)
    if name == "Counters":
        made = c_form(1, 2, messages=3), python_form(1, 2, messages=3)
        assert [repr(each).split("(", 1)[1] for each in made] == ["bytes_sent=1, bytes_received=2, messages=3)"] * 2
        assert made[0] == c_form(1, 2, 3) and made[0] != c_form(1, 2, 4)


def test_the_hot_state_s_fields_are_read_and_written_as_python_values() -> None:
    hot = hot_state()
    assert (hot.calls, hot.timeout, hot.freed, hot.broken, hot.in_flight, hot.programs) == (0, None, False, None, [],
                                                                                            {})
    hot.timeout, hot.calls = 5.0, 7
    assert hot.timeout == 5.0 and hot.calls == 7
    hot.timeout = hot.served = None
    assert hot.timeout is None and hot.served is None and hot.owner == threading.get_ident()
    with pytest.raises(AttributeError):
        hot.traffic = Traffic()  # never replaced: the C paths hold it
    with pytest.raises(TypeError):
        native.HotState(object())  # its traffic is a Traffic, whose fields C adds to


@pytest.mark.parametrize("field", ["calls", "timeout", "served"])
def test_a_hot_field_python_set_to_something_unexpected_is_a_miss_never_a_crash(field: str) -> None:
    rig = Rig()
    setattr(rig.hot, field, "not a number")
    assert rig.call() == "python" and getattr(rig.hot, field) == "not a number"
    assert not rig.out.any() and rig.hot.traffic == Traffic()


def test_without_the_extension_the_python_call_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_replay", None)

    def in_python(*args):
        return args

    assert native.shortcut(hot_state(), in_python, None, YIELD) is in_python


# ---- what a Program computes: exactly NumPy's results ----

OPS_AND_DTYPES = [(op, dtype) for dtype in native.DTYPE_CODES for op in native.OP_CODES if op != "avg"]


@pytest.mark.parametrize(("op", "dtype"), OPS_AND_DTYPES, ids=[f"{op}-{dtype}" for op, dtype in OPS_AND_DTYPES])
def test_c_arithmetic_is_numpy_s_where_c_does_it(op: str, dtype: np.dtype) -> None:
    """The ops C does (native.exact_in_c, the same table as replay_c/work.c's op_supported) give
    NumPy's bits, on values that wrap, overflow, are NaN or signed zeros, in place too."""
    op_code, dtype_code = native.OP_CODES[op], native.DTYPE_CODES[dtype]
    assert native._replay.supports(op_code, dtype_code) == native.exact_in_c(op_code, dtype_code)
    if not native.exact_in_c(op_code, dtype_code) or (op in ("band", "bor", "bxor", "land", "lor", "lxor")
                                                         and dtype.kind in "fc"):
        return
    rng = np.random.default_rng(7)
    n = 257
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        b = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    elif dtype.kind == "b":
        a, b = rng.integers(0, 2, n).astype(bool), rng.integers(0, 2, n).astype(bool)
    else:
        a = (rng.standard_normal(n) * 1e30).astype(dtype)
        b = (rng.standard_normal(n) * 1e30).astype(dtype)
        a[:4] = [np.nan, -0.0, np.inf, 0.0]
        b[:4] = [1.0, 0.0, -np.inf, -0.0]
        if dtype.kind == "c":
            with np.errstate(all="ignore"):
                a, b = a + 1j * a[::-1], b - 1j * b[::-1]
    ufunc = getattr(np, {"sum": "add", "prod": "multiply", "min": "minimum", "max": "maximum", "band": "bitwise_and",
                         "bor": "bitwise_or", "bxor": "bitwise_xor", "land": "logical_and", "lor": "logical_or",
                         "lxor": "logical_xor"}[op])
    with np.errstate(all="ignore"):
        expected = ufunc(a, b, out=np.empty_like(a))
    out = np.empty_like(a)
    owned = (a, b, out)
    roots = (0, 0, *(array.__array_interface__["data"][0] for array in owned))
    work = (native.WORK_OP, op_code, dtype_code, (4, 0), (2, 0), (3, 0), n, 0)
    prog = native._replay.Program((), ((b"", [], (), (), (work,), (), ()),), 0, False, 0, roots, owned, 0, 0,
                                    None, 0, Traffic(), None)
    assert prog.run(0, False, -1.0) is None
    assert out.tobytes() == expected.tobytes(), (op, dtype)
    in_place = (native.WORK_OP, op_code, dtype_code, (2, 0), (2, 0), (3, 0), n, 0)  # a <- a op b
    prog = native._replay.Program((), ((b"", [], (), (), (in_place,), (), ()),), 0, False, 0, roots, owned, 0, 0,
                                    None, 0, Traffic(), None)
    assert prog.run(0, False, -1.0) is None
    assert a.tobytes() == expected.tobytes(), (op, dtype, "in place")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_c_division_is_numpy_s(dtype) -> None:
    a = (np.random.default_rng(3).standard_normal(100) * 7).astype(dtype)
    expected = np.true_divide(a, 3, out=np.empty_like(a))
    work = native.work_spec("divide", None, (a, a), ((2, 0), (2, 0)), 3)
    assert work is not None and work[0] == native.WORK_DIVIDE
    roots = (0, 0, a.__array_interface__["data"][0])
    prog = native._replay.Program((), ((b"", [], (), (), (work,), (), ()),), 0, False, 0, roots, (a,), 0, 0,
                                    None, 0, Traffic(), None)
    assert prog.run(0, False, -1.0) is None
    assert a.tobytes() == expected.tobytes()


def test_work_c_cannot_do_exactly_stays_with_numpy() -> None:
    f32, f16, c64 = np.ones(4, np.float32), np.ones(4, np.float16), np.ones(4, np.complex64)
    refs = ((1, 0), (0, 0), (0, 0))
    assert native.work_spec("op", "min", (f32, f32, f32), refs, 0) is None  # NaN and signed zeros
    assert native.work_spec("op", "sum", (f16, f16, f16), refs, 0) is None
    assert native.work_spec("op", "prod", (c64, c64, c64), refs, 0) is None
    assert native.work_spec("copy", None, (f32, f16), refs[:2], 0) is None  # a conversion
    big_endian = np.ones(4, ">f4")
    assert native.work_spec("op", "sum", (big_endian,) * 3, refs, 0) is None
    assert native.work_spec("op", "sum", (f32, f32, f32), refs, 0) is not None


# ---- a persistent request's start() and wait() in C (native.persistent_shortcut) ----


class StandInRequest(native.RequestFields):
    """The fields PersistentShortcut reads and writes, and the methods it hands calls to."""

    __slots__ = ("handed",)

    def __init__(self) -> None:
        self._freed = self._running = False
        self._error = self._run = None
        self._position = -1
        self.handed = []

    def _start_in_python(self):
        self.handed.append("start")

    def _wait_in_python(self):
        self.handed.append("wait")
        return "python"

    def _failed_start(self, failure):
        self.handed.append(("failed", failure))
        raise RuntimeError("start failed")

    def _resume_wait(self, stopped):
        self.handed.append(("resume", stopped))


class PersistentRig:
    def __init__(self, prologue=(), exchanges=1) -> None:
        self.works = []
        self.request, self.hot = StandInRequest(), hot_state()
        self.result = np.zeros(2)
        self.program = program(works=(lambda: self.works.append("after"),),
                               during=(lambda: self.works.append("during"),), prologue=prologue, exchanges=exchanges,
                               traffic=Traffic(bytes_sent=8, bytes_received=8, messages=2))
        # bound for life, as a persistent request's schedule
        self.program.bind(None, self.result, 0, self.result.__array_interface__["data"][0])
        self.call = native.CallFields()  # a Call's fields that the C start writes
        self.call.step = 3
        request = self.request
        handlers = (request._start_in_python, request._wait_in_python, request._failed_start, request._resume_wait)
        self.start, self.wait = native.persistent_shortcut(request, self.hot, self.program, self.call, -1.0,
                                                             handlers)


def test_a_persistent_run_in_c_counts_and_returns_as_python_does() -> None:
    rig = PersistentRig()
    for n in (1, 2):
        rig.start()
        assert rig.hot.in_flight == [rig.request] and rig.request._running is True
        # the start did the exchange's work in flight; the wait does the work after it
        assert rig.request._position == 0 and rig.call.step == 0
        assert rig.works == ["during", "after"] * (n - 1) + ["during"]
        assert rig.wait() is rig.result
        assert rig.hot.in_flight == [] and rig.request._running is False and rig.works == ["during", "after"] * n
    assert rig.hot.calls == 2 and rig.hot.traffic == Traffic(bytes_sent=16, bytes_received=16, messages=4)
    assert rig.wait() is rig.result and rig.works == ["during", "after"] * 2  # complete already: the result again
    assert rig.request.handed == []


def test_a_persistent_start_in_c_takes_its_number_and_hands_changed_arrays_to_python() -> None:
    rig = PersistentRig()
    rig.start()
    rig.wait()
    assert rig.call.number == rig.hot.calls == 1 and rig.request.handed == []
    rig.result.flags.writeable = False  # the bound result made read-only: Python's start refuses it
    rig.start()
    assert rig.request.handed == ["start"] and rig.hot.calls == 1
    rig.result.flags.writeable = True
    rig.start()
    assert rig.request.handed == ["start"] and rig.call.number == rig.hot.calls == 2


def test_a_run_does_each_exchange_s_work_in_flight_before_waiting_and_its_work_after() -> None:
    order = []

    def exchange(n: int) -> tuple:
        return (b"", [], (), (), (lambda: order.append(f"after {n}"),), (), (lambda: order.append(f"during {n}"),))

    made = native._replay.Program((lambda: order.append("prologue"),), (exchange(0), exchange(1)), 0, False, 0,
                                    (0, 0), (), 0, 0, None, 0, Traffic(), None)
    assert made.run(0, False, -1.0) is None
    assert order == ["prologue", "during 0", "after 0", "during 1", "after 1"]
    order.clear()
    assert made.start(1) == 0 and order == []  # Python, which started it, does its work in flight
    assert made.run(1, True, -1.0) is None and order == ["after 1"]


def test_a_program_without_exchanges_is_complete_once_started() -> None:
    rig = PersistentRig(exchanges=0)
    rig.start()
    assert rig.hot.in_flight == [] and rig.request._running is False
    assert rig.wait() is rig.result and rig.request.handed == []


@pytest.mark.parametrize("change", ["request freed", "running", "in flight", "another thread", "communicator freed",
                                    "ring broken", "program released"])
def test_a_start_outside_the_lean_path_goes_to_python_untouched(change: str) -> None:
    rig = PersistentRig()
    if change == "request freed":
        rig.request._freed = True
    elif change == "running":
        rig.request._running = True
    elif change == "in flight":
        rig.hot.in_flight.append(object())
    elif change == "another thread":
        rig.hot.served += 1
    elif change == "communicator freed":
        rig.hot.freed = True
    elif change == "ring broken":
        rig.hot.broken = "an earlier call timed out"
    elif change == "program released":
        rig.program.release()
    rig.start()
    assert rig.request.handed == ["start"]
    assert rig.hot.calls == 0 and rig.hot.traffic == Traffic() and rig.call.step == 3


@pytest.mark.parametrize("change", ["never started", "failed", "generator run", "another in flight",
                                    "another thread", "another thread, run complete", "program released"])
def test_a_wait_outside_the_lean_path_goes_to_python_untouched(change: str) -> None:
    rig = PersistentRig()
    if change != "never started":
        rig.start()
    if change == "failed":
        rig.request._error = RuntimeError("the last run failed")
    elif change == "generator run":
        rig.request._run = object()
    elif change == "another in flight":
        rig.hot.in_flight.insert(0, object())
    elif change == "another thread":
        rig.hot.served += 1
    elif change == "another thread, run complete":  # not even its result is read in C
        assert rig.wait() is rig.result
        rig.request.handed.clear()
        rig.hot.served += 1
    elif change == "program released":
        rig.program.release()
    assert rig.wait() == "python"
    done = {"never started": [], "another thread, run complete": ["during", "after"]}
    assert rig.request.handed == ["wait"] and rig.works == done.get(change, ["during"])


def test_a_start_whose_work_raises_is_handed_to_python() -> None:
    def failing() -> None:
        raise ZeroDivisionError("prologue failed")

    rig = PersistentRig(prologue=(failing,))
    with pytest.raises(RuntimeError, match="start failed"):
        rig.start()
    [(what, error)] = rig.request.handed
    assert what == "failed" and isinstance(error, ZeroDivisionError) and error.__traceback__ is not None
    assert rig.hot.in_flight == []


def test_programs_refuse_data_they_cannot_run() -> None:
    bad_root = (native.WORK_COPY, 0, 0, (5, 0), (0, 0), (-1, 0), 4, 0)
    with pytest.raises(ValueError, match="no root"):
        program(works=(bad_root,))
    min_float = (native.WORK_OP, native.OP_CODES["min"], native.DTYPE_CODES[np.dtype(np.float32)], (1, 0),
                 (0, 0), (0, 0), 4, 0)
    with pytest.raises(ValueError, match="cannot do"):
        program(works=(min_float,))


def test_shortcuts_used_before_they_were_made_raise() -> None:
    shortcut = native._replay.Shortcut.__new__(native._replay.Shortcut)
    persistent = native._replay.PersistentShortcut.__new__(native._replay.PersistentShortcut)
    for use in (lambda: shortcut("allreduce", None, None, None, None, None, "auto", None), persistent.start,
                persistent.wait):
        with pytest.raises(RuntimeError, match="before it was made"):
            use()


def test_a_hot_state_never_made_is_refused() -> None:
    unmade = native.HotState.__new__(native.HotState)  # its __init__ not run: no traffic
    with pytest.raises(TypeError, match="before it was made"):
        native.shortcut(unmade, lambda *args: None, None, YIELD)


def test_numpy_array_fields_are_read_directly_only_where_they_were_found() -> None:
    samples = native._array_samples()
    assert native._replay.read_arrays(samples) is True  # this NumPy lays its arrays out as replay_c/arrays.c reads them
    array, address, *rest = samples[1]
    try:
        assert native._replay.read_arrays(((array, address + 8, *rest),)) is False  # disagreeing: not read
        rig = PersistentRig()
        rig.start()
        assert rig.request.handed == ["start"]  # without readable fields a persistent start asks Python
    finally:
        assert native._replay.read_arrays(samples) is True


def test_the_last_hit_is_found_again_only_while_it_is_the_same_call() -> None:
    """The Shortcut remembers its last hit: the same arguments and arrays as they were find it
    without the key; a program the table let go, or arrays changed in place, never do."""
    rig = Rig()
    rig.program.cached = True  # (the Cache sets it for what its table holds)
    for _ in range(3):
        assert rig.call() is rig.out
    np.testing.assert_array_equal(rig.out, 2 * rig.x)
    rig.x.shape = (2, 2)  # reshaped in place: another key, which the table does not hold
    assert rig.call() == "python"
    rig.x.shape = (4,)
    assert rig.call() is rig.out and len(rig.in_python) == 1
    rig.table.clear()
    rig.program.cached = False  # dropped from the table: not run from the memo either
    assert rig.call() == "python" and len(rig.in_python) == 2


def test_the_last_hit_takes_counts_made_anew_of_equal_plain_ints() -> None:
    """counts= is a new tuple each call (made from the caller's list): equal ints (or pairs of
    int tuples) find the memo; other values, or items whose equality is not plain ints', do not."""
    rig = Rig(counts=((2, 2), (2, 2)))
    rig.program.cached = True
    assert rig.call() is rig.out
    rig.table.clear()  # from here only the memo can find the program (it stays marked cached)
    assert rig.call(counts=(tuple([2, 2]), tuple([2, 2]))) is rig.out and not rig.in_python
    assert rig.call(counts=((2, 2), (1, 3))) == "python"
    assert rig.call(counts=((np.int64(2), 2), (2, 2))) == "python"  # not plain: the table decides
    assert rig.call(counts=((2.0, 2), (2, 2))) == "python"
    assert rig.call(counts=[(2, 2), (2, 2)]) == "python"
    assert len(rig.in_python) == 4
