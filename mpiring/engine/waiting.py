"""Waiting: how a step's messages are waited for, and so where a timeout lives, and
where a rank notices that a peer is in another call, or has left this one.

    complete(ring, step, call)     block until the step is done (one Waitall without a timeout;
                                   with one, `poll`); check the sizes, run the step's `after`
    is_complete(ring, step, call)  the same without blocking: True once done
    wait_step(ring, step, call)    complete, while advancing every other collective in flight
    progress_others(ring)          advance once every nonblocking collective in flight
    make_room(ring, nbytes)        wait for the oldest in flight while they hold too many bytes
    poll(ring, step, ...)          the timed wait: offer the core, then back off, until the deadline

A long wait in a blocking call looks (`_Watch`, every 20 ms) at the first unmatched message of
each peer it waits for: one of another blocking call, or a notice that the peer raised and left
(`leave_notice`), seen twice is a `MessageMismatchError` (`mismatch` names both calls).
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import time
from typing import Any

from mpi4py import MPI

from mpiring.engine.ring import InFlight, Ring
from mpiring.engine.transport import Call, Step, check_sizes, mpi_error
from mpiring.errors import (
    ArgumentError,
    CollectiveMismatchError,
    CollectiveTimeout,
    CommunicationError,
    CommunicatorRevokedError,
    MessageMismatchError,
    RankLostError,
)

# A timed wait offers the core between tests this long, then pauses between them (poll).
YIELD_SECONDS = 10e-3


def c_spin(timeout: float | None) -> float:
    """How long the C replay tests a step before Python's `poll` takes over, for a call of this
    timeout: the timeout itself up to YIELD_SECONDS; -1.0 without one (it waits in MPI_Waitall)."""
    return -1.0 if timeout is None else (timeout if timeout < YIELD_SECONDS else YIELD_SECONDS)

# A long wait looks this often for a message of another call from the peer it waits for (_Watch).
_LOOK_SECONDS = 20e-3

# A notice is empty, or, from a rank that timed out, the 8 bytes of its timeout (a float64):
# a peer it ends the wait of raises CollectiveTimeout too, as it would have at its own deadline.
# Each ring receives one into its own `notice` (8 bytes) and probes into its own `probed` status:
# communicators of different threads wait at the same time.

# Give the core to another runnable process (oversubscribed ranks); a no-op when none waits.
_yield_core = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


def complete(ring: Ring, step: Step, call: Call) -> None:
    """Wait for every message of a step, then check and finish its receives.

    Without a timeout this is one MPI Waitall. With one, it polls with a growing pause (so
    oversubscribed ranks leave the cores to the ranks doing work) and raises
    CollectiveTimeout naming the peers whose messages are still outstanding.
    """
    statuses = step.statuses or ([MPI.Status() for _ in step.requests] if step.receives else None)
    try:
        if step.progress is not None:
            _drive(step, call, getattr(ring, "liveness", None))
        elif call.timeout is None:
            MPI.Request.Waitall(step.requests, statuses)
        else:
            poll(ring, step, statuses, call)
    except MPI.Exception as error:
        raise as_loss(ring, call, mpi_error(ring.rank, call, error, step, statuses)) from error
    _finish(ring, step, statuses, call)


def is_complete(ring: Ring, step: Step, call: Call) -> bool:
    """Whether every message of a step has finished (then checked and finished), without waiting."""
    statuses = step.statuses or ([MPI.Status() for _ in step.requests] if step.receives else None)
    liveness = getattr(ring, "liveness", None)
    if liveness is not None and liveness.failed:
        lost(ring, step, call)
    try:
        done = step.progress(call) if step.progress is not None else MPI.Request.Testall(step.requests, statuses)
    except MPI.Exception as error:
        raise as_loss(ring, call, mpi_error(ring.rank, call, error, step, statuses)) from error
    if done:
        _put_back(step, statuses)
        _finish(ring, step, statuses, call)
    return done


def wait_step(ring: Ring, step: Step, call: Call, waiting: InFlight | None = None) -> None:
    """Complete `step` while advancing every other nonblocking collective in flight (`waiting`
    is the request the step belongs to, if any).

    Ranks may wait for their requests in different orders (as MPI allows): a rank stuck in
    one collective must still post the next steps of the others, or the ranks would wait
    for each other for ever. With nothing else in flight this is just `complete`.
    """
    in_flight = ring.in_flight
    if not in_flight or in_flight == [waiting]:  # nothing else to advance
        complete(ring, step, call)
        return
    start = time.monotonic()
    deadline = None if call.timeout is None else start + call.timeout
    watch = _Watch(ring, step, call, start)
    pause = 0.0
    while True:
        progress_others(ring, waiting)
        if is_complete(ring, step, call):  # (it raises once a rank is lost: survival)
            return
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            _raise_timeout(step, call)
        watch.look(now)
        if pause:
            time.sleep(pause)
        pause = min(max(pause * 2, 1e-6), 1e-4)  # spin once, then back off a little


def progress_others(ring: Ring, waiting: InFlight | None = None) -> None:
    """Advance once every nonblocking collective in flight but `waiting`. Ranks may wait for
    their requests in different orders, and a request the program dropped must still finish
    and let go of its buffers. What another request raises stays with it (test(), wait() and
    `result` raise it; one that may leave messages in flight has broken the ring, so the
    next call says so): it is not this call's error."""
    for request in [r for r in ring.in_flight if r is not waiting]:
        with contextlib.suppress(Exception):  # kept by that request (CollectiveRequest._fail)
            request.progress()


