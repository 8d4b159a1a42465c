"""Schedules: a recording (mpiring.engine.recording) bound by layout: what a blocking host call
does, recorded once per layout and bound to each call's arrays when it runs.

    building (once per layout)                         running (every call, in C or in Python)
    the collective's generator, with a recorder:
      a message   ─► (root, offset, bytes, peer, tag)     posted at base[root] + offset
      a copy, op  ─► (kind, op, dtype, refs, length)      done on the bound buffers
      a yield     ─► the end of an exchange               waited for (mpiring.engine.waiting)

A buffer is named by its root and a byte offset in it: root 0 is the call's x, root 1 its out
(the caller's out=, or an array made for each call), the others arrays the schedule owns
(scratch). A schedule is keyed by what decides its messages and arithmetic (`layout_key`): the
collective, op, root, counts and algorithm, the dtypes and shapes of x and out, and whether out
is x. Any arrays of that layout bind to it, so a new input, a view or a new output each call all
replay it; binding checks each array's memory as it is now (contiguous, writable where written,
of the recorded size, and x and out apart or the same).

A schedule is a sequence of exchanges: post a step's messages (receives first), do the copies
that may run while they fly, wait for them, check the bytes received, do the arithmetic. The
C replay (mpiring.engine.native, replay_c/run.c) and the Python one (mpiring.engine.run drives
it; here its messages are posted on the bound arrays at (bytes, offset), and its work runs from
specs decoded once, native.python_form) are the same loop; where the C replay stops (a long
wait, a wrong size, an MPI error) the Python one carries on.

Building sends no message: a schedule only records calls whose layout every rank knows alone, so
one rank may replay while another builds, and they still agree on every message.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy
from mpi4py import MPI

from mpiring.backend import NUMPY
from mpiring.engine import native
from mpiring.engine.recording import Recorder, Recording, RecordingBackend, Unschedulable, Work, drive, fuse
from mpiring.engine.ring import Ring
from mpiring.engine.tags import number_field
from mpiring.engine.transport import Call, Step, Traffic
from mpiring.engine.waiting import notice_from, raise_left
from mpiring.ops import UFUNC_NAMES

ROOT_X, ROOT_OUT = 0, 1
RESULT_NONE, RESULT_OUT, RESULT_X = 0, 1, 2
Ref = tuple[int, int]  # (root, byte offset); root -1: no memory (a zero-byte buffer)
_NOWHERE: Ref = (-1, 0)
_NDARRAY = numpy.ndarray


def layout_key(collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any, algorithm: Any) -> tuple:
    """What a blocking call's schedule is found by (the C Shortcut builds the same tuple)."""
    return (collective, op, root, counts, algorithm,
            None if x is None else x.dtype, None if x is None else x.shape,
            None if out is None else out.dtype, None if out is None else out.shape,
            x is out and x is not None)


def _extent(a: numpy.ndarray) -> tuple[int, int]:
    """The byte range [low, high) an array's elements span."""
    start = a.__array_interface__["data"][0]
    low = high = start
    for extent, stride in zip(a.shape, a.strides, strict=True):
        if extent == 0:
            return start, start
        reach = (extent - 1) * stride
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return low, high + a.itemsize


class _Roots:
    """The arrays a schedule's buffers live in, while it is recorded: x, out and its own."""

    def __init__(self, x: Any, out: Any) -> None:
        self.arrays: list[Any] = [x, out]
        self.ranges: list[tuple[int, int] | None] = [None if a is None else _extent(a) for a in (x, out)]

    def own(self, array: numpy.ndarray) -> None:
        if not any(array is known for known in self.arrays):
            self.arrays.append(array)
            self.ranges.append(_extent(array))

    def ref(self, a: Any) -> Ref:
        """`a`'s root and its byte offset there; zero-byte buffers live nowhere."""
        if type(a) is not _NDARRAY:
            raise Unschedulable(f"a buffer that is not a NumPy array ({type(a).__name__})")
        if a.nbytes == 0:
            return _NOWHERE
        low, high = _extent(a)
        for root, span in enumerate(self.ranges):
            if span is not None and span[0] <= low and high <= span[1]:
                return root, a.__array_interface__["data"][0] - span[0]
        raise Unschedulable("a buffer outside the call's arrays and its own")


