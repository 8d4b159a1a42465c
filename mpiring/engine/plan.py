"""Device plans: one call on device buffers, recorded once and bound to its arrays for life.

Host calls are schedules (mpiring.engine.schedule), bound to new arrays every call. A call on
device buffers on the direct path (a CUDA-aware MPI reads them: the plan synchronizes the
compute stream before every step, as Ring.post does, and runs the backend's own kernels) or on
the staged path (the backend records each step itself, as rounds of host segments and the copies
around them: mpiring.gpu.staging.record_staged_step) is a plan instead: its messages are
persistent MPI requests bound to the very buffers (`Send_init`/`Recv_init`; under Open MPI the
sends are made anew each run, see Ring.persistent_sends), its work device kernels bound to them.
So a plan is found by the identity of its arrays, and replayed only on those.

    building (once)                               running (each call)
    algorithm posts a step     ─►  START step     step.start(): MPI Startall
    backend.copy before yield  ─►  WORK f         f() while the step's messages are in flight
    algorithm yields the step  ─►  WAIT step      Waitall, or waiting.poll with a timeout
    backend.combine / copy     ─►  WORK f         f(): a kernel on the bound buffers

Only calls whose buffers and layout are known on every rank without asking the others are
planned: a plan is built without sending a message.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Generator
from functools import partial
from typing import Any

import numpy
from mpi4py import MPI

from mpiring.backend import NUMPY, NumpyBackend, binding
from mpiring.engine import native
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Call, Step, Steps, Traffic, make_step, without_posted
from mpiring.ops import AVG, UFUNC_NAMES

START, WAIT, WORK = 0, 1, 2
Action = tuple[int, Any]  # (START, Step) | (WAIT, Step) | (WORK, function)

class Plan:
    """The recorded schedule of one call shape, and what a run needs besides it.

    The plan holds the caller's input and output arrays, so neither can be freed (and its
    address reused by another array) while the persistent requests point into it.
    """

    __slots__ = ("call", "actions", "receives", "prologue_works", "exchanges", "compiled", "result", "backend",
                 "copy_of", "copy_result", "traffic", "requests", "allocated", "pinned", "used", "x", "out",
                 "dtypes", "bound")

    def __init__(self, call: Call, actions: list[Action], result: Any, traffic: Traffic,
                 requests: list[MPI.Prequest], allocated: int, backend: NumpyBackend, busy_poll: bool) -> None:
        self.call = call
        self.actions = actions
        self.traffic = traffic  # what one run hands to MPI
        self.receives = any(kind == START and item.receives for kind, item in actions)  # (Communicator: no_notice)
        # the same actions as work before the first message, then exchanges (start a step, wait
        # for it, do the work after it): the fast form, when no step is posted ahead of another
        self.prologue_works, self.exchanges = fuse(actions)
        # the exchanges replayed in C, if built
        self.compiled = native.plan_program(self, self.prologue_works, self.exchanges, busy_poll)
        if self.compiled is not None:  # its steps start in C too: cheaper than mpi4py's Startall of a
            for index, exchange in enumerate(self.exchanges):  # list, and sends made anew keep their handles
                exchange[0].start = partial(native.start, self.compiled, index)
        self.result = result
        if self.compiled is not None:  # what its C wait returns (a persistent request's result)
            self.compiled.bind(None, result, 0, 0)
        self.backend = backend  # the arrays' (a device array's may change with MPIRING_CUDA_AWARE: rebuilt then)
        # a new array with the contents of the one given, made by that backend (on the array's GPU)
        self.copy_of = numpy.ndarray.copy if backend is NUMPY else partial(_copy_with, backend)
        # set when the result lives in the plan: each call then returns copy_result(result)
        self.copy_result: Callable[[Any], Any] | None = None
        self.requests = requests
        self.allocated = allocated  # bytes of outputs and scratch it allocated itself
        self.pinned = 0  # users that replay its requests themselves (the cache never evicts it then)
        self.used = 0  # when it last ran, in its communicator's calls (PlanCache evicts the least recent)
        self.x = self.out = self.dtypes = self.bound = None

    def bind(self, x: Any, out: Any) -> None:
        """Remember the call's arrays (kept alive), and what a later call must find unchanged in them."""
        self.x, self.out = x, out
        self.dtypes = _dtype(x), _dtype(out)
        self.bound = binding(x), binding(out)
        self.copy_result = self.copy_of if out is None and self.result is not None else None

    def fits(self, x: Any, out: Any) -> bool:
        """Whether the plan's own arrays (`seen`) are as it bound them: dtype (reassigned in place),
        memory, strides, shape, writability. Otherwise it is built anew."""
        return (_dtype(x), _dtype(out)) == self.dtypes and (binding(x), binding(out)) == self.bound

    def seen(self, x: Any, out: Any) -> bool:
        """Whether these arrays are the plan's own (it no longer fits them: build it anew)."""
        return x is self.x and out is self.out

    # ---- what mpiring.engine.run runs (mpiring.engine.schedule.Schedule has the same) ----

    @property
    def length(self) -> int | None:
        """Its exchanges; None where its steps overlap (it runs as `actions`)."""
        return None if self.exchanges is None else len(self.exchanges)

    def step(self, index: int) -> Step:
        return self.exchanges[index][0]

    def prologue(self) -> None:
        for work in self.prologue_works:
            work()

    def start(self, index: int) -> None:
        start_exchange(self.exchanges[index])

    def finish(self, index: int) -> None:
        for work in self.exchanges[index][4]:
            work()

    def start_messages(self, index: int) -> None:
        self.exchanges[index][0].start()

    def messages_only(self, x: Any, out: Any) -> Any:
        """Its messages alone, compiled (requests.MessagesOnly); None where it replays in Python."""
        if self.compiled is None:
            return None
        return native.plan_program(self, (), tuple(exchange[:4] + ((), ()) for exchange in self.exchanges),
                                     self.compiled.busy)

    def run_result(self) -> Any:
        """What a blocking run returns: the result, or a copy where the plan owns it."""
        return self.result if self.copy_result is None else self.copy_result(self.result)

    def free(self) -> None:
        """Release the persistent requests (the plan must not be running: its sends made anew are done)."""
        for request in self.requests:
            request.Free()
        self.requests = []
        self.actions = []
        self.prologue_works, self.exchanges = (), None
        if self.compiled is not None:
            self.compiled.release()  # its copies of the handles are stale now
            self.compiled = None