def make_room(ring: Ring, nbytes: int) -> None:
    """Before a nonblocking collective whose arrays hold `nbytes` starts: while those in flight
    would then hold more than `ring.in_flight_bytes`, wait for the oldest. Requests a program
    tests once and drops would otherwise pile up; every rank issues the same calls in the same
    order, so its peers reach the same point and the oldest can finish."""
    while ring.in_flight and sum(request.holds for request in ring.in_flight) + nbytes > ring.in_flight_bytes:
        oldest = ring.in_flight[0]
        with contextlib.suppress(Exception):  # an error stays with that request (see progress_others)
            oldest.wait()
        if oldest in ring.in_flight:  # a wait that returned or raised leaves the set; never spin if not
            break


def poll(ring: Ring, step: Step, statuses: list[MPI.Status] | None, call: Call, waited: float = 0.0) -> None:
    """Wait for a step until `call.timeout`. For the first 10 ms, test again and again: where
    the node has fewer cores than ranks (not Ring.busy_poll), offer the core to any other
    runnable process between tests (a no-op when none waits, so a small message is caught
    as soon as it lands; oversubscribed ranks get to do the work this one waits for); after
    that, pause 10 us doubling to 1 ms between tests, so a long wait costs little CPU, and look
    for messages of another call from the peers it waits for (_Watch). `waited`: seconds the
    compiled replay already spent on this step the first way (mpiring.engine.native)."""
    now = time.monotonic() - waited
    deadline, yield_until = now + call.timeout, now + YIELD_SECONDS
    watch = None  # made once the wait is long (small calls pay nothing for it)
    pause = 0.0
    liveness = getattr(ring, "liveness", None)  # (stand-in rings of the unit tests have none)
    while not MPI.Request.Testall(step.requests, statuses):
        if liveness is not None and liveness.failed:
            lost(ring, step, call)
        now = time.monotonic()
        if now >= deadline:
            _raise_timeout(step, call)
            continue  # all arrived at the deadline: the next Testall completes the step
        if now < yield_until:
            if not ring.busy_poll:
                _yield_core()
            continue
        if watch is None:
            watch = _Watch(ring, step, call, now)
        watch.look(now)
        pause = min(max(pause * 2, 1e-5), 1e-3)
        time.sleep(min(pause, deadline - now))
    _put_back(step, statuses)


