"""The requests of nonblocking and persistent collectives, and the benchmark's messages-only replay:

    nonblocking    CollectiveRequest    its generator, advanced by test() and wait()
    persistent     PersistentRequest    its schedule or plan, or its generator, per start()
    benchmark      MessagesOnly         a recorded call's messages alone (its ceiling)

A request advances only inside test() and wait(), its own or another's on its communicator
(mpiring.engine.waiting advances every collective in flight): no helper thread. A recorded run's
exchanges run as a blocking call's do (mpiring.engine.run), in C where compiled
(mpiring.engine.native).
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident
from typing import Any

from mpi4py import MPI

from mpiring.backend import binding
from mpiring.engine import native
from mpiring.engine.plan import plan_steps
from mpiring.engine.ring import Ring
from mpiring.engine.run import array_bytes, count_traffic, resume_exchanges, run_exchanges
from mpiring.engine.transport import Call, Step, Steps
from mpiring.engine.waiting import (
    c_spin,
    is_complete,
    leave_notice,
    make_room,
    no_notice,
    progress_others,
    wait_step,
)
from mpiring.errors import ArgumentError, CollectiveTimeout, CommunicationError, MessageMismatchError

_waitall = MPI.Request.Waitall


class CollectiveRequest:
    """A collective in flight. It advances only inside test() and wait(): no helper thread.

    Several may be in flight at once on one communicator (each call has its own tag), and may be
    waited for in any order on any rank: while one waits, the others in flight advance too.
    A request that raised is over: it leaves the set in flight, and every later test(), wait()
    or `result` raises the same error again (never a result).
    """

    def __init__(self, ring: Ring, steps: Steps, call: Call) -> None:
        self._ring = ring
        self._steps = steps
        self._call = call
        self.holds = array_bytes(call.arrays)
        if ring.in_flight:  # only then is there anything to do (small calls are paid in Python time)
            make_room(ring, self.holds)
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._step: Step | None = None
        call.number = ring.hot.calls  # its notice, if a rank leaves it, names it
        self._advance()
        if ring.in_flight:
            progress_others(ring)  # requests tested once and dropped finish as later calls come
        if not self._done:
            ring.in_flight.append(self)

    @property
    def arrays(self) -> tuple:
        """The (x, out) the call was given (Communicator's aliasing check)."""
        return self._call.arrays

    def _advance(self) -> None:
        try:
            self._step = next(self._steps)
        except StopIteration as finished:
            self._done, self._result, self._step = True, finished.value, None
            self._leave()
            try:  # none of its data may come from a call a peer left
                no_notice(self._ring, self._call.collective, self._call.algorithm, self._call.number)
            except MessageMismatchError as error:
                self._result = None
                self._fail(error)
                raise
        except BaseException as error:  # the collective raised (a mismatch every rank found): it is over
            self._fail(error)
            raise

    def _leave(self) -> None:
        """Leave the communicator's set of collectives in flight, so later waits skip it."""
        if self in self._ring.in_flight:
            self._ring.in_flight.remove(self)

    def _fail(self, error: BaseException) -> None:
        """The collective raised: it is over, and `error` is all it will ever give. An error that
        may leave its messages in flight breaks the ring, which keeps the step's buffers alive."""
        if isinstance(error, (CollectiveTimeout, CommunicationError)):
            self._ring.abandon(self._call, error, (self._step, self._steps))
            leave_notice(self._ring, error, self._call.number)  # a peer that completes it raises instead of returning
        self._done, self._error, self._step = True, error, None
        self._leave()

    def test(self) -> bool:
        """Make what progress is possible without blocking; True once the collective is done.

        It raises only what wait() would raise at the same point (it never waits, so never a
        timeout), and once it has raised, test(), wait() and `result` raise that error again."""
        if self._ring.hot.owner != get_ident():  # only the communicator's thread (Ring.claim)
            self._ring.claim(self._call.collective)
        if self._error is not None:
            raise self._error
        if self._done:
            return True
        progress_others(self._ring, self)  # as wait() does: the ranks may test in different orders
        return self.progress()

    def progress(self) -> bool:
        """test() for the thread already inside this ring (a wait that advances the others)."""
        try:
            while not self._done and is_complete(self._ring, self._step, self._call):
                self._advance()
        except (CollectiveTimeout, CommunicationError) as error:
            if self._error is None:
                self._fail(error)
            raise
        return self._done

    def wait(self) -> Any:
        """Block until the collective is done and return its result (None for barrier)."""
        if self._ring.hot.owner != get_ident():  # only the communicator's thread (Ring.claim)
            self._ring.claim(self._call.collective)
        if self._error is not None:
            raise self._error
        if self._done:
            return self._result
        try:
            while not self._done:
                wait_step(self._ring, self._step, self._call, self)
                self._advance()
        except (CollectiveTimeout, CommunicationError) as error:
            if self._error is None and not self._done:
                self._fail(error)
            raise
        return self._result

    @property
    def done(self) -> bool:
        """Whether the collective is over (completed, or raised), as last seen by test() or wait()."""
        return self._done

    @property
    def result(self) -> Any:
        """The collective's result once test() has returned True (or wait() returned)."""
        if self._ring.hot.owner != get_ident():
            self._ring.claim(self._call.collective)
        if self._error is not None:
            raise self._error
        if not self._done:
            raise RuntimeError(f"{self._call.collective} is still in flight: call wait() or test() first")
        return self._result


class MessagesOnly:
    """A replay of a recorded call's messages alone, step by step, without its arithmetic, checks
    or bookkeeping: the benchmark's ceiling, what the transport allows for the schedule that
    actually ran, replayed as its calls replay it (in C where compiled, so that a call is not
    measured against a slower ceiling). A schedule's messages are bound to `x` and `out`. The
    entry stays pinned in its cache (never evicted) until `release()`."""

    def __init__(self, recorded: Any, x: Any = None, out: Any = None) -> None:
        self._recorded = recorded
        recorded.pinned += 1
        self._compiled = recorded.messages_only(x, out)

    def __call__(self) -> None:
        if self._compiled is not None:
            self._compiled.run(0, False, -1.0)
            return
        recorded = self._recorded
        for index in range(recorded.length):
            recorded.start_messages(index)
            step = recorded.step(index)
            _waitall(step.requests)

    def release(self) -> None:
        self._recorded.pinned -= 1
        if self._compiled is not None:
            self._compiled.release()


class PersistentRequest(native.RequestFields):
    """A collective made once and started many times (MPI-4's persistent collectives).

    `start()` begins a run; `test()` and `wait()` then behave as a nonblocking collective's
    request, and `wait()` returns the result; a run that raised gives only that error (test(),
    wait() and `result` raise it again) until the next start(). Every rank must start its requests, and call its
    other collectives, in the same order. The arrays given when it was made are bound to it:
    change their contents between runs, not the arrays. `free()` releases it.

    A recorded request (its own schedule, bound to its arrays for life, or a device plan) runs
    its exchanges itself (start the next when one completes); any other (an unrecorded call, or
    a plan whose steps overlap) runs through a CollectiveRequest each start. A compiled one may
    have start() and wait() in C (`take_shortcut`).
    """

    # _freed, _running, _position, _error and _run are RequestFields': C fields where the C start()
    # and wait() (native.persistent_shortcut) read and write them
    __slots__ = {
        "start": "Begin a run (the previous one must have completed).",
        "wait": "Block until the run started last completes; return its result.",
        **dict.fromkeys(("_ring", "_call", "_recorded", "_replay", "_started", "holds", "_spin", "_bound")),
    }

    def __init__(self, ring: Ring, call: Call, recorded: Any | None,
                 replay: Callable[[], Steps] | None, started: Callable[[], None]) -> None:
        self._ring = ring
        self._call = call
        self._recorded = recorded  # None: an unrecorded call, replayed through its generator each start
        self._replay = replay
        self._started = started  # the communicator's per-call checks (broken, freed, thread, count)
        self._run: CollectiveRequest | None = None  # a generator-driven run
        self._position = -1  # a recorded run: the exchange in flight (-1: never started)
        self._running = False
        self._freed = False
        self._error: BaseException | None = None  # what the last run raised: it gives nothing else
        self.holds = array_bytes(call.arrays)  # counted against Ring.in_flight_bytes while it runs
        self._spin = c_spin(call.timeout)
        self._bound = self._binding()  # what each start finds unchanged in its arrays
        self.start, self.wait = self._start_in_python, self._wait_in_python

    def _arrays(self) -> tuple:
        """x and out as its runs read and write them (a recording's own out= where none was given)."""
        recorded = self._recorded
        return self._call.arrays if recorded is None else (recorded.x, recorded.out)

    def _binding(self) -> tuple:
        return tuple(binding(array) for array in self._arrays())

    def _check_binding(self) -> None:
        """Refuse a start whose arrays were restrided, resized, reshaped, retyped or made
        read-only since the request was made: its runs are bound to them as they were."""
        now = self._binding()
        if now != self._bound:
            name = "x" if now[0] != self._bound[0] else "out"
            array = self._arrays()[0 if name == "x" else 1]
            kind = "its result" if name == "out" and self._call.arrays[1] is None else name
            raise ArgumentError(self._call.collective, name, f"{kind} was restrided, resized, reshaped, retyped or "
                                f"made read-only since this persistent request was made (now {_described(array)}): "
                                "its runs read and write the memory it had then; make a new request")

    def take_shortcut(self, hot: Any) -> None:
        """Start and wait in C where they can (a compiled schedule or plan, the lean paths below;
        its communicator, whose HotState is `hot`, checked as `started` checks it, which must not
        compare calls, MPIRING_CHECK)."""
        recorded = self._recorded
        if recorded is not None and recorded.length is not None:
            handlers = (self._start_in_python, self._wait_in_python, self._failed_start, self._resume_wait)
            self.start, self.wait = native.persistent_shortcut(
                self, hot, recorded.compiled, self._call, self._spin, handlers) or (self.start, self.wait)

    @property
    def arrays(self) -> tuple:
        """The (x, out) the request was made with (Communicator's aliasing check)."""
        return self._call.arrays

    def _start_in_python(self) -> None:
        if self._ring.hot.owner != get_ident():  # only the communicator's thread (Ring.claim)
            self._ring.claim(self._call.collective)
        if self._freed or self._running:
            self._refuse_start()
        self._started()  # the run takes its number on every rank, refused here or not
        self._call.number = self._ring.hot.calls
        try:
            self._check_binding()
        except ArgumentError as error:  # for good: its peers' messages for this run are on its tag
            self.free()
            self._error = error
            raise
        ring, call, recorded = self._ring, self._call, self._recorded
        if ring.in_flight:  # only then is there anything to do (small calls are paid in Python time)
            make_room(ring, self.holds)
        call.step = 0
        self._running, self._error = True, None
        if recorded is None or recorded.length is None:
            if recorded is not None:
                count_traffic(ring, recorded)
                steps = plan_steps(recorded)
            else:
                steps = self._replay()
            self._run = None
            self._run = self._run_step(lambda: CollectiveRequest(ring, steps, call))
            self._running = not self._run.done
            return
        count_traffic(ring, recorded)
        self._position = 0
        try:
            if recorded.compiled is not None and not ring.in_flight:  # the lean path: one call into C
                code = recorded.compiled.begin()
                if code:
                    self._failed_start(code)
            else:
                recorded.prologue()
                if ring.in_flight:
                    progress_others(ring)  # requests tested once and dropped finish as later calls come
                if recorded.length:
                    recorded.start(0)
        except BaseException as error:
            self._running, self._error = False, error
            raise
        if recorded.length:
            ring.in_flight.append(self)
        else:
            self._running = False

    def _failed_start(self, failure: BaseException | int) -> None:
        """The run's start raised `failure` (or MPI returned that error code): this run gives only it."""
        error = MPI.Exception(failure) if isinstance(failure, int) else failure
        self._running, self._error = False, error
        raise error

    def _refuse_start(self) -> None:
        collective = self._call.collective
        if isinstance(self._error, ArgumentError):  # a start refused: so is every later one
            raise self._error
        if self._freed:
            raise RuntimeError(f"this persistent {collective} request was freed")
        raise RuntimeError(f"this persistent {collective} request is still running: "
                           "wait() for it before starting it again")

    def progress(self) -> bool:
        """Advance as far as possible without blocking (waiting.wait_step calls it for requests in
        flight while another one waits); True once the run is complete."""
        if self._run is not None:
            self._running = not self._run_step(self._run.progress)
            return not self._running
        recorded, ring, call = self._recorded, self._ring, self._call
        try:
            while self._running and is_complete(ring, recorded.step(self._position), call):
                self._next()
        except (CollectiveTimeout, CommunicationError) as error:
            self._abandon(error)
            raise
        return not self._running

    def test(self) -> bool:
        """True once the run started last has completed (advancing it, never blocking)."""
        if self._ring.hot.owner != get_ident():  # only the communicator's thread (Ring.claim)
            self._ring.claim(self._call.collective)
        self._check_started()
        if not self._running:
            return True
        progress_others(self._ring, self)  # as wait() does: the ranks may test in different orders
        if self._run is not None:
            self._running = not self._run_step(self._run.test)
            return not self._running
        return self.progress()

    def _wait_in_python(self) -> Any:
        ring, call = self._ring, self._call
        if ring.hot.owner != get_ident():  # only the communicator's thread (Ring.claim)
            ring.claim(call.collective)
        self._check_started()
        if self._run is not None:
            self._run_step(self._run.wait)
            self._running = False
            return self._run.result
        recorded = self._recorded
        if self._running:
            try:
                in_flight = ring.in_flight
                if len(in_flight) == 1 and in_flight[0] is self:  # nothing else to advance: the lean path
                    in_flight.clear()
                    self._running = False
                    run_exchanges(ring, recorded, self._position, started=True)
                    self._no_notice()
                while self._running:
                    wait_step(ring, recorded.step(self._position), call, self)
                    self._next()
            except (CollectiveTimeout, CommunicationError) as error:
                self._abandon(error)
                raise
        return recorded.run_result()

    def _resume_wait(self, stopped: tuple[int, int, int]) -> Any:
        """The C wait's replay stopped (waiting too long, a wrong size, an MPI error): Python carries on."""
        try:
            resume_exchanges(self._ring, self._recorded, stopped, self._spin, self._call.number)
        except (CollectiveTimeout, CommunicationError) as error:
            self._abandon(error)
            raise
        return self._recorded.run_result()

    @property
    def result(self) -> Any:
        """The result once test() has returned True (or wait() returned)."""
        if self._ring.hot.owner != get_ident():
            self._ring.claim(self._call.collective)
        self._check_started()
        if self._run is not None:
            return self._run.result
        if self._running:
            raise RuntimeError(f"{self._call.collective} is still in flight: call wait() or test() first")
        return self._recorded.run_result()

    def free(self) -> None:
        """Release the request's MPI resources (not while a run is in flight). Only from the
        communicator's thread, or once that thread has ended (Ring.claim_to_free)."""
        if self._ring.hot.owner != get_ident():
            self._ring.claim_to_free(self._call.collective)
        if self._running:
            raise RuntimeError(f"this persistent {self._call.collective} request is still running: wait() first")
        if not self._freed and self._recorded is not None:
            self._recorded.free()
        self._freed = True

    def _next(self) -> None:
        """The exchange in flight has completed: do its work, start the next one."""
        recorded = self._recorded
        recorded.finish(self._position)
        self._position += 1
        if self._position < recorded.length:
            recorded.start(self._position)
        else:
            self._running = False
            self._ring.in_flight.remove(self)
            self._no_notice()

    def _no_notice(self) -> None:
        """A run that received data raises if a peer left it (see waiting.no_notice)."""
        if self._recorded.receives:
            no_notice(self._ring, self._call.collective, self._call.algorithm, self._call.number)

    def _run_step(self, advance: Callable[[], Any]) -> Any:
        """Advance a generator-driven run; what it raises ends this run (the request's error)."""
        try:
            return advance()
        except BaseException as error:
            self._running, self._error = False, error
            raise

    def _abandon(self, error: BaseException) -> None:
        self._running, self._error = False, error
        if self in self._ring.in_flight:
            self._ring.in_flight.remove(self)
        self._ring.abandon(self._call, error, self._recorded)  # keeps its buffers: MPI may still write them
        leave_notice(self._ring, error, self._call.number)  # a peer that completes this run raises instead of returning

    def _check_started(self) -> None:
        """Raise what the last run raised, or that there was no run yet."""
        if self._error is not None:
            raise self._error
        if self._position < 0 and self._run is None:
            raise RuntimeError(f"this persistent {self._call.collective} request was never started: call start()")


def _described(array: Any) -> str:
    flags = getattr(array, "flags", None)
    contiguous = "C-contiguous" if getattr(flags, "c_contiguous", False) else "not C-contiguous"
    writable = "" if getattr(flags, "writeable", True) else ", read-only"
    return f"shape {getattr(array, 'shape', '?')}, {getattr(array, 'dtype', '?')}, {contiguous}{writable}"
