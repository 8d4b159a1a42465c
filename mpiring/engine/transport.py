"""The transport: one step's messages handed to MPI, what they are counted as, and a failed or
oversized message told in words.

An algorithm posts a step (`Ring.post`, which lands in `make_step` here for every buffer MPI
may read directly, and in a staged device backend's `post_staged` otherwise) and yields it; the
waiting (mpiring.engine.waiting) completes it and checks, here, that every receive got the bytes
it expected. A step is a handful of nonblocking requests, receives first:

    step = Step: requests [Irecv from left, Isend to right], receives [(0, nbytes, left)]

This module knows MPI and the backends' buffer protocol, and nothing of the ring above it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from mpiring.engine.native import CallFields, Counters
from mpiring.errors import CommunicationError

if TYPE_CHECKING:
    from mpiring.backend import NumpyBackend


# Peers one step of a one-round algorithm (all-to-all scattered, the linear rooted ones) posts
# to at most: bounds the requests a rank has in flight (MPICH's default block is 32 too).
WINDOW = 32


def shift_windows(size: int, window: int) -> Iterator[range]:
    """Shifts 1..size-1, at most `window` per step, for the scattered algorithms: shift k (to
    rank r+k, from rank r-k) falls in the same step at its sender and at its receiver."""
    return (range(first, min(first + window, size)) for first in range(1, size, window))


class Traffic(Counters):  # its fields are C ones where the extension was built: the C paths count into them
    """What this communicator has handed to MPI since it was made (or last reset)."""

    __slots__ = ()  # bytes_sent, bytes_received, messages (sent): Counters'

    def reset(self) -> None:
        self.bytes_sent = self.bytes_received = self.messages = 0


class Step:
    """The messages one step of an algorithm has posted, and what to check once they complete."""

    __slots__ = ("requests", "peers", "receives", "after", "progress", "statuses", "early", "start", "fresh_sends")

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
        # statuses of requests a long wait saw complete before the step did (waiting.finished)
        self.early: dict[int, MPI.Status] | None = None
        # a planned step: start() starts its messages for one run (None: started when posted)
        self.start: Callable[[], None] | None = None
        # a planned step's sends made anew by every run: (index into requests, message, dest, tag, comm)
        self.fresh_sends: list[tuple[int, Any, int, int, MPI.Intracomm]] = []


class Call(CallFields):  # step and number are C fields where the extension was built: a persistent start writes them
    """One collective call as the engine sees it: what to name in errors, and how long to wait.

    collective, algorithm  what to name in errors (the collective replaces an "auto" algorithm
                           with the one it chose)
    tag, timeout           the call's tag, and how long it may wait (None: no limit)
    step                   steps completed so far
    checked                (x, op, root) as the consistency check (MPIRING_CHECK) compares them
    arrays                 a nonblocking or persistent call's (x, out), for the aliasing check
    number                 a nonblocking call's or persistent run's number on the ring (None: a
                           blocking call, numbered ring.calls while it runs): a notice that a rank
                           left it names it (waiting.leave_notice)
    """

    __slots__ = ("collective", "algorithm", "tag", "timeout", "checked", "arrays")

    def __init__(self, collective: str, algorithm: str, tag: int, timeout: float | None = None,
                 checked: tuple = ()) -> None:
        self.collective, self.algorithm, self.tag, self.timeout = collective, algorithm, tag, timeout
        self.step = 0
        self.checked = checked
        self.arrays: tuple = (None, None)
        self.number: int | None = None

    def __repr__(self) -> str:
        return (f"Call({self.collective!r}, {self.algorithm!r}, tag={self.tag}, timeout={self.timeout}, "
                f"step={self.step}, number={self.number})")


# An algorithm: a generator that yields each step it posted and returns the collective's result.
Steps = Generator[Step, None, Any]


def without_posted(unwaited: list[Step], step: Step, building: str) -> list[Step]:
    """`unwaited` less `step`, which the collective being built (`building`: "schedule", "plan")
    must have posted itself: it may not communicate otherwise while it is built."""
    if not any(step is posted for posted in unwaited):
        raise RuntimeError(f"a collective whose {building} is being built waited for a step it did not post (it "
                           f"may not communicate while its {building} is built)")
    return [posted for posted in unwaited if posted is not step]


def make_step(
    comm: MPI.Intracomm,
    backend: NumpyBackend,
    tag: int,
    sends: Sequence[tuple[Any, int]],
    receives: Sequence[tuple[Any, int]],
    traffic: Traffic,
    persistent: bool = False,
    persistent_sends: bool = True,
) -> Step:
    """A step's requests on `comm`, receives first (so a matching send never waits on an
    unposted receive); started now, or (`persistent`) made to be started by every run of a
    plan, with `step.start()`. `traffic` counts the step's bytes.

    With `persistent_sends` False a planned step's sends are new requests each run (MPI_Isend),
    its receives still persistent: Open MPI completes a small persistent send only once the
    receiver has taken it, where a new small send completes at once (docs/engine.md, "Sends
    made anew")."""
    receive, send = (comm.Recv_init, comm.Send_init) if persistent else (comm.Irecv, comm.Isend)
    step = Step()
    received = sent = 0  # counted once per step: `traffic`'s fields may be C ones, boxed at each read
    for buf, source in receives:
        message, after = backend.receive_message(buf)
        step.receives.append((len(step.requests), buf.nbytes, source))
        step.requests.append(receive(message, source, tag))
        step.peers.append(("receive from", source))
        if after is not None:
            step.after.append(after)
        received += buf.nbytes
    for buf, dest in sends:
        message = backend.send_message(buf)
        if persistent and not persistent_sends:
            step.fresh_sends.append((len(step.requests), message, dest, tag, comm))
            step.requests.append(MPI.Request())  # null until a run sends it
        else:
            step.requests.append(send(message, dest, tag))
        step.peers.append(("send to", dest))
        sent += buf.nbytes
    if received:
        traffic.bytes_received += received
    if sends:
        traffic.bytes_sent += sent
        traffic.messages += len(sends)
    if persistent:
        started = step.requests[: len(step.requests) - len(step.fresh_sends)]  # the persistent ones
        if step.fresh_sends:
            step.start = partial(_start_with_fresh_sends, step, started)
        else:
            step.start = partial(MPI.Prequest.Startall, started)
    return step


def persistent_sends_suit() -> bool:
    """Whether plans should send with persistent requests under the MPI library loaded: yes,
    except under Open MPI, where a small persistent send completes only once the receiver has
    taken it, which costs a rank of an oversubscribed node a wait for the receiver to be scheduled
    (docs/measurements.md, "Persistent and new sends", times both kinds under both libraries)."""
    return "Open MPI" not in MPI.Get_library_version()


def _start_with_fresh_sends(step: Step, started: list[MPI.Prequest]) -> None:
    if started:
        MPI.Prequest.Startall(started)
    requests = step.requests
    for index, message, dest, tag, comm in step.fresh_sends:
        requests[index] = comm.Isend(message, dest, tag)


def mpi_error(rank: int, call: Call, error: MPI.Exception, step: Step | None = None,
              statuses: list[MPI.Status] | None = None) -> CommunicationError:
    """A failed step on `rank` in words: a message too large for its receive names its sender and
    the size expected, rather than MPI's "see the MPI_ERROR field"."""
    failed = CommunicationError(
        call.collective,
        f"MPI failed on rank {rank} in step {call.step}: {error.Get_error_string()} "
        "(did the ranks pass different shapes, lengths or dtypes?)",
    )
    if step is not None and statuses is not None:
        for index, expected, source in step.receives:
            code = statuses[index].Get_error()
            if code not in (MPI.SUCCESS, MPI.ERR_PENDING):
                failed = CommunicationError(
                    call.collective,
                    f"rank {rank} expected {expected} bytes from rank {source} in step {call.step} but "
                    f"a larger message arrived (MPI: {MPI.Get_error_string(MPI.Get_error_class(code))}): "
                    "the ranks passed different shapes, lengths or dtypes",
                )
                break
        receives = {index for index, _, _ in step.receives}
        failed.sends_done = all(statuses[index].Get_error() != MPI.ERR_PENDING
                                for index in range(len(step.requests)) if index not in receives)
    return failed


def check_sizes(rank: int, step: Step, statuses: list[MPI.Status], collective: str) -> None:
    """Raise CommunicationError, naming the sender, if a receive of `step` did not get the bytes
    it expected (a larger message is an MPI error instead: `mpi_error`)."""
    for index, expected, source in step.receives:
        got = statuses[index].Get_count(MPI.BYTE)
        if got != expected:
            error = CommunicationError(
                collective,
                f"rank {rank} received {got} bytes from rank {source} but expected "
                f"{expected}: the ranks passed different shapes, lengths or dtypes",
            )
            error.sends_done = True  # (the step's every request completed before its sizes were checked)
            raise error