def finished(step: Step, index: int) -> bool:
    """Whether request `index` of `step` has completed, asked without completing it
    (MPI_Request_get_status), as a wait that looks at its peers or names the late ones must.

    MPICH (5.0.2) leaves a persistent request that answered so looking inactive: asked again, or
    completed by the Testall that ends the step, it gives an empty status (0 bytes, which the size
    check would take for a short message). So the status seen first is kept, the request is not
    asked again, and `_put_back` restores the status once the step is complete.
    """
    if step.early is not None and index in step.early:
        return True
    status = MPI.Status()
    if not step.requests[index].Get_status(status):
        return False
    if step.early is None:
        step.early = {}
    step.early[index] = status
    return True


def _put_back(step: Step, statuses: list[MPI.Status] | None) -> None:
    """The step is complete: restore the statuses `finished` kept (see there)."""
    early, step.early = step.early, None
    if early is None or statuses is None:
        return
    for index, seen in early.items():
        target = statuses[index]
        target.Set_source(seen.Get_source())
        target.Set_tag(seen.Get_tag())
        target.Set_error(seen.Get_error())
        target.Set_elements(MPI.BYTE, seen.Get_count(MPI.BYTE))


def _raise_timeout(step: Step, call: Call, seconds: float | None = None, notice_from: int | None = None) -> None:
    """Raise CollectiveTimeout naming the peers still outstanding (return if there are none);
    `notice_from`: the peer that timed out after `seconds` and whose notice ended this wait.

    `finished` only looks: Test would free a request that finished since the last check,
    losing its status, and could leave nobody to name when the last ones just arrived.
    """
    waiting = [f"{what} rank {peer}" for index, (what, peer) in enumerate(step.peers) if not finished(step, index)]
    if waiting:
        cancel_receives(step)
        raise CollectiveTimeout(call.collective, call.algorithm, call.step, waiting,
                                call.timeout if seconds is None else seconds, notice_from)


def cancel_receives(step: Step) -> None:
    """A step given up: each of its receives still posted is cancelled (or, where its message was
    landing, completed now), so MPI never writes into the caller's memory after the call raised.
    Its sends cannot be taken back: they may read the caller's arrays until their peers take them."""
    status = MPI.Status()
    for index, _, _ in step.receives:
        request = step.requests[index]
        if request and not finished(step, index):
            request.Cancel()
            request.Wait(status)


# Survival: how long a step that failed on an MPI error or a wrong size waits for the watcher to
# say whether a peer died (one that dies mid-message makes MPI fail the receive; it is seen at once).
LOSS_CONFIRMATION_SECONDS = 0.5


def as_loss(ring: Ring, call: Call, error: BaseException) -> BaseException:
    """`error` (a step's MPI error or wrong size), or under survival RankLostError where the watcher
    confirms that a peer is gone: what a peer that died mid-message leaves is its loss."""
    liveness = getattr(ring, "liveness", None)
    if liveness is None:
        return error
    deadline = time.monotonic() + LOSS_CONFIRMATION_SECONDS
    while not liveness.failed and time.monotonic() < deadline:
        time.sleep(0.001)
    return liveness.error(call.collective) if liveness.failed else error


def checked_sizes(ring: Ring, step: Step, statuses: list[MPI.Status], call: Call) -> None:
    """check_sizes, its error taken for a loss where it is one (as_loss)."""
    try:
        check_sizes(ring.rank, step, statuses, call.collective)
    except CommunicationError as error:
        raise as_loss(ring, call, error) from error


def lost(ring: Ring, step: Step, call: Call) -> None:
    """Survival: a rank is lost, or the communicator revoked. The step is given up as at a
    timeout (its receives cancelled: nothing lands in the call's arrays later): raise."""
    cancel_receives(step)
    raise ring.liveness.error(call.collective)


