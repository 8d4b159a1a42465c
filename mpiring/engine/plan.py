"""Device plans: a recording (mpiring.engine.recording) bound for life to one call's device arrays.

Host calls are schedules (mpiring.engine.schedule), bound to new arrays every call. A call on
device buffers on the direct path (a CUDA-aware MPI reads them: the plan synchronizes the
compute stream before every step, as Ring.post does, and runs the backend's own kernels) or on
the staged path (the backend records each step itself, as rounds of host segments and the copies
around them: mpiring.gpu.staging.record_staged_step) is a plan instead: its messages are
persistent MPI requests bound to the very buffers (`Send_init`/`Recv_init`; under Open MPI the
sends are made anew each run, see Ring.persistent_sends), its work device kernels bound to them.
So a plan is found by the identity of its arrays, and replayed only on those.

    recording (once)                              running (each call)
    algorithm posts a step     ─►  POST step      step.start(): MPI Startall
    backend.copy before yield  ─►  WORK f         f() while the step's messages are in flight
    algorithm yields the step  ─►  WAIT step      Waitall, or waiting.poll with a timeout
    backend.combine / copy     ─►  WORK f         f(): a kernel on the bound buffers

A plan whose steps overlap (a step posted before the previous one is waited for) runs as its
actions in order, in Python. Only calls whose buffers and layout are known on every rank without
asking the others are planned: a plan is built without sending a message.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from functools import partial
from typing import Any

import numpy
from mpi4py import MPI

from mpiring.backend import NUMPY, NumpyBackend, binding
from mpiring.engine import native
from mpiring.engine.recording import (
    POST,
    WAIT,
    WORK,
    Action,
    Exchange,
    Recorder,
    Recording,
    RecordingBackend,
    Unschedulable,
    Work,
    drive,
    fuse,
)
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Call, Step, Steps, Traffic, make_step
from mpiring.ops import AVG, UFUNC_NAMES


class _ForLife:
    """How a plan's recorder makes a step: persistent requests on the very buffers (a staged
    backend records its rounds itself); a device step waits for the kernels queued before it."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.requests: list[MPI.Prequest] = []  # the persistent ones, freed with the plan

    def post(self, recorder: Recorder, backend: Any, tag: int, sends: Any, receives: Any, counted: Traffic) -> Step:
        if backend is not NUMPY:  # (barriers and headers post host buffers through NUMPY itself)
            if backend.staged:  # the backend records its step itself (the staged path's segments)
                return backend.record_step(recorder, tag, sends, receives)
            if backend.on_device:  # kernels queued so far must be done before MPI touches these buffers
                recorder.work(backend.ready_for_mpi)
        ring = self.ring
        step = make_step(ring.comm, backend, tag, sends, receives, counted, persistent=True,
                         persistent_sends=ring.persistent_sends)
        if step.receives:
            step.statuses = [MPI.Status() for _ in step.requests]
        self.requests.extend(request for request in step.requests if request)
        return recorder.posted(step)

    def own(self, array: Any) -> None:
        pass  # a plan holds its buffers by its work and requests

    def layout_known(self, table: Any, finish: Callable[..., Any]) -> None:
        pass  # every rank knew the layout: the call goes on to its rest


