"""The ring: topology, the transport every algorithm talks through, and the driver that runs
an algorithm's steps (the split arithmetic is mpiring.engine.partition).

An algorithm is a generator. Each `yield` hands back one `Step`: the point-to-point messages it
has just posted (nonblocking). The driver completes the step and resumes the generator, which
may then touch the received data and post the next step. A blocking collective drives its
generator to the end; a nonblocking one (`CollectiveRequest`) advances it on test() and wait().
All waiting happens in `Ring.complete`, the one place a timeout belongs.

          left = rank-1                      right = rank+1
    ... ──────────────► [ rank ] ──────────────► ...        (indices mod size)
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from mpiring.backend import NumpyBackend
from mpiring.engine.tags import Tags
from mpiring.errors import CollectiveTimeout, CommunicationError, ConcurrentUseError, MessageMismatchError

# Tags (which receive may match which message) are laid out in mpiring.engine.tags.

# Scratch pool: arrays from this size up are kept for reuse, at most this many per backend
# (enough for a few nonblocking collectives in flight at once), and at most POOL_BYTES in all
# per backend unless MPIRING_SCRATCH_BYTES says otherwise (Ring.pool_bytes).
_POOL_FROM_BYTES = 64 * 1024
_POOL_BUFFERS = 4
POOL_BYTES = 256 << 20

# Nonblocking collectives in flight may hold at most this many bytes of arrays (their inputs and
# outputs) per communicator unless MPIRING_INFLIGHT_BYTES says otherwise (Ring.make_room).
IN_FLIGHT_BYTES = 1 << 30

# A timed wait offers the core between tests this long, then pauses between them (Ring.poll).
_YIELD_SECONDS = 10e-3

_NOTHING = bytearray(0)  # the buffer of an empty message (notices)

# A long wait looks this often for a message of another call from the peer it waits for (_Watch).
_LOOK_SECONDS = 20e-3

# Give the core to another runnable process (oversubscribed ranks); a no-op when none waits.
_yield_core = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


@dataclass
class Traffic:
    """What this communicator has handed to MPI since it was made (or last reset)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages: int = 0  # messages sent

    def reset(self) -> None:
        self.bytes_sent = self.bytes_received = self.messages = 0


class Step:
    """The messages one step of an algorithm has posted, and what to check once they complete."""

    __slots__ = ("requests", "peers", "receives", "after", "progress", "statuses")

    def __init__(self) -> None:
        self.requests: list[MPI.Request] = []
        self.peers: list[tuple[str, int]] = []  # per request: ("receive from", 3) or ("send to", 1)
        # (index into requests, expected bytes, source rank) for every receive
        self.receives: list[tuple[int, int, int]] = []
        # work to do once every message has arrived (a staged receive's copy to the device)
        self.after: list[Callable[[], None]] = []
        # a step that must be pushed along (staged device transfers): progress(call) -> done
        self.progress: Callable[[Call], bool] | None = None
        # a planned step's statuses, made once and refilled by every run (None: made per wait)
        self.statuses: list[MPI.Status] | None = None


@dataclass(slots=True)
class Call:
    """One collective call as the driver sees it: what to name in errors, and how long to wait."""

    collective: str
    algorithm: str  # as asked for; the collective replaces "auto" with the one it chose
    tag: int
    timeout: float | None = None
    step: int = 0  # steps completed so far
    checked: tuple = ()  # (x, op, root) as the consistency check (MPIRING_CHECK) compares them
    arrays: tuple = (None, None)  # a nonblocking or persistent call's (x, out), for the aliasing check


Steps = Generator[Step, None, Any]


class Scratch:
    """The context manager `Ring.scratch` returns (a plain class: small collectives are paid in
    Python time). On a clean exit a pooled buffer goes back to its pool, the smallest dropped
    when the pool holds too many or too many bytes; on an exception (MPI may still write to it)
    it is left to the GC."""

    __slots__ = ("array", "_raw", "_pool", "_limit")

    def __init__(self, array: Any, raw: Any = None, pool: list[Any] | None = None, limit: int = 0) -> None:
        self.array, self._raw, self._pool, self._limit = array, raw, pool, limit

    def __enter__(self) -> Any:
        return self.array

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        pool = self._pool
        if kind is None and pool is not None:
            pool.append(self._raw)
            while len(pool) > _POOL_BUFFERS or sum(buf.nbytes for buf in pool) > self._limit:
                del pool[min(range(len(pool)), key=lambda i: pool[i].nbytes)]