def _drive(step: Step, call: Call, liveness: Any = None) -> None:
    """Push a staged step along until it is done. It spins, since the device copies it waits
    for take microseconds; after a while it yields the core to oversubscribed ranks."""
    deadline = None if call.timeout is None else time.monotonic() + call.timeout
    spins = 0
    while not step.progress(call):
        if liveness is not None and liveness.failed:
            raise liveness.error(call.collective)
        spins += 1
        if spins > 64:
            _yield_core()
        if deadline is not None and time.monotonic() >= deadline:
            pending = zip(step.requests, step.peers, strict=True)
            # a request is falsy once complete
            waiting = list(dict.fromkeys(f"{what} rank {peer}" for request, (what, peer) in pending if request))
            raise CollectiveTimeout(call.collective, call.algorithm, call.step, waiting, call.timeout)


def _finish(ring: Ring, step: Step, statuses: list[MPI.Status] | None, call: Call) -> None:
    if statuses is not None:
        checked_sizes(ring, step, statuses, call)
    for work in step.after:
        work()
    call.step += 1


class _Watch:
    """Looks, every 20 ms of a long wait in a blocking call (or its consistency check), whether a
    peer whose message has not arrived sent one of another blocking call instead, or a notice
    (foreign_message). MPI delivers two ranks' messages in order, so a peer that really was
    in this call would have sent the awaited message before any later one, and it would have
    matched the receive that waits for it. The same foreign message seen at two looks (the
    awaited one still missing) is a mismatch: raise.
    """

    __slots__ = ("ring", "step", "call", "next", "seen", "notice")

    def __init__(self, ring: Ring, step: Step, call: Call, start: float) -> None:
        self.ring, self.step, self.call = ring, step, call
        # blocking calls, the consistency check (tag 0) they may run first, and nonblocking calls
        # whose tags name their kind
        tags = ring.tags
        watched = call.tag == 0 or tags.is_blocking(call.tag) or tags.sequence_of(call.tag) is not None
        # a call left waiting on its sends alone: a peer that left this very call says so
        blocking = tags.is_blocking(call.tag)
        number = ring.calls if blocking else call.number
        self.notice = tags.notice(ring.failures, number) if blocking or number is not None else None
        self.next = start + _LOOK_SECONDS if watched and (step.receives or self.notice is not None) else math.inf
        self.seen: tuple[int, int] | None = None

    def look(self, now: float) -> None:
        if now < self.next:
            return
        self.next = now + _LOOK_SECONDS
        found = foreign_message(self.ring, self.step, self.call)
        status, notices = self.ring.probed, self.ring.notice_comm
        if found is None and self.notice is not None and notices.Iprobe(MPI.ANY_SOURCE, self.notice, status):
            found = self.seen = (status.Get_source(), self.notice)  # that peer left this call: no second look
        if found is not None and found == self.seen:
            source, tag = found
            if tag == self.notice and notices.Iprobe(source, tag, status) and status.Get_count(MPI.BYTE) == 8:
                self._peer_timed_out(source, tag)  # returns where nothing is outstanding
            cancel_receives(self.step)  # as a timeout does: nothing lands in the call's arrays later
            raise mismatch(self.ring, self.call, *found)
        self.seen = found

    def _peer_timed_out(self, source: int, tag: int) -> None:
        """A peer left this call at its timeout: so does this rank, with the same error (the
        ranks one missing rank kept waiting all raise CollectiveTimeout, whichever deadline came first)."""
        if all(finished(self.step, index) for index in range(len(self.step.peers))):
            return
        notice = self.ring.notice
        self.ring.notice_comm.Recv([notice, 8, MPI.BYTE], source, tag)
        _raise_timeout(self.step, self.call, struct.unpack("d", notice)[0], source)