class _Message:
    __slots__ = ("index", "receive", "array", "nbytes", "peer", "tag", "ref")

    def __init__(self, index: int, receive: bool, array: Any, peer: int, tag: int) -> None:
        self.index, self.receive, self.array, self.peer, self.tag = index, receive, array, peer, tag
        self.nbytes = array.nbytes
        self.ref: Ref = _NOWHERE


class _LayoutPoint(Exception):
    """The recording of a layout round has reached its table (Ring.after_layout)."""

    def __init__(self, table: numpy.ndarray, finish: Callable[..., Any]) -> None:
        super().__init__("a layout round recorded")
        self.table, self.finish = table, finish


class _ByLayout:
    """How a schedule's recorder makes a step: its messages named by the buffers they will be
    posted at (root and offset, once recorded); the call's own buffers become roots."""

    def __init__(self, roots: _Roots) -> None:
        self.roots = roots

    def post(self, recorder: Recorder, backend: Any, tag: int, sends: Any, receives: Any, counted: Traffic) -> Step:
        if getattr(backend, "on_device", False) or getattr(backend, "staged", False):
            raise Unschedulable("device buffers")
        step, messages = Step(), []
        for buf, source in receives:
            messages.append(_Message(len(step.requests), True, buf, source, tag))
            step.receives.append((len(step.requests), buf.nbytes, source))
            step.requests.append(MPI.Request())
            step.peers.append(("receive from", source))
            counted.bytes_received += buf.nbytes
        for buf, dest in sends:
            messages.append(_Message(len(step.requests), False, buf, dest, tag))
            step.requests.append(MPI.Request())
            step.peers.append(("send to", dest))
            counted.bytes_sent += buf.nbytes
            counted.messages += 1
        if step.receives:
            step.statuses = [MPI.Status() for _ in step.requests]
        return recorder.posted(step, tuple(messages))

    def own(self, array: numpy.ndarray) -> None:
        self.roots.own(array)

    def layout_known(self, table: numpy.ndarray, finish: Callable[..., Any]) -> None:
        raise _LayoutPoint(table, finish)


class _Layout:
    """What a schedule with a layout round keeps to finish a call whose layout changed: the table
    the round fills (one of its roots), the rest of the call for any table, and the call's tag and
    algorithm as they were before the algorithm was chosen for the recorded layout."""

    __slots__ = ("table", "finish", "tag", "algorithm")

    def __init__(self, table: numpy.ndarray, finish: Callable[..., Any], tag: int, algorithm: str) -> None:
        self.table, self.finish, self.tag, self.algorithm = table, finish, tag, algorithm


