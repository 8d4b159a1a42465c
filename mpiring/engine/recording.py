"""Recording: a call's steps taken once without a message moving, kept, and replayed.

There is one recording type (`Recording`) with two bindings, which differ only in how a replay
finds its buffers:

    bound by layout (host: mpiring.engine.schedule.Schedule)
        a buffer is (root, byte offset): root 0 the call's x, root 1 its out, the others its own;
        any arrays of the recorded layout bind to it, and each run posts at base + offset
    bound for life (device: mpiring.engine.plan.Plan)
        its messages are persistent requests on the very buffers it was recorded with, its work
        the backend's kernels on them; only those arrays replay it

Both are recorded the same way, by this module's `Recorder` standing in for the transport while
the collective's generator runs (`drive`):

    Ring.post(step)        ─►  (POST, step)     the binding makes the step's messages
    backend.copy / combine ─►  (WORK, Work)     a copy, a reduction or avg's division
    the generator yields   ─►  (WAIT, step)     the end of an exchange

and fused the same way (`fuse`) into work before the first message, then exchanges:

    exchange = post a step's messages ─► copies while they fly ─► wait ─► check sizes ─► work

Both replay through the same few methods (`length`, `step`, `prologue`, `start`, `finish`,
`run_result`): mpiring.engine.run runs them, in C where compiled (mpiring.engine.native).

A call shape is recorded only the second time it comes (`SeenOnce` stands for the first), so a
program that never repeats one keeps its unrecorded cost and fills no cache.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy

from mpiring.backend import NUMPY
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Step, Steps, Traffic, without_posted
from mpiring.ops import AVG

POST, WAIT, WORK = 0, 1, 2
Action = tuple[int, Any]  # (POST, Step) | (WAIT, Step) | (WORK, Work or a callable)
_NDARRAY = numpy.ndarray


class Unschedulable(Exception):
    """The call cannot be recorded as exchanges (its steps overlap, or work other than a host
    copy runs while messages fly, or it touches memory outside its roots)."""


class Work:
    """A recorded copy (out <- a), reduction (out <- a op b), avg's division (out <- a / divisor),
    or the check that a layout is the one recorded (`expected`, the bytes of arrays[0])."""

    __slots__ = ("kind", "op", "arrays", "divisor", "expected")

    def __init__(self, kind: str, op: str | None, arrays: tuple, divisor: int = 0, expected: bytes = b"") -> None:
        self.kind, self.op, self.arrays, self.divisor = kind, op, arrays, divisor  # arrays: (out, a[, b])
        self.expected = expected


class Exchange:
    """One exchange: its step (requests, statuses and peers for the waits), its messages (where
    the binding names them itself), the copies done while they fly and the work once they have
    arrived: as the C replay takes them (`during`, `after`) and as the Python replay runs them
    (`during_in_python`, `after_in_python`)."""

    __slots__ = ("step", "messages", "during", "after", "during_in_python", "after_in_python")

    def __init__(self, step: Step, messages: tuple, during: tuple, after: tuple) -> None:
        self.step, self.messages, self.during, self.after = step, messages, during, after
        self.during_in_python = self.after_in_python = ()


class Recorder:
    """Stands in for the transport while a call is recorded (Ring.recorder). Its binding makes
    each posted step (`binding.post`), names the buffers a collective allocates itself
    (`binding.own`) and says what a layout round does (`binding.layout_known`)."""

    def __init__(self, ring: Ring, binding: Any) -> None:
        self.ring = ring
        self.binding = binding
        self.actions: list[Action] = []
        self.traffic = Traffic()
        self.unwaited: list[Step] = []  # posted, not yet waited for
        self.messages: dict[int, tuple] = {}  # id(step) -> its messages, where the binding names them
        self.allocated = 0  # bytes of outputs and scratch the recording allocated itself
        # what a backend's recording keeps across the steps of one call (the staged path's pinned blocks)
        self.shared: dict[Any, Any] = {}
        self._after: dict[int, list[Callable[[], Any]]] = {}  # id(step) -> work recorded right after its WAIT

    def post(self, backend: Any, tag: int, sends: Any, receives: Any, traffic: Traffic | None = None) -> Step:
        return self.binding.post(self, backend, tag, sends, receives, self.traffic if traffic is None else traffic)

    def posted(self, step: Step, messages: tuple = ()) -> Step:
        """Record a step the binding made (its messages, where it names them)."""
        if messages:
            self.messages[id(step)] = messages
        self.unwaited.append(step)
        self.actions.append((POST, step))
        return step

    def wait(self, step: Step) -> None:
        self.unwaited = without_posted(self.unwaited, step, "recording")
        self.actions.append((WAIT, step))
        for work in self._after.pop(id(step), ()):
            self.work(work)

    def work(self, work: Work | Callable[[], Any]) -> None:
        self.actions.append((WORK, work))

    def after_wait(self, step: Step, works: list[Callable[[], Any]]) -> None:
        """Record `works` right after `step` is waited for (a staged step's copies to the device)."""
        self._after[id(step)] = works

    def own(self, array: Any) -> None:
        """A buffer of the call's own (scratch, Ring.metadata)."""
        self.binding.own(array)

    def layout_known(self, table: numpy.ndarray, finish: Callable[..., Any]) -> None:
        """A layout round has brought its table (Ring.after_layout)."""
        self.binding.layout_known(table, finish)


class RecordingBackend:
    """A backend as a recording sees it: allocation happens now (by the binding's `allocate`, and
    the array is the recording's own); copies, reductions and avg's division are recorded as
    `Work`, to run on every replay."""

    def __init__(self, inner: Any, recorder: Recorder, allocate: Callable[[Any, Any], Any]) -> None:
        self._inner = inner
        self._recorder = recorder
        self._allocate = allocate
        self.name, self.xp, self.staged = inner.name, inner.xp, inner.staged
        self.on_device = inner is not NUMPY

    def __getattr__(self, name: str) -> Any:  # is_array, flat, may_share_memory, messages...
        return getattr(self._inner, name)

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        array = self._allocate(shape, dtype)
        self._recorder.allocated += array.nbytes
        self._recorder.own(array)
        return array

    def combine(self, op: str, a: Any, b: Any, out: Any) -> None:
        self._recorder.work(Work("op", op, (out, a, b)))

    def finish(self, op: str, buf: Any, world_size: int) -> None:
        if op == AVG and buf.size:
            self._recorder.work(Work("divide", None, (buf, buf), world_size))

    def copy(self, dst: Any, src: Any) -> None:
        self._recorder.work(Work("copy", None, (dst, src)))


def drive(recorder: Recorder, steps: Steps) -> Any:
    """Take a generator's steps into `recorder` (Ring.recorder while it runs: no message moves)
    until it returns; its return value. Every step it posted is waited for at the end."""
    try:
        step = next(steps)
        while True:
            recorder.wait(step)
            step = steps.send(None)
    except StopIteration as finished:
        result = finished.value
    for step in list(recorder.unwaited):  # every request must be complete before the next run
        recorder.wait(step)
    return result


def fuse(recorder: Recorder) -> tuple[list[Any], list[Exchange]]:
    """The recorded actions as prologue work, then exchanges (post a step, copies in flight, wait
    for it, work after it). Raises Unschedulable where they are not: a step posted before the
    previous one was waited for (the pipelined algorithms), or work in flight other than a host
    copy (that work runs with requests active, so it must be work that cannot fail on the arrays
    the replay checked: a failure would leave them active behind the caller's back)."""
    actions = recorder.actions
    prologue, i = _works_from(actions, 0)
    exchanges = []
    while i < len(actions):
        kind, step = actions[i]
        if kind != POST:
            raise Unschedulable("a step waited for out of order")
        during, i = _works_from(actions, i + 1)
        if not (i < len(actions) and actions[i][0] == WAIT and actions[i][1] is step):
            raise Unschedulable("steps that overlap")
        if not all(_host_copy(work) for work in during):
            raise Unschedulable("work other than a host copy while messages are in flight")
        after, i = _works_from(actions, i + 1)
        exchanges.append(Exchange(step, recorder.messages.get(id(step), ()), tuple(during), tuple(after)))
    return prologue, exchanges


def _host_copy(work: Any) -> bool:
    return type(work) is Work and work.kind == "copy" and all(type(a) is _NDARRAY for a in work.arrays)


def _works_from(actions: list[Action], i: int) -> tuple[list[Any], int]:
    """The WORK actions from `i` on, and the index of the first action that is not one."""
    works = []
    while i < len(actions) and actions[i][0] == WORK:
        works.append(actions[i][1])
        i += 1
    return works, i


class Recording:
    """A recorded call: its exchanges, replayed by mpiring.engine.run (in C where `compiled`).
    The bindings (Schedule, Plan) name the buffers: each posts its messages (`start_messages`)
    and gives its result (`run_result`); the rest is here."""

    compiled: Any = None  # its C form (a native Program), None where it replays in Python

    def __init__(self, call: Any, traffic: Traffic, allocated: int) -> None:
        self.call = call
        self.traffic = traffic  # what one run hands to MPI
        self.allocated = allocated  # bytes of outputs and scratch it allocated itself
        self.pinned = 0  # users that replay its messages themselves (the cache never evicts it then)
        self.exchanges: tuple[Exchange, ...] | None = ()
        self.prologue_works: tuple = ()  # as the C replay takes them
        self.prologue_in_python: tuple = ()  # as the Python replay runs them
        # whether a run receives any bytes: only then can it have taken a peer's abandoned data
        self.receives = False

    def _exchanges_from(self, prologue: tuple, exchanges: list[Exchange],
                        in_python: Callable[[Any], Any] | None = None) -> None:
        """Keep the fused exchanges, their work as the C replay takes it; the Python replay runs
        `in_python` of each work (the same work where None)."""
        def python_form(works: tuple) -> tuple:
            return works if in_python is None else tuple(map(in_python, works))

        self.prologue_works = prologue
        self.prologue_in_python = python_form(prologue)
        for exchange in exchanges:
            exchange.during_in_python = python_form(exchange.during)
            exchange.after_in_python = python_form(exchange.after)
        self.exchanges = tuple(exchanges)
        self.receives = any(nbytes for exchange in exchanges for _, nbytes, _ in exchange.step.receives)

    # ---- what mpiring.engine.run runs ----

    @property
    def length(self) -> int | None:
        """Its exchanges; None where its steps overlap (a plan that runs as its actions)."""
        return None if self.exchanges is None else len(self.exchanges)

    def step(self, index: int) -> Step:
        return self.exchanges[index].step

    def prologue(self) -> None:
        self.do(self.prologue_in_python)

    def start(self, index: int) -> None:
        """Post exchange `index`'s messages, then do its copies in flight."""
        self.start_messages(index)
        self.do(self.exchanges[index].during_in_python)

    def finish(self, index: int) -> None:
        """The work once exchange `index` has arrived (its sizes checked)."""
        self.do(self.exchanges[index].after_in_python)

    def do(self, works: tuple) -> None:
        """Work in the Python replay: calls (of the arrays bound now)."""
        for work in works:
            work()

    def take_bound_arrays(self) -> None:
        """The Python replay is to carry on a run whose arrays the C replay bound itself (a
        recording bound for life has none to take)."""

    def start_messages(self, index: int) -> None:
        raise NotImplementedError

    def run_result(self) -> Any:
        raise NotImplementedError

    def free(self) -> None:
        """Let its buffers go (it must not be running)."""
        if self.compiled is not None:
            self.compiled.release()
            self.compiled = None
        self.exchanges, self.prologue_works, self.prologue_in_python = (), (), ()


class SeenOnce:
    """A call shape seen once: the next call of it records it, unless recording failed once
    (`recordable` False: it runs unrecorded without trying again). A shape found by its arrays'
    identity (a device call) holds them by weak references: the next call with the same live
    arrays records it, and no recording keeps dead arrays alive."""

    __slots__ = ("used", "recordable", "changes", "x", "out")
    allocated = 0
    pinned = 0

    def __init__(self, changes: int = 0, x: Any = None, out: Any = None) -> None:
        self.used = 0
        self.recordable = True
        self.changes = changes  # layouts its key's schedules have seen change (Schedule.after_change)
        self.x = None if x is None else weakref.ref(x)
        self.out = None if out is None else weakref.ref(out)

    def seen(self, x: Any, out: Any) -> bool:
        """Whether these are the arrays it saw (a shape found by identity)."""
        return (x is None or (self.x is not None and self.x() is x)) and (
            out is None or (self.out is not None and self.out() is out))

    def free(self) -> None:
        pass
