"""Running plans: a blocking call runs its plan to the end here; a persistent request
(`Communicator.allreduce_init` and the like) starts its plan, or its generator, once per start().

Waiting happens in `Ring.wait_step`, which also advances every nonblocking collective in flight,
and which raises `CollectiveTimeout` naming the peers still outstanding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from mpiring.engine.plan import START, WAIT, WORK, Plan, plan_steps
from mpiring.errors import CollectiveTimeout, CommunicationError
from mpiring.ring import Call, CollectiveRequest, Ring, Steps, array_bytes

_startall, _testall, _waitall = MPI.Prequest.Startall, MPI.Request.Testall, MPI.Request.Waitall
_BYTE = MPI.BYTE


def count_traffic(ring: Ring, plan: Plan) -> None:
    traffic, once = ring.traffic, plan.traffic
    traffic.bytes_sent += once.bytes_sent
    traffic.bytes_received += once.bytes_received
    traffic.messages += once.messages


def run_plan(ring: Ring, plan: Plan, timeout: float | None) -> Any:
    """Run `plan` once, blocking, and return its result (a copy when the plan owns it)."""
    call = plan.call
    call.timeout = timeout
    count_traffic(ring, plan)
    try:
        if not ring.in_flight and plan.exchanges is not None:  # the common case: inline
            for work in plan.prologue:
                work()
            run_exchanges(ring, plan, 0, started=False)
        else:
            call.step = 0
            for kind, item in plan.actions:
                if kind == START:
                    _startall(item)
                elif kind == WAIT:
                    ring.wait_step(item, call)
                else:
                    item()
    except (CollectiveTimeout, CommunicationError) as error:
        ring.abandon(call, error, plan)  # its requests may still be active: keep their buffers
        raise
    return plan.result.copy() if plan.copy_result else plan.result


def run_exchanges(ring: Ring, plan: Plan, first: int, started: bool) -> None:
    """Run the plan's exchanges from `first` on (`started`: that one's requests already are)
    with nothing else in flight: small calls are paid in Python time, so this is the lean path.
    Per exchange: one Waitall, or with a timeout one Testall and, if the step is not done yet,
    Ring.poll; then the size checks and the exchange's work."""
    call = plan.call
    timeout = call.timeout
    exchanges = plan.exchanges
    for index in range(first, len(exchanges)):
        item, requests, statuses, checks, works = exchanges[index]
        call.step = index
        try:
            if index > first or not started:
                _startall(requests)
            if timeout is None:
                _waitall(requests, statuses)
            elif not _testall(requests, statuses):  # not there yet: wait, until the timeout
                ring.poll(item, statuses, call)
        except MPI.Exception as error:  # a message larger than its receive
            raise ring.mpi_error(call, error, item, statuses) from error
        for status, expected in checks:
            if status.Get_count(_BYTE) != expected:
                ring.check_sizes(item, statuses, call.collective)  # raises, naming the sender
        for work in works:
            work()