def foreign_message(ring: Ring, step: Step, call: Call) -> tuple[int, int] | None:
    """(source, tag) of the first message a peer whose receive in `step` is still pending has
    sent with another blocking call's tag (another kind of call, or another call of this kind),
    or, in a nonblocking call, of another kind of call at this call's place, or its farewell
    (engine.farewell: it freed the communicator), if any. It only looks
    (Iprobe), except that it takes out of the way notices from a failure count other than this
    rank's (calls that raised on this rank too, or long ago)."""
    status = MPI.Status()
    tags = ring.tags
    ours = tags.sequence_of(call.tag)
    for index, _, source in step.receives:
        while not finished(step, index) and ring.comm.Iprobe(source, MPI.ANY_TAG, status):
            tag = status.Get_tag()
            if tag == call.tag:
                break
            if tag == tags.farewell:  # that peer freed the communicator: it makes no more calls here
                return source, tag
            if not tags.is_blocking(tag):
                theirs = tags.sequence_of(tag)  # nonblocking or persistent: only the same place tells
                if ours is not None and theirs is not None and theirs[0] == ours[0]:
                    return source, tag
                break
            if not tags.is_notice(tag) or tags.notice_of(tag, ring.failures):  # a peer left a call of this generation
                return source, tag
            ring.comm.Recv([ring.notice, 8, MPI.BYTE], source, tag)  # a notice of a call this rank left too
        if not finished(step, index) and ring.notice_comm is not ring.comm:
            found = _notice_from(ring, source, status)
            if found is not None:
                return found
    return None


def _notice_from(ring: Ring, source: int, status: MPI.Status) -> tuple[int, int] | None:
    """(source, tag) of `source`'s notice that it left a call of this generation, or of its
    farewell, on the notices' own communicator; notices from other failure counts (calls this
    rank left too, or long ago) are taken out of the way."""
    comm, tags = ring.notice_comm, ring.tags
    while comm.Iprobe(source, MPI.ANY_TAG, status):
        tag = status.Get_tag()
        if tag == tags.farewell or tags.notice_of(tag, ring.failures):
            return source, tag
        comm.Recv([ring.notice, 8, MPI.BYTE], source, tag)
    return None


def no_notice(ring: Ring, collective: str, algorithm: str | None, calls: int | None = None) -> None:
    """Raise if a peer left the call numbered `calls` (this one by default): its notice has come,
    and a call that completed with it may have taken data it sent for that call and rewrote
    since. Every call that received data asks once, at its end (`notice_from`; the C replay
    asks the same)."""
    if ring.size == 1:
        return
    number = ring.hot.calls if calls is None else calls
    tag = ring.tags.notice(ring.failures, number)  # a notice that a peer left this very call
    if tag is not None:
        peer = notice_from(ring, tag, number)
        if peer >= 0:
            raise_left(ring, collective, algorithm, number, peer)


def notice_from(ring: Ring, tag: int, number: int) -> int:
    """The peer that left the call numbered `number` (its notice tag `tag`), or -1: on the
    ranks' notice board where they share one (a few loads), else one MPI_Iprobe for its notice."""
    board = ring.notice_board
    if board is not None:
        return board.who_left(tag, number)
    if ring.notice_comm.Iprobe(MPI.ANY_SOURCE, tag, ring.probed):
        return ring.probed.Get_source()
    return -1


def raise_left(ring: Ring, collective: str, algorithm: str | None, number: int, peer: int) -> None:
    """`peer` left the call numbered `number`, which this rank completed: raise."""
    error = MessageMismatchError(collective, f"rank {peer} raised in this call and left it "
                                 f"(see the error there) while this rank's {collective} ({algorithm or 'auto'}, "
                                 f"call {number} here) went on: its data may come from the call that rank left")
    error.sends_done = True  # (its call completed)
    raise error