class Schedule(Recording):
    """A recording bound by layout: to each call's arrays when it runs (module docstring)."""

    layout_keyed = True  # the cache mirrors its C form for the Shortcut (mpiring.engine.cache)

    def __init__(self, ring: Ring, call: Call, recorder: Recorder, roots: _Roots, x: Any, out: Any,
                 result: Any, layout: _Layout | None = None) -> None:
        super().__init__(call, recorder.traffic, recorder.allocated)
        self.layout = layout  # a call with a layout round: what finishes it for another layout
        self.key: tuple | None = None  # its key in the cache (Communicator)
        self.changes = 0  # layouts its key's schedules have seen change (after_change)
        self.stale = False  # a layout round brought another layout: the key records anew
        self._changed_at = 0  # `runs` when its layout last changed
        self.comm, self.notice_comm, self.notice_board = ring.comm, ring.notice_comm, ring.notice_board
        self._used = self._runs = 0
        # what a run returns; and for a call without out=, what makes its result
        self.result_kind, self.allocate = self._result_of(roots, x, out, result)
        self.x_bytes = 0 if x is None else x.nbytes
        self.out_bytes = 0 if out is None else out.nbytes
        if self.allocate is not None:
            self.out_bytes = roots.arrays[ROOT_OUT].nbytes
        # elements of each (the C replay's check of an array it reads the fields of)
        self.items = (0 if x is None else x.size, roots.arrays[ROOT_OUT].size if self.allocate is not None
                      else 0 if out is None else out.size)
        self.owned = tuple(roots.arrays[2:])
        # the Python replay's roots: flat views of the arrays bound now (x, out) and of its own
        self.flat_roots: list[numpy.ndarray | None] = [None if a is None else _flat(a) for a in roots.arrays]
        prologue, exchanges = fuse(recorder)
        for exchange in exchanges:
            for message in exchange.messages:
                message.ref = roots.ref(message.array)
                message.tag -= call.tag
                message.array = None  # bound per call from here on
            exchange.during = self._works_of(exchange.during, roots)
            exchange.after = self._works_of(exchange.after, roots)
        self._exchanges_from(self._works_of(prologue, roots), exchanges, partial(_in_python, self.flat_roots))
        self.flat_roots[ROOT_X] = self.flat_roots[ROOT_OUT] = None
        # how the Python replay posts each exchange's messages: (request index, Irecv or Isend,
        # root, (bytes, byte offset) in it, peer, tag past the call's)
        self._posts = tuple(tuple((m.index, ring.comm.Irecv if m.receive else ring.comm.Isend, m.ref[0],
                                   (m.nbytes, m.ref[1]), m.peer, m.tag) for m in exchange.messages)
                            for exchange in exchanges)
        # where in out a bound x may lie rather than apart from it (-1: nowhere): `_own_block`
        self.own_offset = -1 if self.allocate is not None or not self.x_bytes else _own_block(self)
        self.x = self.out = None  # the arrays bound now (the Python replay's; the C one keeps its own)
        self.tags = ring.tags
        # how each call's number goes into its blocking tag and its notice's (a persistent
        # request's own tag carries none: only its notice does)
        self.sequence = ring.tags.numbering(ring.blocking_tag(0, numbered=False))
        notice = ring.tags.notice(ring.failures) if self.receives and self.sequence[2] else None
        self.notice = -1 if notice is None else notice  # looked for after each run (waiting.no_notice)
        self.notice_now = self.notice  # the notice of the blocking run bound now (`bind` numbers it)
        self._tag_field = number_field(self.sequence, call.tag)  # (what `bind` numbers them by)
        self._notice_field = number_field(self.sequence, self.notice)
        self.compiled = native.program(self, ring.busy_poll)

    @staticmethod
    def _result_of(roots: _Roots, x: Any, out: Any, result: Any) -> tuple[int, Callable[[], Any] | None]:
        """What a run returns, and how a call without out= gets a new result array."""
        if result is None:
            return RESULT_NONE, None
        if out is not None and result is out:
            return RESULT_OUT, None
        if x is not None and result is x:
            return RESULT_X, None
        if out is None and type(result) is _NDARRAY:
            for root in range(2, len(roots.arrays)):
                if roots.arrays[root] is result:  # the result the collective allocated: made anew per call
                    roots.arrays[ROOT_OUT], roots.ranges[ROOT_OUT] = result, roots.ranges[root]
                    roots.arrays[root], roots.ranges[root] = None, None
                    return RESULT_OUT, _allocator(result.shape, result.dtype)
        raise Unschedulable("a result the call's arrays do not hold")

    def _works_of(self, works: tuple | list, roots: _Roots) -> tuple:
        """Recorded work as the C replay takes it (native.work_spec), or a call on views of the
        bound arrays for what only NumPy does exactly. Work on empty arrays does nothing: dropped."""
        done = []
        for work in works:
            if type(work) is not Work:
                raise Unschedulable("work a backend recorded as a call")
            if work.kind == "expect":
                done.append(native.expect_spec(roots.ref(work.arrays[0]), work.expected))
                continue
            if any(a.size == 0 for a in work.arrays):
                continue
            refs = tuple(roots.ref(a) for a in work.arrays)
            spec = native.work_spec(work.kind, work.op, work.arrays, refs, work.divisor)
            if spec is None:
                views = tuple((*ref, a.shape, a.strides, a.dtype) for ref, a in zip(refs, work.arrays, strict=True))
                spec = partial(_work_on_views, self, work.kind, work.op, views, work.divisor)
            done.append(spec)
        return tuple(done)

    # ---- the cache's bookkeeping ----

    @property
    def used(self) -> int:
        """When it last ran, in its communicator's calls (the cache evicts the least recent)."""
        return self.compiled.used if self.compiled is not None else self._used

    @used.setter
    def used(self, now: int) -> None:
        if self.compiled is not None:
            self.compiled.used = now
        self._used = now

    @property
    def runs(self) -> int:
        """Blocking calls that ran it (in C or in Python)."""
        return self._runs + (self.compiled.runs if self.compiled is not None else 0)

    def free(self) -> None:
        super().free()
        self.flat_roots, self._posts = [], ()

    # ---- binding ----

    def fits(self, x: Any, out: Any) -> bool:
        """Whether arrays of its layout key (so of its recorded sizes) can be bound (`bindable`).
        Otherwise the call runs unrecorded."""
        return bindable(x, out, self.own_offset)

    def bind(self, x: Any, out: Any, calls: int | None = None) -> None:
        """Bind a call's arrays (checked by `fits`): out is made here when the call gives none.
        With `calls`, a blocking run numbered so: its tag and its notice's carry the number, and
        it counts as a run, used now (the cache's date)."""
        if out is None and self.allocate is not None:
            out = self.allocate()
        program = self.compiled
        if calls is not None:
            self._runs += 1
            first, mask, shift = self._tag_field  # (tags.numbered, inline)
            tag = self.call.tag = first + ((calls & mask) << shift)
            first, mask, shift = self._notice_field  # (-1, none: stays -1)
            self.notice_now = first + ((calls & mask) << shift)
            if calls:  # (0: messages alone, numbered so on every rank: `messages_only`)
                self._used = calls  # (`used`, inline)
            if program is not None:
                program.tag = tag
                if calls:
                    program.used = calls
        self.x, self.out = x, out
        if program is not None:  # (it reads their addresses itself)
            program.bind(x, out, None, None)
        # the Python replay posts its messages and does its work on flat views of them
        roots = self.flat_roots
        roots[ROOT_X] = x if x is None or x.ndim == 1 else x.reshape(-1)
        roots[ROOT_OUT] = out if out is None or out.ndim == 1 else out.reshape(-1)

    def no_notice(self, ring: Ring) -> None:
        """Raise if a peer left the blocking run bound last (waiting.no_notice, for its tag and number)."""
        peer = notice_from(ring, self.notice_now, self._used)
        if peer >= 0:
            raise_left(ring, self.call.collective, self.call.algorithm, self._used, peer)

    def unbind(self) -> None:
        self.x = self.out = None
        self.flat_roots[ROOT_X] = self.flat_roots[ROOT_OUT] = None
        if self.compiled is not None:
            self.compiled.unbind()

    def bound_roots(self) -> tuple:
        """The arrays the roots stand for now: x and out as bound (by the C Shortcut or by `bind`), then its own."""
        program = self.compiled
        if program is not None:
            return (program.x, program.out, *self.owned)
        return (self.x, self.out, *self.owned)

    def after_change(self, ring: Ring, timeout: float | None) -> tuple[Any, Call]:
        """The rest of the bound call, whose layout round brought another layout than the recorded
        one, as an unrecorded call finishes (its generator's steps for this layout, and the call they
        run as: run.run_to_end runs them). The schedule goes stale: its key records the layout now
        in use at its next call, unless its layouts keep changing at once (then every call finishes
        this way)."""
        # a layout kept for a few calls starts the count again; one that changes at once adds to it
        runs = self.runs
        kept, self._changed_at = runs - self._changed_at - 1, runs  # replays of one layout before this one
        self.changes = 0 if kept >= STABLE_RUNS else self.changes + 1
        self.stale = self.changes <= RERECORD_LIMIT

        roots = self.bound_roots()
        layout = self.layout
        call = Call(self.call.collective, layout.algorithm, self.tags.with_sequence(layout.tag, ring.calls), timeout)
        out = None if self.allocate is not None else roots[ROOT_OUT]  # the caller's out=, if it gave one
        return layout.finish(ring, NUMPY, call, roots[ROOT_X], out, layout.table), call

    def run_result(self) -> Any:
        """What the run bound last returns."""
        kind = self.result_kind
        if kind == RESULT_NONE:
            return None
        bound = self.compiled if self.compiled is not None else self  # (bound_roots, inline)
        return bound.out if kind == RESULT_OUT else bound.x

    # ---- the Python replay (run.run_exchanges drives it; replay_c/run.c does the same) ----

    def take_bound_arrays(self) -> None:
        program = self.compiled
        roots = self.flat_roots
        roots[ROOT_X] = None if program.x is None else _flat(program.x)
        roots[ROOT_OUT] = None if program.out is None else _flat(program.out)

    def start_messages(self, index: int) -> None:
        program = self.compiled
        if program is not None:
            native.start(program, index)
            return
        requests, tag, roots = self.exchanges[index].step.requests, self.call.tag, self.flat_roots
        for position, post, root, span, peer, tag_offset in self._posts[index]:
            requests[position] = post([_EMPTY if root < 0 else roots[root], span, _BYTE], peer, tag + tag_offset)

    def messages_only(self, x: Any, out: Any) -> Any:
        """Its messages alone, compiled and bound to these arrays (requests.MessagesOnly); None in Python."""
        program = native.program(self, self.compiled is not None and self.compiled.busy, with_work=False)
        if program is not None:
            if out is None and self.allocate is not None:
                out = self.allocate()
            program.bind(x, out, None, None)
        else:  # numbered as call 0, as the C form is (native.program)
            self.bind(x, out, 0)
        return program