class MessagesOnly:
    """A replay of a plan's messages alone: its persistent requests started and waited for,
    step by step, without the arithmetic, the checks or the bookkeeping. The benchmark's
    ceiling: what the transport allows for the schedule that actually ran. The plan stays
    pinned in its cache (never evicted, so its requests stay valid) until `release()`."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        plan.pinned += 1
        self._messages = [(kind, item if kind == START else item.requests) for kind, item in plan.actions
                          if kind != WORK]

    def __call__(self) -> None:
        for kind, requests in self._messages:
            if kind == START:
                _startall(requests)
            else:
                _waitall(requests)

    def release(self) -> None:
        self._plan.pinned -= 1


class PersistentRequest:
    """A collective made once and started many times (MPI-4's persistent collectives).

    `start()` begins a run; `test()` and `wait()` then behave as a nonblocking collective's
    request, and `wait()` returns the result; a run that raised gives only that error (test(),
    wait() and `result` raise it again) until the next start(). Every rank must start its requests, and call its
    other collectives, in the same order. The arrays given when it was made are bound to it:
    change their contents between runs, not the arrays. `free()` releases it.

    A planned request runs its plan's exchanges itself (start the next when one completes); any
    other (an unplanned call, or a plan whose steps overlap) runs through a CollectiveRequest.
    """

    def __init__(self, ring: Ring, call: Call, plan: Plan | None,
                 replay: Callable[[], Steps] | None, started: Callable[[], None]) -> None:
        self._ring = ring
        self._call = call
        self._plan = plan  # None: an unplanned call, replayed through its generator each start
        self._replay = replay
        self._started = started  # the communicator's per-call checks (broken, freed, thread, count)
        self._run: CollectiveRequest | None = None  # a generator-driven run
        self._position = -1  # a planned run: the exchange in flight (-1: never started)
        self._running = False
        self._freed = False
        self._error: BaseException | None = None  # what the last run raised: it gives nothing else
        self.holds = array_bytes(call.arrays)  # counted against Ring.in_flight_bytes while it runs

    @property
    def arrays(self) -> tuple:
        """The (x, out) the request was made with (Communicator's aliasing check)."""
        return self._call.arrays

    def start(self) -> None:
        """Begin a run (the previous one must have completed)."""
        collective = self._call.collective
        if self._freed:
            raise RuntimeError(f"this persistent {collective} request was freed")
        if self._running:
            raise RuntimeError(f"this persistent {collective} request is still running: "
                               "wait() for it before starting it again")
        self._started()
        ring, call, plan = self._ring, self._call, self._plan
        ring.make_room(self.holds)
        call.step = 0
        self._running, self._error = True, None
        if plan is None or plan.exchanges is None:
            if plan is not None:
                count_traffic(ring, plan)
                steps = plan_steps(plan)
            else:
                call.tag = ring.next_tag()  # each replay is a new call with its own tag
                steps = self._replay()
            self._run = None
            self._run = self._run_step(lambda: CollectiveRequest(ring, steps, call))
            self._running = not self._run.done
            return
        count_traffic(ring, plan)
        for work in plan.prologue:
            work()
        self._position = 0
        ring.progress_others()  # requests tested once and dropped finish as later calls come
        if plan.exchanges:
            _startall(plan.exchanges[0][1])
            ring.in_flight.append(self)
        else:
            self._running = False

    def progress(self) -> bool:
        """Advance as far as possible without blocking (Ring.wait_step calls it for requests in
        flight while another one waits); True once the run is complete."""
        if self._run is not None:
            self._running = not self._run_step(self._run.progress)
            return not self._running
        exchanges, ring, call = self._plan.exchanges, self._ring, self._call
        try:
            while self._running and ring.is_complete(exchanges[self._position][0], call):
                self._next()
        except (CollectiveTimeout, CommunicationError) as error:
            self._abandon(error)
            raise
        return not self._running

    def test(self) -> bool:
        """True once the run started last has completed (advancing it, never blocking)."""
        self._check_started()
        if not self._running:
            return True
        self._ring.claim(self._call.collective)
        self._ring.progress_others(self)  # as wait() does: the ranks may test in different orders
        if self._run is not None:
            self._running = not self._run_step(self._run.test)
            return not self._running
        return self.progress()

    def wait(self) -> Any:
        """Block until the run started last completes; return its result."""
        self._check_started()
        ring, call = self._ring, self._call
        if self._run is not None:
            self._run_step(self._run.wait)
            self._running = False
            return self._run.result
        if self._running:
            ring.claim(call.collective)
            exchanges = self._plan.exchanges
            try:
                if ring.in_flight == [self]:  # nothing else to advance: the lean path
                    ring.in_flight.clear()
                    self._running = False
                    run_exchanges(ring, self._plan, self._position, started=True)
                while self._running:
                    ring.wait_step(exchanges[self._position][0], call, self)
                    self._next()
            except (CollectiveTimeout, CommunicationError) as error:
                self._abandon(error)
                raise
        return self._plan.result

    @property
    def result(self) -> Any:
        """The result once test() has returned True (or wait() returned)."""
        self._check_started()
        if self._run is not None:
            return self._run.result
        if self._running:
            raise RuntimeError(f"{self._call.collective} is still in flight: call wait() or test() first")
        return self._plan.result

    def free(self) -> None:
        """Release the request's MPI resources (not while a run is in flight)."""
        if self._running:
            raise RuntimeError(f"this persistent {self._call.collective} request is still running: wait() first")
        if not self._freed and self._plan is not None:
            self._plan.free()
        self._freed = True

    def _next(self) -> None:
        """The exchange in flight has completed: do its work, start the next one."""
        exchanges = self._plan.exchanges
        for work in exchanges[self._position][4]:
            work()
        self._position += 1
        if self._position < len(exchanges):
            _startall(exchanges[self._position][1])
        else:
            self._running = False
            self._ring.in_flight.remove(self)

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
        self._ring.abandon(self._call, error, self._plan)  # keeps its buffers: MPI may still write them

    def _check_started(self) -> None:
        """Raise what the last run raised, or that there was no run yet."""
        if self._error is not None:
            raise self._error
        if self._position < 0 and self._run is None:
            raise RuntimeError(f"this persistent {self._call.collective} request was never started: call start()")