def leave_notice(ring: Ring, error: BaseException, calls: int | None = None) -> None:
    """This rank's call numbered `calls` (the blocking call now, by default) raised `error` and it
    moves on: tell every other rank with a message on the notice tag of its generation and of
    that call, so a peer waiting for it in that call, or in any later call of that generation,
    raises at once (foreign_message) rather than at its timeout, and a peer that completed that
    call raises at its end (no_notice). A timeout's notice carries its seconds: a peer waiting in
    that call raises CollectiveTimeout too (_Watch). The notices of that call the peers sent this
    rank (they raised too) are taken out of the way now, the others of that generation by a later look."""
    tag = ring.tags.notice(ring.failures, ring.calls if calls is None else calls)
    if tag is None or isinstance(error, (RankLostError, CommunicatorRevokedError)):
        return  # (survival: every live peer learns of a loss or a revoke by itself, at once)
    if ring.notice_board is not None and _may_leave_sends(error):  # first: before its caller can write x
        ring.notice_board.post(tag, ring.calls if calls is None else calls)  # a peer that completed the call finds it
    ring.notices = [request for request in ring.notices if not request.Test()]
    notice = struct.pack("d", error.seconds) if isinstance(error, CollectiveTimeout) else b""  # kept by its requests
    comm = ring.notice_comm
    ring.notices += [comm.Isend([notice, len(notice), MPI.BYTE], peer, tag) for peer in range(ring.size)
                     if peer != ring.rank]
    status = MPI.Status()
    while comm.Iprobe(MPI.ANY_SOURCE, tag, status):
        comm.Recv([ring.notice, 8, MPI.BYTE], status.Get_source(), tag)


def _may_leave_sends(error: BaseException) -> bool:
    """Whether a rank raising `error` may leave a send of its call unfinished, which MPI could
    still read after its caller rewrote the array: not for a bad argument, nor for a disagreement
    a layout round found (no message of the call is in flight then), nor for an error raised once
    every message it sent had gone (`sends_done`)."""
    if isinstance(error, ArgumentError) or type(error) is CollectiveMismatchError:
        return False
    return not getattr(error, "sends_done", False)


def mismatch(ring: Ring, call: Call, source: int, tag: int) -> MessageMismatchError:
    """The error for a message of another call from `source`, naming both calls."""
    tags = ring.tags
    blocking = tags.is_blocking(call.tag)
    our_identity = tags.split(call.tag)[2] if blocking else None  # None: the check, or a nonblocking call
    call_words = f"{call.collective} ({call.algorithm})" if our_identity is None else ring.describe(our_identity,
                                                                                                     ring.size)
    waits = f"this rank waits in {call_words} (call {ring.calls} here)"
    if tag == tags.farewell:
        return MessageMismatchError(call.collective, f"rank {source} freed this communicator while {waits}: the "
                                    "ranks made different numbers of calls on it (one skipped a call, or this "
                                    "one made one more)")
    if tags.is_notice(tag):
        return MessageMismatchError(call.collective, f"rank {source} raised in a call and left it "
                                    f"(see the error there) while {waits}")
    if not tags.is_blocking(tag):
        return MessageMismatchError(call.collective, f"rank {source} started another kind of nonblocking call or "
                                    f"persistent request (collective, dtype or op) at the place where {waits}")
    theirs, their_sequence, their_identity = tags.split(tag)
    ours, our_sequence = tags.split(ring.blocking_tag(0))[0], tags.split(call.tag)[1] if blocking else None
    what = f"rank {source} sent a message of {ring.describe(their_identity, ring.size)}"
    if their_identity != our_identity:
        problem = (f"{what} while {waits}: the ranks called different collectives, or with different dtypes, "
                   "ops, roots or algorithms")
    elif their_sequence != our_sequence and theirs == ours:
        problem = (f"{what}, the same kind of call as this rank's but another one (call {ring.calls} here): a rank "
                   "skipped a call, or made one more, and the ranks' calls no longer line up")
    else:
        problem = f"{what}, the same kind of call as this rank's (call {ring.calls} here)"
    if theirs != ours:
        who, whom = ("that rank", "this one") if theirs > ours else ("this rank", f"rank {source}")
        problem += (f"; {who} has seen {abs(theirs - ours)} more failed call(s) than {whom}: a call raised on "
                    "one of the two only, and the other went on")
    return MessageMismatchError(call.collective, problem)