class Ring:
    """A communicator seen as a ring, with the transport all algorithms use.

    Rank r receives from `left` (r-1) and sends to `right` (r+1), mod `size`.
    """

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.left = (self.rank - 1) % self.size
        self.right = (self.rank + 1) % self.size
        self.traffic = Traffic()
        tag_ub = comm.Get_attr(MPI.TAG_UB)
        self.tags = Tags(int(tag_ub) if tag_ub else None)
        # a blocking call's identity in words (mpiring.identity.describe, given by the Communicator)
        self.describe: Callable[[int, int], str] = lambda identity, size: f"call identity {identity:#x}"
        self.failures = 0  # calls that raised on this rank; picks the blocking tags' generation
        self.notices: list[MPI.Request] = []  # sends of leave_notice not yet known complete
        self.persistent_requests = 0  # made so far; picks each one's tag
        # a plan being built (mpiring.engine.plan): posts are recorded, not sent
        self.recorder: Any = None
        # plans and steps abandoned with messages in flight: MPI may still write their buffers
        self.abandoned: list[Any] = []
        # every rank on one node: device buffers may move by CUDA IPC (the Communicator finds out)
        self.node_local = False
        self.calls = 0  # collective calls made so far; each took a tag
        self._spare: dict[str, list[Any]] = {}  # scratch buffers kept for reuse, by backend
        self.pool_bytes = POOL_BYTES  # the most bytes of scratch kept per backend (MPIRING_SCRATCH_BYTES)
        # nonblocking collectives not yet done: every wait advances them all (see wait_step)
        self.in_flight: list[CollectiveRequest] = []
        self.in_flight_bytes = IN_FLIGHT_BYTES  # the most their arrays may hold (MPIRING_INFLIGHT_BYTES)
        # why this rank may have messages of an abandoned call in flight (the Communicator then
        # refuses every later call: those messages could match a later call's receives)
        self.broken: str | None = None
        self.owner: int | None = None  # the thread that made the first call (see `claim`)

    def claim(self, collective: str) -> None:  # collective: its name, or its builder's (`_allreduce`)
        """Check that this call comes from the ring's thread: the first one to call it.

        Calls must come in the same order on every rank. Two threads sharing a communicator
        interleave their calls differently on each rank, so their data would mix silently
        (even without overlapping calls): a second thread's call breaks the ring instead.
        """
        thread = threading.get_ident()
        if self.owner is None:
            self.owner = thread
        elif self.owner != thread:
            collective = collective.lstrip("_")
            self.broken = self.broken or f"{collective} (called from a second thread)"
            raise ConcurrentUseError(collective)

    def abandon(self, call: Call, error: BaseException, in_flight: Any = None) -> None:
        """Record that `call` failed with messages possibly in flight (the first cause is kept).

        `in_flight` (the step or plan whose requests may still be active) stays referenced by
        the ring for its life, so that MPI never writes into memory Python has given away.
        """
        if self.broken is None:
            self.broken = f"{call.collective} ({call.algorithm}, step {call.step}: {type(error).__name__})"
        if in_flight is not None:
            self.abandoned.append(in_flight)

    def scratch(self, backend: NumpyBackend, count: int, dtype: Any) -> Scratch:
        """A flat scratch array of `count` elements (`with ring.scratch(...) as buf`), reused
        across calls once it is large.

        Fresh large arrays cost page faults on first touch every call (the allocator hands big
        blocks back to the system), which shows in large collectives. Only a collective that
        finished cleanly returns its buffer: after an error or timeout MPI may still write to it.
        """
        nbytes = count * backend.xp.dtype(dtype).itemsize
        if not _POOL_FROM_BYTES <= nbytes <= self.pool_bytes or self.recorder is not None:  # plans keep their own
            return Scratch(backend.empty(count, dtype))
        spare = self._spare.setdefault(backend.name, [])
        fitting = [i for i, buf in enumerate(spare) if buf.nbytes >= nbytes]
        raw = spare.pop(min(fitting, key=lambda i: spare[i].nbytes)) if fitting else backend.empty(nbytes, "uint8")
        return Scratch(raw[:nbytes].view(dtype), raw, spare, self.pool_bytes)

    def release_scratch(self) -> None:
        """Let the pooled scratch buffers go (Communicator.free)."""
        self._spare.clear()

    def position(self, root: int) -> int:
        """Distance from `root` along the ring (root is 0, its right neighbour 1, ...)."""
        return (self.rank - root) % self.size

    def rank_at(self, position: int, root: int) -> int:
        return (root + position) % self.size

    def next_tag(self) -> int:
        """A sequence tag for the next collective call; every rank calls collectives in the same
        order, and every call takes one, even one that raises."""
        self.calls += 1
        return self.tags.sequence(self.calls)

    def blocking_tag(self, identity: int) -> int:
        """The tag of a blocking call of this identity (mpiring.identity); its generation changes
        after every call that raised here."""
        return self.tags.blocking(self.failures, identity)

    def persistent_tag(self) -> int:
        """A tag for a new persistent request (made collectively, in the same order everywhere)."""
        self.persistent_requests += 1
        return self.tags.persistent(self.persistent_requests)

    def post(
        self,
        backend: NumpyBackend,
        tag: int,
        sends: Sequence[tuple[Any, int]] = (),
        receives: Sequence[tuple[Any, int]] = (),
    ) -> Step:
        """Post nonblocking receives into and sends from flat contiguous buffers.

        Receives are posted first so a matching send never waits on an unposted receive.
        A backend that moves device buffers itself (`staged`: the staged and IPC paths) posts the
        step itself.
        """
        if self.recorder is not None:
            return self.recorder.post(backend, tag, sends, receives)
        if backend.staged:
            return backend.post_staged(self, tag, sends, receives)
        if sends:
            backend.ready_for_mpi()
        return self.make_step(backend, tag, sends, receives, self.traffic)

    def make_step(
        self,
        backend: NumpyBackend,
        tag: int,
        sends: Sequence[tuple[Any, int]],
        receives: Sequence[tuple[Any, int]],
        traffic: Traffic,
        persistent: bool = False,
    ) -> Step:
        """A step's requests, receives first; started now, or (`persistent`) made to be started
        by every run of a plan. `traffic` counts the step's bytes."""
        comm = self.comm
        receive, send = (comm.Recv_init, comm.Send_init) if persistent else (comm.Irecv, comm.Isend)
        step = Step()
        for buf, source in receives:
            message, after = backend.receive_message(buf)
            step.receives.append((len(step.requests), buf.nbytes, source))
            step.requests.append(receive(message, source, tag))
            step.peers.append(("receive from", source))
            if after is not None:
                step.after.append(after)
            traffic.bytes_received += buf.nbytes
        for buf, dest in sends:
            step.requests.append(send(backend.send_message(buf), dest, tag))
            step.peers.append(("send to", dest))
            traffic.bytes_sent += buf.nbytes
            traffic.messages += 1
        return step

    def complete(self, step: Step, call: Call) -> None:
        """Wait for every message of a step, then check and finish its receives.

        Without a timeout this is one MPI Waitall. With one, it polls with a growing pause (so
        oversubscribed ranks leave the cores to the ranks doing work) and raises
        CollectiveTimeout naming the peers whose messages are still outstanding.
        """
        statuses = step.statuses or ([MPI.Status() for _ in step.requests] if step.receives else None)
        try:
            if step.progress is not None:
                self._drive(step, call)
            elif call.timeout is None:
                MPI.Request.Waitall(step.requests, statuses)
            else:
                self.poll(step, statuses, call)
        except MPI.Exception as error:
            raise self.mpi_error(call, error, step, statuses) from error
        self._finish(step, statuses, call)

    def is_complete(self, step: Step, call: Call) -> bool:
        """Whether every message of a step has finished (then checked and finished), without waiting."""
        statuses = step.statuses or ([MPI.Status() for _ in step.requests] if step.receives else None)
        try:
            done = step.progress(call) if step.progress is not None else MPI.Request.Testall(step.requests, statuses)
        except MPI.Exception as error:
            raise self.mpi_error(call, error, step, statuses) from error
        if done:
            self._finish(step, statuses, call)
        return done

    def wait_step(self, step: Step, call: Call, waiting: CollectiveRequest | None = None) -> None:
        """Complete `step` while advancing every other nonblocking collective in flight.

        Ranks may wait for their requests in different orders (as MPI allows): a rank stuck in
        one collective must still post the next steps of the others, or the ranks would wait
        for each other for ever. With nothing else in flight this is just `complete`.
        """
        in_flight = self.in_flight
        if not in_flight or in_flight == [waiting]:  # nothing else to advance
            self.complete(step, call)
            return
        start = time.monotonic()
        deadline = None if call.timeout is None else start + call.timeout
        watch = _Watch(self, step, call, start)
        pause = 0.0
        while True:
            self.progress_others(waiting)
            if self.is_complete(step, call):
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self._raise_timeout(step, call)
            watch.look(now)
            if pause:
                time.sleep(pause)
            pause = min(max(pause * 2, 1e-6), 1e-4)  # spin once, then back off a little

    def progress_others(self, waiting: Any = None) -> None:
        """Advance once every nonblocking collective in flight but `waiting`. Ranks may wait for
        their requests in different orders, and a request the program dropped must still finish
        and let go of its buffers. What another request raises stays with it (test(), wait() and
        `result` raise it; one that may leave messages in flight has broken the ring, so the
        next call says so): it is not this call's error."""
        for request in [r for r in self.in_flight if r is not waiting]:
            with contextlib.suppress(Exception):  # kept by that request (CollectiveRequest._fail)
                request.progress()

    def make_room(self, nbytes: int) -> None:
        """Before a nonblocking collective whose arrays hold `nbytes` starts: while those in flight
        would then hold more than `in_flight_bytes`, wait for the oldest. Requests a program tests
        once and drops would otherwise pile up; every rank issues the same calls in the same
        order, so its peers reach the same point and the oldest can finish."""
        while self.in_flight and sum(request.holds for request in self.in_flight) + nbytes > self.in_flight_bytes:
            with contextlib.suppress(Exception):  # an error stays with that request (see progress_others)
                self.in_flight[0].wait()

    def poll(self, step: Step, statuses: list[MPI.Status] | None, call: Call) -> None:
        """Wait for a step until `call.timeout`. For the first 10 ms, offer the core to any other
        runnable process between tests (a no-op when none waits, so a small message is caught
        as soon as it lands; oversubscribed ranks get to do the work this one waits for); after
        that, pause 10 us doubling to 1 ms between tests, so a long wait costs little CPU, and look
        for messages of another call from the peers it waits for (_Watch)."""
        now = time.monotonic()
        deadline, yield_until = now + call.timeout, now + _YIELD_SECONDS
        watch = None  # made once the wait is long (small calls pay nothing for it)
        pause = 0.0
        while not MPI.Request.Testall(step.requests, statuses):
            now = time.monotonic()
            if now >= deadline:
                self._raise_timeout(step, call)
                continue  # all arrived at the deadline: the next Testall completes the step
            if now < yield_until:
                _yield_core()
                continue
            if watch is None:
                watch = _Watch(self, step, call, now)
            watch.look(now)
            pause = min(max(pause * 2, 1e-5), 1e-3)
            time.sleep(min(pause, deadline - now))

    def foreign_message(self, step: Step, call: Call) -> tuple[int, int] | None:
        """(source, tag) of the first message a peer whose receive in `step` is still pending has
        sent with another blocking call's tag, if any. It only looks (Iprobe), except that it
        takes out of the way notices from a failure count other than this rank's (calls that raised
        on this rank too, or long ago)."""
        status = MPI.Status()
        own_notice = self.tags.notice(self.failures)  # a peer that left a call of this rank's generation
        for index, _, source in step.receives:
            while not step.requests[index].Get_status() and self.comm.Iprobe(source, MPI.ANY_TAG, status):
                tag = status.Get_tag()
                if tag == call.tag or not self.tags.is_blocking(tag):
                    break
                if tag == own_notice or not self.tags.is_notice(tag):
                    return source, tag
                self.comm.Recv([_NOTHING, 0, MPI.BYTE], source, tag)  # a notice of a call this rank left too
        return None

    def leave_notice(self) -> None:
        """This rank's blocking call raised and it moves on (Ring.failures): tell every other rank
        with an empty message on the notice tag of the generation it leaves, so a peer waiting for
        it in that call, or in any later call of that generation, raises at once (foreign_message)
        rather than at its timeout. The notices of that generation the peers sent this rank (they
        raised too) are taken out of the way now, or by a later look."""
        tag = self.tags.notice(self.failures)
        if tag is None:
            return
        self.notices = [request for request in self.notices if not request.Test()]
        self.notices += [self.comm.Isend([_NOTHING, 0, MPI.BYTE], peer, tag)
                         for peer in range(self.size) if peer != self.rank]
        status = MPI.Status()
        while self.comm.Iprobe(MPI.ANY_SOURCE, tag, status):
            self.comm.Recv([_NOTHING, 0, MPI.BYTE], status.Get_source(), tag)

    def mismatch(self, call: Call, source: int, tag: int) -> MessageMismatchError:
        """The error for a message of another call from `source`, naming both calls."""
        theirs, their_identity = self.tags.split(tag)
        ours = self.tags.split(self.blocking_tag(0))[0]
        our_identity = self.tags.split(call.tag)[1] if self.tags.is_blocking(call.tag) else None  # None: the check
        call_words = f"{call.collective} ({call.algorithm})" if our_identity is None else self.describe(our_identity,
                                                                                                         self.size)
        waits = f"this rank waits in {call_words} (call {self.calls} here)"
        if self.tags.is_notice(tag):
            return MessageMismatchError(call.collective, f"rank {source} raised in a blocking call and left it "
                                        f"(see the error there) while {waits}")
        what = f"rank {source} sent a message of {self.describe(their_identity, self.size)}"
        if their_identity != our_identity:
            problem = (f"{what} while {waits}: the ranks called different collectives, or with different dtypes, "
                       "ops, roots or algorithms")
        else:
            problem = f"{what}, the same kind of call as this rank's (call {self.calls} here)"
        if theirs != ours:
            who, whom = ("that rank", "this one") if theirs > ours else ("this rank", f"rank {source}")
            problem += (f"; {who} has seen {abs(theirs - ours)} more failed call(s) than {whom}: a call raised on "
                        "one of the two only, and the other went on")
        return MessageMismatchError(call.collective, problem)

    def _raise_timeout(self, step: Step, call: Call) -> None:
        """Raise CollectiveTimeout naming the peers still outstanding (return if there are none).

        Get_status only looks: Test would free a request that finished since the last check,
        losing its status, and could leave nobody to name when the last ones just arrived.
        """
        pending = zip(step.requests, step.peers, strict=True)
        waiting = [f"{what} rank {peer}" for request, (what, peer) in pending if not request.Get_status()]
        if waiting:
            raise CollectiveTimeout(call.collective, call.algorithm, call.step, waiting, call.timeout)

    def _drive(self, step: Step, call: Call) -> None:
        """Push a staged step along until it is done. It spins, since the device copies it waits
        for take microseconds; after a while it yields the core to oversubscribed ranks."""
        deadline = None if call.timeout is None else time.monotonic() + call.timeout
        spins = 0
        while not step.progress(call):
            spins += 1
            if spins > 64:
                _yield_core()
            if deadline is not None and time.monotonic() >= deadline:
                pending = zip(step.requests, step.peers, strict=True)
                # a request is falsy once complete
                waiting = list(dict.fromkeys(f"{what} rank {peer}" for request, (what, peer) in pending if request))
                raise CollectiveTimeout(call.collective, call.algorithm, call.step, waiting, call.timeout)

    def _finish(self, step: Step, statuses: list[MPI.Status] | None, call: Call) -> None:
        if statuses is not None:
            self.check_sizes(step, statuses, call.collective)
        for work in step.after:
            work()
        call.step += 1

    def mpi_error(self, call: Call, error: MPI.Exception, step: Step | None = None,
                   statuses: list[MPI.Status] | None = None) -> CommunicationError:
        """A failed step in words: a message too large for its receive names its sender and the
        size expected, rather than MPI's "see the MPI_ERROR field"."""
        if step is not None and statuses is not None:
            for index, expected, source in step.receives:
                code = statuses[index].Get_error()
                if code not in (MPI.SUCCESS, MPI.ERR_PENDING):
                    return CommunicationError(
                        call.collective,
                        f"rank {self.rank} expected {expected} bytes from rank {source} in step {call.step} but "
                        f"a larger message arrived (MPI: {MPI.Get_error_string(MPI.Get_error_class(code))}): "
                        "the ranks passed different shapes, lengths or dtypes",
                    )
        return CommunicationError(
            call.collective,
            f"MPI failed on rank {self.rank} in step {call.step}: {error.Get_error_string()} "
            "(did the ranks pass different shapes, lengths or dtypes?)",
        )

    def check_sizes(self, step: Step, statuses: list[MPI.Status], collective: str) -> None:
        for index, expected, source in step.receives:
            got = statuses[index].Get_count(MPI.BYTE)
            if got != expected:
                raise CommunicationError(
                    collective,
                    f"rank {self.rank} received {got} bytes from rank {source} but expected "
                    f"{expected}: the ranks passed different shapes, lengths or dtypes",
                )