_EMPTY = numpy.empty(0, numpy.uint8)
_BYTE = MPI.BYTE


# How often in a row a key's layout may change within STABLE_RUNS calls of being recorded before
# its schedule stops being recorded anew for the layout in use (a program whose layouts alternate
# would otherwise record at every call; one that keeps each layout a while records each once).
RERECORD_LIMIT = 4
STABLE_RUNS = 2


def bindable(x: Any, out: Any, own_offset: int = -1) -> bool:
    """Whether a schedule can be bound to these arrays: NumPy arrays, C-contiguous, out writable,
    x and out the same array or apart, or x at `own_offset` bytes into out (Schedule.own_offset)."""
    if x is not None and not (x.__class__ is _NDARRAY and x.flags.c_contiguous):
        return False
    if out is None:
        return True
    if out.__class__ is not _NDARRAY:
        return False
    flags = out.flags
    if not (flags.c_contiguous and flags.writeable):
        return False
    # two arrays that each own their memory are apart (cheaper to tell than their bounds)
    if x is None or x is out or (flags.owndata and x.flags.owndata) or not numpy.may_share_memory(x, out):
        return True
    return own_offset >= 0 and _address(x) - _address(out) == own_offset

def inside(x: Any, out: Any) -> bool:
    """Whether x lies wholly inside out (both C-contiguous NumPy arrays, x not out): an in-place
    call's own block, which a schedule may bind where it was recorded with x apart (`_own_block`)."""
    if not (x.__class__ is _NDARRAY and out.__class__ is _NDARRAY and x is not out and x.flags.c_contiguous
            and out.flags.c_contiguous and out.flags.writeable and x.nbytes):
        return False
    start = _address(x) - _address(out)
    return 0 <= start and start + x.nbytes <= out.nbytes


