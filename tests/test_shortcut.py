"""The C shortcut of a cached blocking call (compiled.shortcut; Shortcut in engine/_replay.c), on
its own: stand-ins for the plan, ring and communicator, and a real compiled program whose one
exchange has no messages, so that what it takes, what it counts and what it hands back to Python
are checked without peers. The MPI tests run it on real plans (test_plans, test_timeouts)."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from mpiring.engine import compiled
from mpiring.engine.transport import Traffic

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the C replay was not built")

HOST = object()  # the backend a plan must have to be taken (NUMPY in the Communicator)
YIELD = 0.01


class StandInPlan:
    __slots__ = ("compiled", "backend", "x_shape", "x_dtype", "out_shape", "out_dtype", "used", "traffic",
                 "result", "copy_result")


class StandInRing:
    def __init__(self) -> None:
        self.owner = threading.get_ident()
        self.calls = 0
        self.in_flight: list = []
        self.traffic = Traffic()


class StandInCache:
    __slots__ = ("table", "removals")  # what the shortcut reads of a PlanCache

    def __init__(self, table: dict) -> None:
        self.table, self.removals = table, 0


class StandInCommunicator:
    timeout: float | None = None


class Rig:
    """A shortcut over one stand-in plan for allreduce(x, out=out), and what reached Python."""

    def __init__(self, work=None) -> None:
        self.x, self.out = np.ones(4, np.float32), np.zeros(4, np.float32)
        self.works = []
        program = compiled._replay.Program((), ((b"", (), (), (work or self._work,), (), ()),), 0)
        self.plan = plan = StandInPlan()
        plan.compiled, plan.backend = program, HOST
        plan.x_shape, plan.x_dtype, plan.out_shape, plan.out_dtype = self.x.shape, self.x.dtype, (4,), self.out.dtype
        plan.used, plan.traffic = 0, Traffic(bytes_sent=16, bytes_received=12, messages=2)
        plan.result, plan.copy_result = self.out, None
        self.ring, self.communicator = StandInRing(), StandInCommunicator()
        self.cache = StandInCache({self.key(self.x, self.out): plan})
        self.table = self.cache.table
        self.in_python, self.after = [], []
        self.shortcut = compiled.shortcut(self.cache, self.ring, self.communicator, StandInPlan, HOST,
                                          self._in_python, self._after, YIELD)

    def replace(self, entry) -> None:
        """What PlanCache does: the entry under the call's key leaves the table, counted."""
        self.table[self.key(self.x, self.out)] = entry
        self.cache.removals += 1

    def key(self, x, out, op="sum"):
        return ("allreduce", id(x), id(out), op, None, None, "auto")

    def call(self, x=None, out=None, op="sum", timeout=None):
        x = self.x if x is None else x
        out = self.out if out is None else out
        return self.shortcut("allreduce", x, out, op, None, None, "auto", timeout)

    def _work(self) -> None:
        self.works.append(1)

    def _in_python(self, *args):
        self.in_python.append(args)
        return "python"

    def _after(self, plan, stopped, spin, error):
        self.after.append((plan, stopped, spin, error))
        return "after"


def test_a_hit_runs_the_program_and_counts_as_python_does() -> None:
    rig = Rig()
    for n in (1, 2, 3):
        assert rig.call() is rig.out
        assert rig.works == [1] * n and rig.in_python == []
        assert rig.ring.calls == rig.plan.used == n
    assert rig.ring.traffic == Traffic(bytes_sent=48, bytes_received=36, messages=6)


def test_the_last_hit_is_remembered_until_a_plan_leaves_the_cache() -> None:
    rig = Rig()
    assert rig.call() is rig.out
    del rig.table[rig.key(rig.x, rig.out)]  # not counted: the memo still finds the plan
    assert rig.call() is rig.out and rig.in_python == []
    rig.cache.removals += 1  # counted (as PlanCache counts): the key is looked up again
    assert rig.call() == "python"
    other = StandInPlan()
    for field in StandInPlan.__slots__:
        setattr(other, field, getattr(rig.plan, field))
    other.used, other.result = 0, "the new plan's result"
    rig.replace(other)
    assert rig.call() == "the new plan's result"
    assert rig.call(op="".join(["s", "um"])) == "the new plan's result"  # an equal op, not the same object: the dict
    assert rig.ring.calls == 4 and other.used == 4