class _Watch:
    """Looks, every 20 ms of a long wait in a blocking call (or its consistency check), whether a
    peer whose message has not arrived sent one of another blocking call instead, or a notice
    (Ring.foreign_message). MPI delivers two ranks' messages in order, so a peer that really was
    in this call would have sent the awaited message before any later one, and it would have
    matched the receive that waits for it. The same foreign message seen at two looks (the
    awaited one still missing) is a mismatch: raise.
    """

    __slots__ = ("ring", "step", "call", "next", "seen")

    def __init__(self, ring: Ring, step: Step, call: Call, start: float) -> None:
        self.ring, self.step, self.call = ring, step, call
        # blocking calls, and the consistency check (tag 0) they may run first
        watched = call.tag == 0 or ring.tags.is_blocking(call.tag)
        self.next = start + _LOOK_SECONDS if watched and step.receives else math.inf
        self.seen: tuple[int, int] | None = None

    def look(self, now: float) -> None:
        if now < self.next:
            return
        self.next = now + _LOOK_SECONDS
        found = self.ring.foreign_message(self.step, self.call)
        if found is not None and found == self.seen:
            raise self.ring.mismatch(self.call, *found)
        self.seen = found


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
            ring.wait_step(step, call)
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
        ring.make_room(self.holds)
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._step: Step | None = None
        self._advance()
        ring.progress_others()  # requests tested once and dropped finish as later calls come
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
        self._done, self._error, self._step = True, error, None
        self._leave()

    def test(self) -> bool:
        """Make what progress is possible without blocking; True once the collective is done.

        It raises only what wait() would raise at the same point (it never waits, so never a
        timeout), and once it has raised, test(), wait() and `result` raise that error again."""
        if self._error is not None:
            raise self._error
        if self._done:
            return True
        self._ring.claim(self._call.collective)
        self._ring.progress_others(self)  # as wait() does: the ranks may test in different orders
        return self.progress()

    def progress(self) -> bool:
        """test() for the thread already inside this ring (a wait that advances the others)."""
        try:
            while not self._done and self._ring.is_complete(self._step, self._call):
                self._advance()
        except (CollectiveTimeout, CommunicationError) as error:
            if self._error is None:
                self._fail(error)
            raise
        return self._done

    def wait(self) -> Any:
        """Block until the collective is done and return its result (None for barrier)."""
        if self._error is not None:
            raise self._error
        if self._done:
            return self._result
        self._ring.claim(self._call.collective)
        try:
            while not self._done:
                self._ring.wait_step(self._step, self._call, self)
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
        if self._error is not None:
            raise self._error
        if not self._done:
            raise RuntimeError(f"{self._call.collective} is still in flight: call wait() or test() first")
        return self._result
