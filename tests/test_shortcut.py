"""The C shortcut of a cached blocking call (compiled.shortcut; Shortcut in engine/_replay.c), on
its own: stand-ins for the plan, ring and communicator, and a real compiled program whose one
exchange has no messages, so that what it takes, what it counts and what it hands back to Python
are checked without peers. The MPI tests run it on real plans (test_plans, test_timeouts)."""

from __future__ import annotations

import threading

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


class StandInCommunicator:
    timeout: float | None = None


class Rig:
    """A shortcut over one stand-in plan for allreduce(x, out=out), and what reached Python."""

    def __init__(self, work=None) -> None:
        self.x, self.out = np.ones(4, np.float32), np.zeros(4, np.float32)
        self.works = []
        program = compiled._replay.Program((), ((b"", (), (), (work or self._work,), ()),), 0)
        self.plan = plan = StandInPlan()
        plan.compiled, plan.backend = program, HOST
        plan.x_shape, plan.x_dtype, plan.out_shape, plan.out_dtype = self.x.shape, self.x.dtype, (4,), self.out.dtype
        plan.used, plan.traffic = 0, Traffic(bytes_sent=16, bytes_received=12, messages=2)
        plan.result, plan.copy_result = self.out, None
        self.ring, self.communicator = StandInRing(), StandInCommunicator()
        self.table = {self.key(self.x, self.out): plan}
        self.in_python, self.after = [], []
        self.shortcut = compiled.shortcut(self.table, self.ring, self.communicator, StandInPlan, HOST,
                                          self._in_python, self._after, YIELD)

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


def test_a_result_the_plan_owns_is_copied() -> None:
    rig = Rig()
    rig.plan.copy_result = lambda result: ("copy of", result)
    assert rig.call() == ("copy of", rig.out)


@pytest.mark.parametrize("change", ["timeout per call", "other arrays", "shape", "dtype", "another thread",
                                    "in flight", "not a plan", "not compiled", "program released", "device plan",
                                    "unhashable op"])
def test_anything_else_goes_to_python_untouched(change: str) -> None:
    rig = Rig()
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
        rig.table[rig.key(rig.x, rig.out)] = object()
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

    assert compiled.shortcut({}, StandInRing(), StandInCommunicator(), StandInPlan, HOST, in_python, None,
                             YIELD) is in_python