def test_the_memo_keeps_no_array_alive_once_its_plan_left_the_cache() -> None:
    rig = Rig()
    x = rig.x
    assert rig.call() is rig.out  # remembered: the memo holds x (the stand-in plan does not)
    gone = weakref.ref(x)
    del rig.table[rig.key(x, rig.out)]
    rig.cache.removals += 1
    rig.x = x = None
    assert rig.call(x=np.ones(4, np.float32)) == "python"  # any call drops a stale memo
    rig.in_python.clear()
    gc.collect()
    assert gone() is None


def test_a_result_the_plan_owns_is_copied() -> None:
    rig = Rig()
    rig.plan.copy_result = lambda result: ("copy of", result)
    assert rig.call() == ("copy of", rig.out)


@pytest.mark.parametrize("after_a_hit", [False, True], ids=["cold", "remembered"])
@pytest.mark.parametrize("change", ["timeout per call", "other arrays", "shape", "dtype", "another thread",
                                    "in flight", "not a plan", "not compiled", "program released", "device plan",
                                    "unhashable op", "plan removed"])
def test_anything_else_goes_to_python_untouched(change: str, after_a_hit: bool) -> None:
    """Also once the shortcut remembers its last hit: the memo skips the key, never the checks."""
    rig = Rig()
    if after_a_hit:
        assert rig.call() is rig.out
        rig.works.clear()
        rig.ring.calls, rig.plan.used = 0, 0
        rig.ring.traffic.reset()
    call = {}
    if change == "timeout per call":
        call["timeout"] = 5.0
    elif change == "other arrays":
        call["x"] = np.ones(4, np.float32)
    elif change == "shape":
        rig.plan.x_shape = (2, 2)
    elif change == "dtype":
        rig.plan.out_dtype = np.dtype(np.float64)
    elif change == "another thread":
        rig.ring.owner += 1
    elif change == "in flight":
        rig.ring.in_flight.append(object())
    elif change == "not a plan":
        rig.replace(object())
    elif change == "plan removed":
        del rig.table[rig.key(rig.x, rig.out)]
        rig.cache.removals += 1
    elif change == "not compiled":
        rig.plan.compiled = None
    elif change == "program released":
        rig.plan.compiled.release()
    elif change == "device plan":
        rig.plan.backend = object()
    elif change == "unhashable op":
        call["op"] = ["sum"]
    assert rig.call(**call) == "python"
    x, out = call.get("x", rig.x), rig.out
    assert rig.in_python == [("allreduce", x, out, call.get("op", "sum"), None, None, "auto", call.get("timeout"))]
    assert rig.works == [] and rig.ring.calls == 0 and rig.ring.traffic == Traffic()


def test_work_that_raises_is_handed_to_python_with_the_spin() -> None:
    def failing() -> None:
        raise ZeroDivisionError("recorded work failed")

    rig = Rig(failing)
    assert rig.call() == "after"
    plan, stopped, spin, error = rig.after[0]
    assert plan is rig.plan and stopped is None and spin == -1.0  # no timeout: MPI_Waitall
    assert isinstance(error, ZeroDivisionError) and error.__traceback__ is not None
    rig.communicator.timeout = 5.0
    rig.call()
    assert rig.after[1][2] == YIELD  # the spin is the timeout, at most YIELD
    assert rig.ring.calls == 2  # the call counted, as a Python call that raised counts


def test_without_the_extension_the_python_call_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "_replay", None)

    def in_python(*args):
        return args

    assert compiled.shortcut(StandInCache({}), StandInRing(), StandInCommunicator(), StandInPlan, HOST, in_python, None,
                             YIELD) is in_python


# ---- a persistent request's start() and wait() in C (compiled.persistent_shortcut) ----


class StandInRequest:
    """The fields PersistentShortcut reads and writes, and the methods it hands calls to."""

    __slots__ = ("_freed", "_running", "_error", "_position", "_run", "handed")

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


class StandInCall:
    __slots__ = ("step",)


class StandInPersistentPlan:
    __slots__ = ("compiled", "call", "traffic", "result")


class PersistentRig:
    def __init__(self, prologue=(), exchanges=1) -> None:
        self.works = []
        self.request, self.ring, self.communicator = StandInRequest(), StandInRing(), StandInCommunicator()
        self.communicator._freed = False
        self.ring.broken = None
        self.plan = plan = StandInPersistentPlan()
        # (handles, status objects, checks, work after, sends made anew, work in flight)
        spec = (b"", (), (), (lambda: self.works.append("after"),), (), (lambda: self.works.append("during"),))
        plan.compiled = compiled._replay.Program(prologue, (spec,) * exchanges, 0)
        plan.call, plan.call.step = StandInCall(), 3
        plan.traffic, plan.result = Traffic(bytes_sent=8, bytes_received=8, messages=2), "the result"
        self.start, self.wait = compiled.persistent_shortcut(self.request, self.communicator, self.ring, plan, -1.0)