def _address(a: numpy.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _own_block(schedule: Schedule) -> int:
    """Where in out a bound x may lie (an in-place gather's own block), or -1. Its copies of x
    into out must all land at one offset; then x may be that range of out if nothing writes x and
    nothing writes that range but those copies, each a copy of x's bytes onto themselves, which
    binding it there makes nothing (replay_c/work.c skips it): x reads as recorded throughout."""
    works = [*schedule.prologue_works]
    for exchange in schedule.exchanges:
        works += [*exchange.during, *exchange.after]
    offsets = {work[3][1] - work[4][1] for work in works
               if not callable(work) and work[0] == native.WORK_COPY and work[3][0] == ROOT_OUT
               and work[4][0] == ROOT_X}
    if len(offsets) != 1:
        return -1
    own = offsets.pop()
    low, high = own, own + schedule.x_bytes

    def reaches(root: int, offset: int, nbytes: int) -> bool:  # writes x, or out's range of x
        return root == ROOT_X or (root == ROOT_OUT and offset < high and low < offset + nbytes)

    for exchange in schedule.exchanges:
        if any(m.receive and reaches(m.ref[0], m.ref[1], m.nbytes) for m in exchange.messages):
            return -1
    for work in works:
        if callable(work):  # work on views: written at its first view's root
            if work.args[3][0][0] in (ROOT_X, ROOT_OUT):
                return -1
            continue
        kind, _, dtype_code, (root, offset), a, _, n = work[:7]
        if kind == native.WORK_EXPECT:
            continue
        nbytes = n if kind == native.WORK_COPY else n * native.itemsize(dtype_code)
        if reaches(root, offset, nbytes) and not (kind == native.WORK_COPY and a[0] == ROOT_X
                                                   and offset - a[1] == own):
            return -1
    return own


def _flat(a: numpy.ndarray) -> numpy.ndarray:
    return a if a.ndim == 1 else a.reshape(-1)


def _allocator(shape: tuple[int, ...], dtype: Any) -> Callable[[], numpy.ndarray]:
    """What makes a call's result when it gives no out=: numpy.empty itself, called from C (the
    cheapest allocation at every size: see NumpyBackend.empty)."""
    return partial(numpy.empty, shape, dtype)


def _in_python(roots: list, work: Any) -> Any:
    """Recorded work as the Python replay runs it: a C spec decoded once for these roots
    (native.python_work), done on the arrays they hold when it runs; or the call itself."""
    return work if callable(work) else native.python_work(work, roots)


def _work_on_views(schedule: Schedule, kind: str, op: str | None, views: tuple, divisor: int) -> None:
    """Work only NumPy does exactly (float min and max, float16, complex products...) on views of the bound arrays."""
    roots = schedule.bound_roots()
    arrays = [numpy.ndarray(shape, dtype, buffer=roots[root], offset=offset, strides=strides)
              for root, offset, shape, strides, dtype in views]
    if kind == "copy":
        numpy.copyto(arrays[0], arrays[1])
    elif kind == "divide":
        numpy.true_divide(arrays[1], divisor, out=arrays[0])
    else:
        getattr(numpy, UFUNC_NAMES[op])(arrays[1], arrays[2], out=arrays[0])


def build_schedule(ring: Ring, call: Call, body: Callable[[Any], Any], x: Any, out: Any,
                   seen: tuple[numpy.ndarray, Any] | None = None) -> Schedule:
    """Record the steps `body` takes for `call` on these arrays (no message moves); raises
    Unschedulable where the call cannot be one.

    A call with a layout round (`seen`: the table it brought in a real run, Ring.after_layout)
    is recorded in two parts: the round, until its table; then a check that a replay's table is
    that one, and the rest of the call for it."""
    roots = _Roots(x, out)
    recorder = Recorder(ring, _ByLayout(roots))
    # the schedule's own buffers: plain pages, which live as long as it does
    host = RecordingBackend(NUMPY, recorder, numpy.empty)
    tag, algorithm = call.tag, call.algorithm
    layout = None
    ring.recorder = recorder
    try:
        try:
            result = drive(recorder, body(host))
        except _LayoutPoint as point:
            if seen is None:
                raise Unschedulable("a layout round in a call without its layout") from None
            table, finish = point.table, point.finish
            table[:] = seen[0]
            recorder.work(Work("expect", None, (table,), expected=table.tobytes()))
            layout = _Layout(table, finish, tag, algorithm)
            result = drive(recorder, finish(ring, host, call, x, out, table))
    finally:
        ring.recorder = None
    call.step = 0
    return Schedule(ring, call, recorder, roots, x, out, result, layout)