def _dtype(array: Any) -> Any:
    return None if array is None else array.dtype


class Sighting:
    """A call shape seen once, by weak references to its arrays: the next call with the same
    live arrays builds a plan. A program that passes new arrays every call (and so could never
    reuse a plan) keeps its unplanned cost, and no plan keeps its dead arrays alive."""

    __slots__ = ("x", "out", "allocated", "used")
    pinned = 0

    def __init__(self, x: Any, out: Any) -> None:
        self.x = None if x is None else weakref.ref(x)
        self.out = None if out is None else weakref.ref(out)
        self.allocated = 0
        self.used = 0

    def seen(self, x: Any, out: Any) -> bool:
        return (x is None or (self.x is not None and self.x() is x)) and (
            out is None or (self.out is not None and self.out() is out))

    def free(self) -> None:
        pass


class Recorder:
    """Stands in for the transport while a plan is built (Ring.recorder): posts become
    persistent requests and START actions; the backend's arithmetic becomes WORK actions."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.actions: list[Action] = []
        self.traffic = Traffic()
        self.requests: list[MPI.Prequest] = []
        self.unwaited: list[Step] = []  # posted, not yet waited for
        self.allocated = 0
        # what a backend's recording keeps across the steps of one plan (the staged path's pinned blocks)
        self.shared: dict[Any, Any] = {}
        self._after: dict[int, list[Callable[[], Any]]] = {}  # id(step) -> work recorded right after its WAIT

    def post(self, backend: RecordingBackend | NumpyBackend, tag: int, sends: Any, receives: Any,
             traffic: Traffic | None = None) -> Step:
        if backend is not NUMPY:  # (barriers and headers post host buffers through NUMPY itself)
            if backend.staged:  # the backend records its step itself (the staged path's segments)
                return backend.record_step(self, tag, sends, receives)
            if backend.on_device:  # kernels queued so far must be done before MPI touches these buffers
                self.work(backend.ready_for_mpi)
        step = make_step(self.ring.comm, backend, tag, sends, receives, self.traffic if traffic is None else traffic,
                         persistent=True, persistent_sends=self.ring.persistent_sends)
        if step.receives:
            step.statuses = [MPI.Status() for _ in step.requests]
        self.requests.extend(request for request in step.requests if request)  # the persistent ones
        self.unwaited.append(step)
        self.actions.append((START, step))
        return step

    def wait(self, step: Step) -> None:
        self.unwaited = without_posted(self.unwaited, step, "plan")
        self.actions.append((WAIT, step))
        for work in self._after.pop(id(step), ()):
            self.work(work)

    def work(self, function: Callable[[], Any]) -> None:
        self.actions.append((WORK, function))

    def after_wait(self, step: Step, works: list[Callable[[], Any]]) -> None:
        """Record `works` right after `step` is waited for (a staged step's copies to the device)."""
        self._after[id(step)] = works


class RecordingBackend:
    """A backend as a plan sees it: allocation happens now; reductions, copies and the final touch
    of `avg` are recorded, with their functions resolved, to run on every call. Host arithmetic
    is recorded as the NumPy ufunc itself (which the C replay recognises); a device backend's as
    its own method, which runs the kernel with its GPU current."""

    def __init__(self, inner: NumpyBackend, recorder: Recorder) -> None:
        self._inner = inner
        self._recorder = recorder
        self.name, self.xp, self.staged = inner.name, inner.xp, inner.staged
        self.on_device = inner is not NUMPY

    def __getattr__(self, name: str) -> Any:  # is_array, flat, may_share_memory, messages...
        return getattr(self._inner, name)

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        array = self._inner.empty(shape, dtype)
        self._recorder.allocated += array.nbytes
        return array

    def combine(self, op: str, a: Any, b: Any, out: Any) -> None:
        if self.on_device:
            self._recorder.work(partial(self._inner.combine, op, a, b, out))
        else:
            self._recorder.work(partial(getattr(numpy, UFUNC_NAMES[op]), a, b, out=out))

    def finish(self, op: str, buf: Any, world_size: int) -> None:
        if op == AVG and buf.size:
            if self.on_device:
                self._recorder.work(partial(self._inner.finish, op, buf, world_size))
            else:
                self._recorder.work(partial(numpy.true_divide, buf, world_size, out=buf))

    def copy(self, dst: Any, src: Any) -> None:
        if self.on_device:
            self._recorder.work(partial(self._inner.copy, dst, src))
        else:
            self._recorder.work(partial(numpy.copyto, dst, src))


def build_plan(ring: Ring, backend: NumpyBackend, call: Call, body: Callable[[Any], Steps]) -> Plan:
    """Record the steps `body(backend)` would take for `call` (no message moves)."""
    recorder = Recorder(ring)
    ring.recorder = recorder
    try:
        steps = body(RecordingBackend(backend, recorder))
        try:
            step = next(steps)
            while True:
                recorder.wait(step)
                step = steps.send(None)
        except StopIteration as finished:
            result = finished.value
        for step in recorder.unwaited:  # every request must be complete before the next run
            recorder.wait(step)
    except BaseException:
        for request in recorder.requests:
            request.Free()
        raise
    finally:
        ring.recorder = None
    call.step = 0
    return Plan(call, recorder.actions, result, recorder.traffic, recorder.requests, recorder.allocated, backend,
                ring.busy_poll)


def _copy_with(backend: NumpyBackend, array: Any) -> Any:
    """A copy of `array` made by its backend (a device array's on its own GPU, not the current one)."""
    copy = backend.empty(array.shape, array.dtype)
    backend.copy(copy, array)
    return copy


Exchange = tuple[Step, list[MPI.Prequest], list[MPI.Status] | None, tuple[tuple[MPI.Status, int], ...],
                 tuple[Callable[[], Any], ...], tuple[Callable[[], Any], ...]]


def fuse(actions: list[Action]) -> tuple[tuple[Callable[[], Any], ...], tuple[Exchange, ...] | None]:
    """`actions` as (prologue, exchanges), each exchange (step, its requests, their statuses,
    (status, bytes expected) per receive, the work after it, the work while its messages are in
    flight). Whoever starts an exchange's messages does its work in flight next, before waiting.

    Exchanges are None when a step is posted before the previous one is waited for (the
    pipelined algorithms), or when work in flight is anything but a host copy: that work runs
    with requests active, so it must be work that cannot fail on the arrays the plan checked
    (a failure would leave them active behind the caller's back)."""
    prologue, i = _works_from(actions, 0)
    exchanges = []
    while i < len(actions):
        if actions[i][0] != START:
            return prologue, None
        step = actions[i][1]
        during, i = _works_from(actions, i + 1)
        if not (i < len(actions) and actions[i][0] == WAIT and actions[i][1] is step):
            return prologue, None
        if not all(isinstance(work, partial) and work.func is numpy.copyto for work in during):
            return prologue, None
        after, i = _works_from(actions, i + 1)
        checks = tuple((step.statuses[index], expected) for index, expected, _ in step.receives)
        exchanges.append((step, step.requests, step.statuses, checks, after, during))
    return prologue, tuple(exchanges)


def start_exchange(exchange: Exchange) -> None:
    """Start an exchange's messages, then do its work in flight (what every Python path that
    starts one does; the C replay does the same in Program.run and Program.begin)."""
    exchange[0].start()
    for work in exchange[5]:
        work()


def _works_from(actions: list[Action], i: int) -> tuple[tuple[Callable[[], Any], ...], int]:
    """The WORK actions from `i` on, and the index of the first action that is not one."""
    works = []
    while i < len(actions) and actions[i][0] == WORK:
        works.append(actions[i][1])
        i += 1
    return tuple(works), i


def plan_steps(plan: Plan) -> Generator[Step, None, Any]:
    """A plan run as a generator of steps: how a nonblocking or persistent request runs it."""
    for kind, item in plan.actions:
        if kind == WAIT:
            yield item
        elif kind == START:
            item.start()
        else:
            item()
    return plan.result