def test_a_persistent_run_in_c_counts_and_returns_as_python_does() -> None:
    rig = PersistentRig()
    for n in (1, 2):
        rig.start()
        assert rig.ring.in_flight == [rig.request] and rig.request._running is True
        # the start did the exchange's work in flight; the wait does the work after it
        assert rig.request._position == 0 and rig.plan.call.step == 0
        assert rig.works == ["during", "after"] * (n - 1) + ["during"]
        assert rig.wait() == "the result"
        assert rig.ring.in_flight == [] and rig.request._running is False and rig.works == ["during", "after"] * n
    assert rig.ring.calls == 2 and rig.ring.traffic == Traffic(bytes_sent=16, bytes_received=16, messages=4)
    assert rig.wait() == "the result" and rig.works == ["during", "after"] * 2  # complete already: the result again
    assert rig.request.handed == []


def test_a_run_does_each_exchange_s_work_in_flight_before_waiting_and_its_work_after() -> None:
    order = []

    def exchange(n: int) -> tuple:
        return (b"", (), (), (lambda: order.append(f"after {n}"),), (), (lambda: order.append(f"during {n}"),))

    program = compiled._replay.Program((lambda: order.append("prologue"),), (exchange(0), exchange(1)), 0)
    assert program.run(0, False, -1.0) is None
    assert order == ["prologue", "during 0", "after 0", "during 1", "after 1"]
    order.clear()
    assert program.start(1) == 0 and order == []  # Python, which started it, does its work in flight
    assert program.run(1, True, -1.0) is None and order == ["after 1"]


def test_a_program_without_exchanges_is_complete_once_started() -> None:
    rig = PersistentRig(exchanges=0)
    rig.start()
    assert rig.ring.in_flight == [] and rig.request._running is False
    assert rig.wait() == "the result" and rig.request.handed == []


@pytest.mark.parametrize("change", ["request freed", "running", "in flight", "another thread", "communicator freed",
                                    "ring broken", "program released"])
def test_a_start_outside_the_lean_path_goes_to_python_untouched(change: str) -> None:
    rig = PersistentRig()
    if change == "request freed":
        rig.request._freed = True
    elif change == "running":
        rig.request._running = True
    elif change == "in flight":
        rig.ring.in_flight.append(object())
    elif change == "another thread":
        rig.ring.owner += 1
    elif change == "communicator freed":
        rig.communicator._freed = True
    elif change == "ring broken":
        rig.ring.broken = "an earlier call timed out"
    elif change == "program released":
        rig.plan.compiled.release()
    rig.start()
    assert rig.request.handed == ["start"]
    assert rig.ring.calls == 0 and rig.ring.traffic == Traffic() and rig.plan.call.step == 3


@pytest.mark.parametrize("change", ["never started", "failed", "generator run", "another in flight",
                                    "another thread", "program released"])
def test_a_wait_outside_the_lean_path_goes_to_python_untouched(change: str) -> None:
    rig = PersistentRig()
    if change != "never started":
        rig.start()
    if change == "failed":
        rig.request._error = RuntimeError("the last run failed")
    elif change == "generator run":
        rig.request._run = object()
    elif change == "another in flight":
        rig.ring.in_flight.insert(0, object())
    elif change == "another thread":
        rig.ring.owner += 1
    elif change == "program released":
        rig.plan.compiled.release()
    assert rig.wait() == "python"
    assert rig.request.handed == ["wait"] and rig.works == ([] if change == "never started" else ["during"])


def test_a_start_whose_work_raises_is_handed_to_python() -> None:
    def failing() -> None:
        raise ZeroDivisionError("prologue failed")

    rig = PersistentRig(prologue=(failing,))
    with pytest.raises(RuntimeError, match="start failed"):
        rig.start()
    [(what, error)] = rig.request.handed
    assert what == "failed" and isinstance(error, ZeroDivisionError) and error.__traceback__ is not None
    assert rig.ring.in_flight == []



def test_shortcuts_used_before_they_were_made_raise() -> None:
    shortcut = compiled._replay.Shortcut.__new__(compiled._replay.Shortcut)
    persistent = compiled._replay.PersistentShortcut.__new__(compiled._replay.PersistentShortcut)
    for use in (lambda: shortcut("allreduce", None, None, None, None, None, "auto", None), persistent.start,
                persistent.wait):
        with pytest.raises(RuntimeError, match="before it was made"):
            use()
