"""Running a collective, the same way for all three kinds of call:

    blocking       run_to_end(ring, steps, call)        an unrecorded call's generator, to its end
                   run_recorded(ring, recorded, timeout) a schedule (host) or plan (device), bound
    nonblocking    CollectiveRequest                    its generator, advanced by test() and wait()
    persistent     PersistentRequest                    its schedule or plan, or its generator, per start()

A recorded call is a schedule (mpiring.engine.schedule) or a device plan (mpiring.engine.plan);
both offer the same few methods (`length`, `step`, `prologue`, `start`, `finish`, `run_result`),
and run here the same way: in C where compiled (mpiring.engine.compiled), else `run_exchanges`.

An unrecorded call waits in mpiring.engine.waiting (`wait_step`), which also
advances every nonblocking collective in flight, and which raises `CollectiveTimeout` naming the
peers still outstanding. A run that raises a timeout or a communication error leaves its requests
with the ring (`Ring.abandon`): MPI may still write into their buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident
from typing import Any

from mpi4py import MPI

from mpiring.backend import binding
from mpiring.engine import compiled
from mpiring.engine.plan import START, WAIT, plan_steps
from mpiring.engine.transport import Call, Step, Steps, mpi_error
from mpiring.engine.waiting import (
    YIELD_SECONDS,
    as_loss,
    checked_sizes,
    is_complete,
    leave_notice,
    make_room,
    no_notice,
    poll,
    progress_others,
    wait_step,
)
from mpiring.errors import ArgumentError, CollectiveTimeout, CommunicationError, MessageMismatchError
from mpiring.ring import Ring

_testall, _waitall = MPI.Request.Testall, MPI.Request.Waitall
_BYTE = MPI.BYTE


def array_bytes(arrays: tuple) -> int:
    """The bytes a nonblocking call's (x, out) hold; an output it allocates is counted at x's size."""
    x, out = arrays
    held = getattr(x, "nbytes", 0)
    return held + getattr(out, "nbytes", held)


def run_to_end(ring: Ring, steps: Steps, call: Call) -> Any:
    """Drive an algorithm to its end, blocking; return the generator's return value."""
    step = None
    try:
        step = next(steps)
        while True:
            wait_step(ring, step, call)
            step = steps.send(None)
    except StopIteration as finished:
        return finished.value
    except (CollectiveTimeout, CommunicationError) as error:
        ring.abandon(call, error, (step, steps))  # the generator holds steps posted ahead
        raise


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
        call.number = ring.calls  # its notice, if a rank leaves it, names it
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
        if self._ring.owner != get_ident():  # only the communicator's thread (Ring.claim)
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
        if self._ring.owner != get_ident():  # only the communicator's thread (Ring.claim)
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
        if self._ring.owner != get_ident():
            self._ring.claim(self._call.collective)
        if self._error is not None:
            raise self._error
        if not self._done:
            raise RuntimeError(f"{self._call.collective} is still in flight: call wait() or test() first")
        return self._result


def count_traffic(ring: Ring, recorded: Any) -> None:
    traffic, once = ring.traffic, recorded.traffic
    traffic.bytes_sent += once.bytes_sent
    traffic.bytes_received += once.bytes_received
    traffic.messages += once.messages


def run_recorded(ring: Ring, recorded: Any, timeout: float | None) -> Any:
    """Run a schedule (bound to this call's arrays) or a plan once, blocking, and return its result.

    Every recorded blocking call Python runs comes here, so its common case (compiled, nothing
    else in flight) calls the C replay directly: each Python call and attribute costs tens of ns."""
    call = recorded.call
    call.timeout = timeout
    traffic, once = ring.traffic, recorded.traffic  # count_traffic, inline
    traffic.bytes_sent += once.bytes_sent
    traffic.bytes_received += once.bytes_received
    traffic.messages += once.messages
    program, stopped = recorded.compiled, None
    try:
        if recorded.length is None:  # a plan whose steps overlap
            call.step = 0
            for kind, item in recorded.actions:
                if kind == START:
                    item.start()
                elif kind == WAIT:
                    wait_step(ring, item, call)
                else:
                    item()
        elif ring.in_flight:
            _exchanges_advancing_others(ring, recorded)
        elif program is None:
            run_exchanges(ring, recorded, 0, started=False)
        else:
            spin = -1.0 if timeout is None else (timeout if timeout < YIELD_SECONDS else YIELD_SECONDS)
            stopped = program.run(0, False, spin)
    except compiled.LayoutChanged:
        return recorded.after_change(ring, timeout)
    except (CollectiveTimeout, CommunicationError) as error:
        ring.abandon(call, error, recorded)  # its requests may still be active: keep their buffers
        raise
    if stopped is not None:
        return resume_recorded(ring, recorded, timeout, stopped, spin)
    return recorded.run_result()


def resume_recorded(ring: Ring, recorded: Any, timeout: float | None, stopped: tuple[int, int, int],
                    spin: float) -> Any:
    """Finish a run the C replay handed back (`stopped`, after `spin` seconds of waiting there),
    as run_recorded would have: by run_recorded, or by the C Shortcut of a cached call
    (compiled.shortcut), which does not set the call's timeout itself."""
    recorded.call.timeout = timeout
    try:
        _resume(ring, recorded, stopped, spin)
    except compiled.LayoutChanged:
        return recorded.after_change(ring, timeout)
    except (CollectiveTimeout, CommunicationError) as error:
        ring.abandon(recorded.call, error, recorded)
        raise
    return recorded.run_result()