class Plan(Recording):
    """A recording bound for life to one call's arrays (module docstring), and what a run needs
    besides it. The plan holds the caller's input and output arrays, so neither can be freed (and
    its address reused by another array) while the persistent requests point into it."""

    def __init__(self, call: Call, recorder: Recorder, requests: list[MPI.Prequest], result: Any,
                 backend: NumpyBackend, busy_poll: bool) -> None:
        super().__init__(call, recorder.traffic, recorder.allocated)
        # its actions with each Work as a call of its backend: how a plan whose steps overlap runs
        self.actions: list[Action] = [(kind, _as_call(item, backend) if kind == WORK else item)
                                      for kind, item in recorder.actions]
        try:
            prologue, exchanges = fuse(recorder)
        except Unschedulable:  # steps that overlap: it runs as its actions (length None)
            self.exchanges = None
            self.receives = any(kind == POST and item.receives for kind, item in self.actions)
        else:
            for exchange in exchanges:
                exchange.during = tuple(_as_call(work, backend) for work in exchange.during)
                exchange.after = tuple(_as_call(work, backend) for work in exchange.after)
            self._exchanges_from(tuple(_as_call(work, backend) for work in prologue), exchanges)
        # the exchanges replayed in C, if built
        self.compiled = native.plan_program(self, self.prologue_works, self.exchanges, busy_poll)
        if self.compiled is not None:  # its steps start in C too: cheaper than mpi4py's Startall of a
            for index, exchange in enumerate(self.exchanges):  # list, and sends made anew keep their handles
                exchange.step.start = partial(native.start, self.compiled, index)
        self.result = result
        if self.compiled is not None:  # what its C wait returns (a persistent request's result)
            self.compiled.bind(None, result, 0, 0)
        self.backend = backend  # the arrays' (a device array's may change with MPIRING_CUDA_AWARE: rebuilt then)
        # a new array with the contents of the one given, made by that backend (on the array's GPU)
        self.copy_of = numpy.ndarray.copy if backend is NUMPY else partial(_copy_with, backend)
        # set when the result lives in the plan: each call then returns copy_result(result)
        self.copy_result: Callable[[Any], Any] | None = None
        self.requests = requests
        self.used = 0  # when it last ran, in its communicator's calls (the cache evicts the least recent)
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

    def start_messages(self, index: int) -> None:
        self.exchanges[index].step.start()

    def messages_only(self, x: Any, out: Any) -> Any:
        """Its messages alone, compiled (requests.MessagesOnly); None where it replays in Python."""
        if self.compiled is None:
            return None
        bare = tuple(Exchange(exchange.step, exchange.messages, (), ()) for exchange in self.exchanges)
        return native.plan_program(self, (), bare, self.compiled.busy)

    def run_result(self) -> Any:
        """What a blocking run returns: the result, or a copy where the plan owns it."""
        return self.result if self.copy_result is None else self.copy_result(self.result)

    def free(self) -> None:
        """Release the persistent requests (the plan must not be running: its sends made anew are done)."""
        for request in self.requests:
            request.Free()
        self.requests = []
        self.actions = []
        super().free()


def _dtype(array: Any) -> Any:
    return None if array is None else array.dtype


def _as_call(work: Any, backend: Any) -> Callable[[], Any]:
    """Recorded work as a plan runs it: a device backend's own kernel (with its GPU current), or
    on the host the NumPy function itself (which the C replay recognises); other work is a call already."""
    if type(work) is not Work:
        return work
    out, a = work.arrays[0], work.arrays[1]
    if backend is not NUMPY and not (type(out) is numpy.ndarray and type(a) is numpy.ndarray):
        if work.kind == "copy":
            return partial(backend.copy, out, a)
        if work.kind == "divide":
            return partial(backend.finish, AVG, out, work.divisor)
        return partial(backend.combine, work.op, a, work.arrays[2], out)
    if work.kind == "copy":
        return partial(numpy.copyto, out, a)
    if work.kind == "divide":
        return partial(numpy.true_divide, a, work.divisor, out=out)
    return partial(getattr(numpy, UFUNC_NAMES[work.op]), a, work.arrays[2], out=out)


def build_plan(ring: Ring, backend: NumpyBackend, call: Call, body: Callable[[Any], Steps]) -> Plan:
    """Record the steps `body(backend)` would take for `call` (no message moves)."""
    binding_for_life = _ForLife(ring)
    recorder = Recorder(ring, binding_for_life)
    ring.recorder = recorder
    try:
        result = drive(recorder, body(RecordingBackend(backend, recorder, backend.empty)))
        plan = Plan(call, recorder, binding_for_life.requests, result, backend, ring.busy_poll)
    except BaseException:
        for request in binding_for_life.requests:
            request.Free()
        raise
    finally:
        ring.recorder = None
    call.step = 0
    return plan


def _copy_with(backend: NumpyBackend, array: Any) -> Any:
    """A copy of `array` made by its backend (a device array's on its own GPU, not the current one)."""
    copy = backend.empty(array.shape, array.dtype)
    backend.copy(copy, array)
    return copy


def plan_steps(plan: Plan) -> Generator[Step, None, Any]:
    """A plan run as a generator of steps: how a nonblocking or persistent request runs it."""
    for kind, item in plan.actions:
        if kind == WAIT:
            yield item
        elif kind == POST:
            item.start()
        else:
            item()
    return plan.result
