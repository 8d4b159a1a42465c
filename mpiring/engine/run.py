"""Running a call to its end, blocking:

    run_to_end(ring, steps, call)           an unrecorded call's generator
    run_recorded(ring, recorded, timeout)   a schedule (host) or plan (device), bound, once
    replay_in_python(ring, hot, schedule, ...)  a cached call in the Python replay, bound here
    run_exchanges, resume_exchanges         a recorded call's exchanges from one of them on (also
                                            a persistent request's wait, mpiring.engine.requests)

A recorded call is a schedule (mpiring.engine.schedule) or a device plan (mpiring.engine.plan);
both offer the same few methods (`length`, `step`, `prologue`, `start`, `finish`, `run_result`),
and run here the same way: in C where compiled (mpiring.engine.native), else `run_exchanges`.

An unrecorded call waits in mpiring.engine.waiting (`wait_step`), which also
advances every nonblocking collective in flight, and which raises `CollectiveTimeout` naming the
peers still outstanding. A run that raises a timeout or a communication error leaves its requests
with the ring (`Ring.abandon`): MPI may still write into their buffers.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from mpiring.engine import native
from mpiring.engine.recording import POST, WAIT
from mpiring.engine.ring import Ring
from mpiring.engine.schedule import RESULT_NONE, RESULT_OUT, ROOT_OUT, ROOT_X, bindable
from mpiring.engine.transport import Call, Steps, mpi_error
from mpiring.engine.waiting import (
    as_loss,
    c_spin,
    checked_sizes,
    no_notice,
    notice_from,
    poll,
    raise_left,
    wait_step,
)
from mpiring.errors import CollectiveTimeout, CommunicationError

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


def count_traffic(ring: Ring, recorded: Any) -> None:
    ring.traffic.add(recorded.traffic)


def run_recorded(ring: Ring, recorded: Any, timeout: float | None) -> Any:
    """Run a schedule (bound to this call's arrays) or a plan once, blocking, and return its result.

    Every recorded blocking call Python runs comes here, so its common case (compiled, nothing
    else in flight) calls the C replay directly: each Python call and attribute costs tens of ns."""
    call = recorded.call
    call.timeout = timeout
    ring.traffic.add(recorded.traffic)  # count_traffic, inline
    program, stopped = recorded.compiled, None
    try:
        if recorded.exchanges is None:  # a plan whose steps overlap
            call.step = 0
            for kind, item in recorded.actions:
                if kind == POST:
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
            spin = c_spin(timeout)
            stopped = program.run(0, False, spin)
    except native.LayoutChanged:
        return run_to_end(ring, *recorded.after_change(ring, timeout))
    except (CollectiveTimeout, CommunicationError) as error:
        ring.abandon(call, error, recorded)  # its requests may still be active: keep their buffers
        raise
    if stopped is not None:
        return resume_recorded(ring, recorded, timeout, stopped, spin)
    return recorded.run_result()


def replay_in_python(ring: Ring, hot: Any, schedule: Any, x: Any, out: Any, timeout: float | None) -> Any:
    """A cached call in the Python replay, with nothing else in flight: what `Program.call` does
    in C (mpiring.engine.native), in one function, for each layer costs a small call's time. It
    binds x and out, counts the call in `hot`, runs the exchanges, lets the arrays go and looks
    for a peer's notice. NotImplemented, with nothing changed, where the arrays cannot be bound.
    The schedule has no C form (`compiled` None), so its binding is the Python replay's alone."""
    if not bindable(x, out, schedule.own_offset):  # (schedule.fits, inline)
        return NotImplemented
    hot.calls = calls = hot.calls + 1
    schedule.bind(x, out, calls)
    call = schedule.call
    call.timeout = timeout
    ring.traffic.add(schedule.traffic)  # count_traffic, inline
    try:
        if schedule.prologue_in_python:
            schedule.prologue()
        _exchanges_in_python(ring, schedule, 0, False, 0.0)
        kind = schedule.result_kind  # (schedule.run_result, inline)
        result = None if kind == RESULT_NONE else schedule.out if kind == RESULT_OUT else schedule.x
    except native.LayoutChanged:
        result = run_to_end(ring, *schedule.after_change(ring, timeout))
    except (CollectiveTimeout, CommunicationError) as error:
        ring.abandon(call, error, schedule)  # it stays bound: MPI may still use the arrays
        raise
    roots = schedule.flat_roots  # (schedule.unbind, inline)
    schedule.x = schedule.out = roots[ROOT_X] = roots[ROOT_OUT] = None
    # it took data: none may come from a call a peer left (schedule.no_notice, inline)
    if schedule.notice >= 0:
        peer = notice_from(ring, schedule.notice_now, calls)
        if peer >= 0:
            raise_left(ring, call.collective, call.algorithm, calls, peer)
    return result


def resume_recorded(ring: Ring, recorded: Any, timeout: float | None, stopped: tuple[int, int, int],
                    spin: float) -> Any:
    """Finish a run the C replay handed back (`stopped`, after `spin` seconds of waiting there),
    as run_recorded would have: by run_recorded, or by the C Shortcut of a cached call
    (native.shortcut), which does not set the call's timeout itself."""
    recorded.call.timeout = timeout
    try:
        resume_exchanges(ring, recorded, stopped, spin)
    except native.LayoutChanged:
        return run_to_end(ring, *recorded.after_change(ring, timeout))
    except (CollectiveTimeout, CommunicationError) as error:
        ring.abandon(recorded.call, error, recorded)
        raise
    return recorded.run_result()


def run_exchanges(ring: Ring, recorded: Any, first: int, started: bool) -> None:
    """Run the exchanges from `first` on (`started`: that one's messages already are) with
    nothing else in flight: small calls are paid in Python time, so this is the lean path. A run
    from the very beginning (first 0, not started) does the prologue first. A compiled one runs
    in C, which hands back the exchange that needs Python (resume_exchanges)."""
    if recorded.compiled is not None:
        spin = c_spin(recorded.call.timeout)
        stopped = recorded.compiled.run(first, started, spin)
        if stopped is not None:
            resume_exchanges(ring, recorded, stopped, spin)
        return
    if first == 0 and not started and recorded.prologue_in_python:
        recorded.prologue()
    _exchanges_in_python(ring, recorded, first, started, 0.0)


def resume_exchanges(ring: Ring, recorded: Any, stopped: tuple[int, int, int], spin: float,
                     calls: int | None = None) -> None:
    """Carry on where the C replay stopped: an exchange still incomplete after `spin` seconds
    goes on in Python (waiting.poll); a wrong size or an MPI error raises, and so does a peer's
    notice that it left the call (numbered `calls`: the blocking call now by default)."""
    first, reason, code = stopped
    if reason == native.STOPPED_CHANGED:
        raise native.LayoutChanged
    if reason == native.STOPPED_NOTICE:  # the run is complete; a peer's notice came meanwhile
        no_notice(ring, recorded.call.collective, recorded.call.algorithm, calls)
        return
    if reason != native.STOPPED_WAITING:
        _raise_stopped(ring, recorded, first, code)
    recorded.take_bound_arrays()
    _exchanges_in_python(ring, recorded, first, True, spin)


def _exchanges_in_python(ring: Ring, recorded: Any, first: int, started: bool, waited: float) -> None:
    """The replay loop, per exchange: start it and do its work in flight; then one Waitall, or
    with a timeout one Testall and, if the step is not done yet, waiting.poll (`waited`: seconds
    already spent on exchange `first`); then the size checks and the work after it."""
    call = recorded.call
    timeout = call.timeout
    exchanges, post = recorded.exchanges, recorded.start_messages
    for index in range(first, len(exchanges)):
        exchange = exchanges[index]
        step = exchange.step
        requests, statuses = step.requests, step.statuses
        call.step = index
        try:
            if index > first or not started:
                post(index)  # recorded.start, inline: its messages, then its work in flight
                for work in exchange.during_in_python:
                    work()
            if timeout is None:
                _waitall(requests, statuses)
            elif not _testall(requests, statuses):  # not there yet: wait, until the timeout
                poll(ring, step, statuses, call, waited if index == first else 0.0)
        except MPI.Exception as error:  # a message larger than its receive
            raise as_loss(ring, call, mpi_error(ring.rank, call, error, step, statuses)) from error
        for position, expected, _ in step.receives:
            if statuses[position].Get_count(_BYTE) != expected:
                checked_sizes(ring, step, statuses, call)  # raises, naming the sender
        for work in exchange.after_in_python:  # recorded.finish, inline
            work()


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
                       "Python does not see (a bug in mpiring.engine.native)")