def run_exchanges(ring: Ring, recorded: Any, first: int, started: bool) -> None:
    """Run the exchanges from `first` on (`started`: that one's messages already are) with
    nothing else in flight: small calls are paid in Python time, so this is the lean path. A run
    from the very beginning (first 0, not started) does the prologue first. A compiled one runs
    in C, which hands back the exchange that needs Python (_resume)."""
    if recorded.compiled is not None:
        timeout = recorded.call.timeout
        spin = -1.0 if timeout is None else min(timeout, YIELD_SECONDS)
        stopped = recorded.compiled.run(first, started, spin)
        if stopped is not None:
            _resume(ring, recorded, stopped, spin)
        return
    if first == 0 and not started:
        recorded.prologue()
    _exchanges_in_python(ring, recorded, first, started, 0.0)


def _resume(ring: Ring, recorded: Any, stopped: tuple[int, int, int], spin: float, calls: int | None = None) -> None:
    """Carry on where the C replay stopped: an exchange still incomplete after `spin` seconds
    goes on in Python (waiting.poll); a wrong size or an MPI error raises, and so does a peer's
    notice that it left the call (numbered `calls`: the blocking call now by default)."""
    first, reason, code = stopped
    if reason == compiled.STOPPED_CHANGED:
        raise compiled.LayoutChanged
    if reason == compiled.STOPPED_NOTICE:  # the run is complete; a peer's notice came meanwhile
        no_notice(ring, recorded.call.collective, recorded.call.algorithm, calls)
        return
    if reason != compiled.STOPPED_WAITING:
        _raise_stopped(ring, recorded, first, code)
    _exchanges_in_python(ring, recorded, first, True, spin)


def _exchanges_in_python(ring: Ring, recorded: Any, first: int, started: bool, waited: float) -> None:
    """The replay loop, per exchange: start it and do its work in flight; then one Waitall, or
    with a timeout one Testall and, if the step is not done yet, waiting.poll (`waited`: seconds
    already spent on exchange `first`); then the size checks and the work after it."""
    call = recorded.call
    timeout = call.timeout
    for index in range(first, recorded.length):
        step = recorded.step(index)
        requests, statuses = step.requests, step.statuses
        call.step = index
        try:
            if index > first or not started:
                recorded.start(index)
            if timeout is None:
                _waitall(requests, statuses)
            elif not _testall(requests, statuses):  # not there yet: wait, until the timeout
                poll(ring, step, statuses, call, waited if index == first else 0.0)
        except MPI.Exception as error:  # a message larger than its receive
            raise as_loss(ring, call, mpi_error(ring.rank, call, error, step, statuses)) from error
        for position, expected, _ in step.receives:
            if statuses[position].Get_count(_BYTE) != expected:
                checked_sizes(ring, step, statuses, call)  # raises, naming the sender
        recorded.finish(index)


def _exchanges_advancing_others(ring: Ring, recorded: Any) -> None:
    """The replay while nonblocking collectives are in flight: each wait advances them too."""
    call = recorded.call
    recorded.prologue()
    for index in range(recorded.length):
        call.step = index
        recorded.start(index)
        wait_step(ring, recorded.step(index), call)
        recorded.finish(index)


def _raise_stopped(ring: Ring, recorded: Any, index: int, code: int) -> None:
    """The compiled replay stopped at exchange `index` on an MPI error (`code`) or a receive of
    the wrong size; the exchange's statuses are in its MPI.Status objects: raise the error."""
    call = recorded.call
    step = recorded.step(index)
    call.step = index
    if code:
        raise as_loss(ring, call, mpi_error(ring.rank, call, MPI.Exception(code), step, step.statuses))
    checked_sizes(ring, step, step.statuses, call)
    raise RuntimeError(f"{call.collective}: the compiled replay saw a wrong byte count in step {index} that "
                       "Python does not see (a bug in mpiring.engine.compiled)")


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


class PersistentRequest:
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

    # slots: the C start() and wait() (compiled.persistent_shortcut) read and write some by offset
    __slots__ = {
        "start": "Begin a run (the previous one must have completed).",
        "wait": "Block until the run started last completes; return its result.",
        **dict.fromkeys(("_ring", "_call", "_recorded", "_replay", "_started", "_run", "_position", "_running",
                         "_freed", "_error", "holds", "_spin", "_bound")),
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
        timeout = call.timeout  # how long the C replay spins before Python's poll takes over
        self._spin = -1.0 if timeout is None else min(timeout, YIELD_SECONDS)
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

    def take_shortcut(self, engine: Any) -> None:
        """Start and wait in C where they can (a compiled schedule or plan, the lean paths below;
        its communicator checked as `started` checks it, which must not compare calls, MPIRING_CHECK)."""
        recorded = self._recorded
        if recorded is not None and recorded.length is not None:
            self.start, self.wait = compiled.persistent_shortcut(
                self, engine, self._ring, recorded.compiled, self._call, self._spin) or (self.start, self.wait)

    @property
    def arrays(self) -> tuple:
        """The (x, out) the request was made with (Communicator's aliasing check)."""
        return self._call.arrays

    def _start_in_python(self) -> None:
        if self._ring.owner != get_ident():  # only the communicator's thread (Ring.claim)
            self._ring.claim(self._call.collective)
        if self._freed or self._running:
            self._refuse_start()
        self._started()  # the run takes its number on every rank, refused here or not
        self._call.number = self._ring.calls
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
        if self._ring.owner != get_ident():  # only the communicator's thread (Ring.claim)
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
        if ring.owner != get_ident():  # only the communicator's thread (Ring.claim)
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
            _resume(self._ring, self._recorded, stopped, self._spin, self._call.number)
        except (CollectiveTimeout, CommunicationError) as error:
            self._abandon(error)
            raise
        return self._recorded.run_result()

    @property
    def result(self) -> Any:
        """The result once test() has returned True (or wait() returned)."""
        if self._ring.owner != get_ident():
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
        if self._ring.owner != get_ident():
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
