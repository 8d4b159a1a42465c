"""The ring: a communicator seen as a ring of ranks, and the state of one communicator that the
rest of the engine (mpiring.engine) works on.

          left = rank-1                      right = rank+1
    ... ──────────────► [ rank ] ──────────────► ...        (indices mod size)

Algorithms see only a Ring: its topology, `post` (hand a step's messages to MPI, or to the plan
being recorded) and `scratch` (a temporary buffer). Everything else here is the bookkeeping the
engine keeps per communicator: the tags taken so far, the traffic counted, the collectives in
flight, why the ring broke. What every call reads or counts (the call count, the threads, the
traffic, the calls in flight, why it broke) lives in its HotState (`Ring.hot`, shared with the
Engine), whose C fields the compiled paths read directly. Where the rest lives:

    mpiring.engine.state       HotState: the hot fields (in C where built: mpiring.engine.native)
    mpiring.engine.transport   Step, Call, Traffic; a step's requests; MPI errors in words
    mpiring.engine.waiting     how a wait behaves: timeouts, notices, mismatches
    mpiring.engine.scratch     the pool behind `scratch`
    mpiring.engine.run         runs a call to its end: its generator, or its schedule or plan
    mpiring.engine.requests    nonblocking and persistent calls: their requests
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

import numpy
from mpi4py import MPI

from mpiring import environment
from mpiring.engine.native import HotState
from mpiring.engine.scratch import POOL_BYTES, POOL_FROM_BYTES, Scratch, ScratchPool
from mpiring.engine.tags import Tags
from mpiring.engine.transport import Call, Step, Steps, Traffic, make_step, persistent_sends_suit
from mpiring.errors import ConcurrentUseError
from mpiring.topology import NodeMap

if TYPE_CHECKING:
    from mpiring.backend import NumpyBackend

# Nonblocking collectives in flight may hold at most this many bytes of arrays (their inputs and
# outputs) per communicator unless MPIRING_INFLIGHT_BYTES says otherwise (waiting.make_room).
IN_FLIGHT_BYTES = 1 << 30

# Taken by the first claim of a ring (or a free() after its thread ended) alone: two threads
# calling a new communicator at once must not both become its owner.
_FIRST_CLAIM = threading.Lock()


class InFlight(Protocol):
    """A nonblocking collective or a started persistent request not yet done
    (mpiring.engine.requests' CollectiveRequest and PersistentRequest)."""

    holds: int  # the bytes of its arrays, counted against Ring.in_flight_bytes

    @property
    def arrays(self) -> tuple: ...  # the call's (x, out), for the Communicator's aliasing check

    def progress(self) -> bool: ...  # advance without blocking; True once done

    def wait(self) -> Any: ...  # block until done


def _hot(name: str, doc: str) -> property:
    """A field of the ring's HotState, read and written there: one copy, which the C paths read too."""

    def write(ring: Ring, value: Any) -> None:
        setattr(ring.hot, name, value)

    return property(attrgetter(f"hot.{name}"), write, doc=doc)


class Ring:
    """A communicator seen as a ring, with the state the engine keeps for it.

    Rank r receives from `left` (r-1) and sends to `right` (r+1), mod `size`.
    """

    calls = _hot("calls", "collective calls made so far; each took a tag")
    # why this rank may have messages of an abandoned call in flight (the Communicator then
    # refuses every later call: those messages could match a later call's receives)
    broken = _hot("broken", "why the ring broke (None: usable)")
    owner = _hot("owner", "the thread that made the first call (see `claim`)")
    # the thread whose calls the fast paths take (the C Shortcut, a cached call in Python, a
    # persistent request's C start and wait): the owner while the ring is usable, None before
    # its first call and once it broke or was freed; each fast path compares only this
    served = _hot("served", "the thread the fast paths serve (None: none)")

    def __init__(self, comm: MPI.Intracomm, notice_comm: MPI.Intracomm | None = None) -> None:
        self.comm = comm
        # where notices go (waiting.leave_notice): a communicator of their own, so that the probe for
        # one at the end of each call never walks the queue of data messages a root sent ahead
        # (Open MPI's probe for any source does); the data communicator itself where none is given
        self.notice_comm = comm if notice_comm is None else notice_comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.left = (self.rank - 1) % self.size
        self.right = (self.rank + 1) % self.size
        # the hot fields (above), shared with the Engine and read by the C paths
        self.hot = HotState(Traffic())
        self.traffic = self.hot.traffic  # reset, never replaced (as in_flight)
        # MPI attaches MPI_TAG_UB to COMM_WORLD; Open MPI's split communicators do not carry it
        tag_ub = comm.Get_attr(MPI.TAG_UB) or MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        self.tags = Tags(int(tag_ub) if tag_ub else None)
        # a blocking call's identity in words (mpiring.identity.describe, given by the Communicator)
        self.describe: Callable[[int, int], str] = lambda identity, size: f"call identity {identity:#x}"
        self.failures = 0  # calls that raised on this rank; picks the blocking tags' generation
        self.notices: list[MPI.Request] = []  # sends of waiting.leave_notice not yet known complete
        self.notice = bytearray(8)  # where a peer's notice is received (mpiring.engine.waiting)
        self.probed = MPI.Status()  # where waiting's probes for notices write
        # where ranks of one node post the calls they left (mpiring.engine.notice_board; the
        # Communicator opens it): a completed call looks there rather than probing for a notice
        self.notice_board: Any = None
        self.persistent_requests = 0  # made so far; picks each one's tag
        # how plans send: persistent requests, or new ones each run (transport.make_step;
        # read_settings: MPIRING_PERSISTENT_SENDS, else transport.persistent_sends_suit)
        self.persistent_sends = True
        # a schedule or plan being recorded (mpiring.engine.schedule, .plan): posts are recorded, not sent
        self.recorder: Any = None
        # layouts exchanged by the call running now, when the Communicator asks to see them
        # (after_layout): (the layout table, what finishes the call given one)
        self.layouts_seen: list[tuple[Any, Any]] | None = None
        # plans and steps abandoned with messages in flight: MPI may still write their buffers
        self.abandoned: list[Any] = []
        # the ranks by node (mpiring.topology; the Communicator finds out): node-aware algorithms
        # and `auto` read it
        self.nodes = NodeMap.single(self.size)
        # every rank on one real node: device buffers may move by CUDA IPC (the Communicator finds out)
        self.node_local = False
        # the machine has a core for each of its ranks, or the MPI library offers the core in each
        # test (topology.discover, alike on every rank of a machine): one more message per step
        # costs little there, where ranks that take turns on a core pay for each
        self.core_per_rank = False
        # the ranks whose machine has fewer cores than ranks (topology.discover, alike on every
        # rank): a chain of them on one node takes turns on the cores rather than running at once
        self.ranks_sharing_cores: frozenset[int] = frozenset()
        # the node has a core for each of its ranks, or the MPI library offers it in each test:
        # waits spin without offering the core themselves (read_settings; MPIRING_BUSY_POLL
        # overrides). Oversubscribed ranks offer it.
        self.busy_poll = False
        self.received = 0  # steps posted with receives so far (a call that received nothing needs no notice check)
        self.scratch_pool = ScratchPool()  # its limit is MPIRING_SCRATCH_BYTES (read_settings)
        # nonblocking collectives not yet done: every wait advances them all (waiting.wait_step)
        self.in_flight: list[InFlight] = self.hot.in_flight
        self.in_flight_bytes = IN_FLIGHT_BYTES  # the most their arrays may hold (MPIRING_INFLIGHT_BYTES)
        # survival on (mpiring.survival.Liveness): every wait polls and ends when its `failed` is set
        self.liveness: Any = None
        self._owner_thread: threading.Thread | None = None

    # ---- topology ----

    def takes_turns(self) -> bool:
        """Whether all its ranks sit on one node whose cores they outnumber: there the hops of a
        pipeline take turns on the cores, so splitting a message only adds steps."""
        return take_turns(self, range(self.size))

    def read_settings(self, busy_poll: bool | None = None) -> None:
        """What MPIRING_SCRATCH_BYTES, MPIRING_INFLIGHT_BYTES, MPIRING_BUSY_POLL and
        MPIRING_PERSISTENT_SENDS set (docs/environment.md), each with its default where unset
        (busy polling's: `core_per_rank`); `busy_poll`, the Communicator's own, comes first."""
        self.scratch_pool.limit = environment.positive_int("MPIRING_SCRATCH_BYTES", "Communicator") or POOL_BYTES
        self.in_flight_bytes = environment.positive_int("MPIRING_INFLIGHT_BYTES", "Communicator") or IN_FLIGHT_BYTES
        if busy_poll is None:
            busy_poll = environment.flag("MPIRING_BUSY_POLL", "Communicator")
        self.busy_poll = self.core_per_rank if busy_poll is None else busy_poll
        persistent_sends = environment.flag("MPIRING_PERSISTENT_SENDS", "Communicator")
        self.persistent_sends = persistent_sends_suit() if persistent_sends is None else persistent_sends

    def position(self, root: int) -> int:
        """Distance from `root` along the ring (root is 0, its right neighbour 1, ...)."""
        return (self.rank - root) % self.size

    def rank_at(self, position: int, root: int) -> int:
        return (root + position) % self.size

    # ---- what algorithms call ----

    def post(
        self,
        backend: NumpyBackend,
        tag: int,
        sends: Sequence[tuple[Any, int]] = (),
        receives: Sequence[tuple[Any, int]] = (),
    ) -> Step:
        """Post nonblocking receives into and sends from flat contiguous buffers (receives first,
        so a matching send never waits on an unposted receive).

        While a plan is built the step is recorded instead (mpiring.engine.plan). A backend that
        moves device buffers itself (`staged`: the staged and IPC paths) posts the step itself.
        """
        if self.recorder is not None:
            return self.recorder.post(backend, tag, sends, receives)
        if receives:
            self.received += 1
        if backend.staged:
            return backend.post_staged(self, tag, sends, receives)
        if sends:
            backend.ready_for_mpi()
        return make_step(self.comm, backend, tag, sends, receives, self.traffic)

    def scratch(self, backend: NumpyBackend, count: int, dtype: Any) -> Scratch:
        """A flat scratch array of `count` elements (`with ring.scratch(...) as buf`): while a
        plan is built, one of its own (the plan keeps it for its life); else from the pool
        (mpiring.engine.scratch), which reuses large buffers across calls. Small ones are made
        here, so a small call pays no call into the pool."""
        if self.recorder is not None:
            array = backend.empty(count, dtype)
            own = getattr(self.recorder, "own", None)
            if own is not None:  # a schedule's own, also where the backend is not the recording one (metadata)
                own(array)
            return Scratch(array)
        if count * backend.xp.dtype(dtype).itemsize < POOL_FROM_BYTES:
            return Scratch(backend.empty(count, dtype))
        return self.scratch_pool.take(backend, count, dtype)

    def metadata(self, count: int, dtype: Any) -> Any:
        """A host array for a collective's own small messages (a layout, a header): while a
        schedule is recorded, one of its own (whatever the backend of the call's data)."""
        array = numpy.empty(count, dtype)
        own = getattr(self.recorder, "own", None)
        if own is not None:
            own(array)
        return array

    def after_layout(self, table: Any, finish: Callable[..., Steps], backend: NumpyBackend, call: Call, x: Any,
                     out: Any) -> Steps:
        """Finish a call whose layout round brought `table`: `finish(ring, backend, call, x, out,
        table)`, the rest of the call for any layout. A schedule recorded from such a call replays
        the round, then its own rest while a new table equals the recorded one, else this
        `finish` (mpiring.engine.schedule); so the Communicator sees the table and `finish` here."""
        known = getattr(self.recorder, "layout_known", None)
        if known is not None:
            known(table, finish)  # ends the recording of the round (mpiring.engine.schedule)
        elif self.layouts_seen is not None:
            self.layouts_seen.append((table.copy(), finish))
        return (yield from finish(self, backend, call, x, out, table))

    # ---- tags: every rank takes them in the same order ----

    def next_tag(self) -> int:
        """A sequence tag for the next collective call; every rank calls collectives in the same
        order, and every call takes one, even one that raises."""
        hot = self.hot
        hot.calls += 1
        return self.tags.sequence(hot.calls)

    def blocking_tag(self, identity: int, numbered: bool = True) -> int:
        """The tag of the blocking call running now, of this identity (mpiring.identity), with its
        sequence number (`numbered`; calls on device buffers, whose plans bind their tags for
        life, take none); its generation changes after every call that raised here."""
        return self.tags.blocking(self.failures, identity, self.hot.calls if numbered else 0)

    def persistent_tag(self, identity: int) -> int:
        """A tag for a new persistent request of this identity (made collectively, in the same
        order everywhere)."""
        self.persistent_requests += 1
        return self.tags.persistent(self.persistent_requests, identity)

    # ---- who may call, and what a failed call leaves behind ----

    def claim(self, collective: str) -> None:  # collective: its name, or its builder's (`_allreduce`)
        """Check that this call comes from the ring's thread: the first one to call it.

        Calls must come in the same order on every rank. Two threads sharing a communicator
        interleave their calls differently on each rank, so their data would mix silently
        (even without overlapping calls): a second thread's call breaks the ring instead.
        The refusal changes nothing else: the owner may be inside a call (MPI waits let go of
        the GIL), and its call finishes as if none had come; its next one raises
        CommunicatorBrokenError. Every way into a communicator (a call, a request's start,
        test, wait or result, free) checks this before it touches the ring's state.
        """
        thread, hot = threading.get_ident(), self.hot
        if hot.owner is None:
            with _FIRST_CLAIM:  # two threads calling first at once: one of them owns it
                if hot.owner is None:
                    hot.owner, self._owner_thread = thread, threading.current_thread()
                    if hot.broken is None:
                        hot.served = thread
        if hot.owner != thread:
            collective = collective.lstrip("_")
            hot.broken = hot.broken or f"{collective} (called from a second thread)"
            hot.served = None
            raise ConcurrentUseError(collective)

    def claim_to_free(self, what: str) -> None:
        """Check that `what` (a free()) comes from the ring's thread, or from any thread once that
        thread has ended (it can be inside no call then), which takes the ring over; one of
        another thread still running is refused as `claim` refuses it."""
        owner = self._owner_thread
        if owner is not None and self.owner != threading.get_ident() and not owner.is_alive():
            with _FIRST_CLAIM:
                if self._owner_thread is owner:
                    self.owner, self._owner_thread = threading.get_ident(), threading.current_thread()
                    self.served = self.owner if self.broken is None else None
        self.claim(what)

    def abandon(self, call: Call, error: BaseException, in_flight: Any = None) -> None:
        """Record that `call` failed with messages possibly in flight (the first cause is kept).

        `in_flight` (the step or plan whose requests may still be active) stays referenced by
        the ring for its life, so that MPI never writes into memory Python has given away.
        """
        if self.broken is None:
            self.broken = f"{call.collective} ({call.algorithm}, step {call.step}: {type(error).__name__})"
        self.served = None  # no fast path runs another call on it
        if in_flight is not None:
            self.abandoned.append(in_flight)


def take_turns(ring: Any, members: Sequence[int]) -> bool:
    """Whether the ring ranks `members` all sit on one node of `ring` and share its cores."""
    node = ring.nodes.node(members[0])
    return all(member in node and member in ring.ranks_sharing_cores for member in members)


class SubRing:
    """Some of a ring's ranks seen as a ring of their own (a node's ranks, a lane, the leaders),
    for node-aware algorithms to run flat ones inside a node or across nodes.

    `members[i]` is the ring rank at position i. Its steps are the ring's own, on the same MPI
    communicator and tag, with peers renumbered: a call made of several sub-rings' steps is one
    call, recorded and replayed as any other. Messages of two phases between the same two ranks
    match in order, since both ranks run the phases in the same order (MPI does not overtake).

        ring:      0 1 2 3 4 5          SubRing(ring, (1, 3, 5)) on rank 3:
        sub-ring:    0   1   2          rank 1, size 3, left 0 (ring rank 1), right 2 (ring rank 5)
    """

    def __init__(self, ring: Ring, members: Sequence[int]) -> None:
        self.ring = ring
        self.members = tuple(members)
        self.rank = self.members.index(ring.rank)
        self.size = len(self.members)
        self.left = (self.rank - 1) % self.size
        self.right = (self.rank + 1) % self.size
        self.nodes = NodeMap.single(self.size)  # a sub-ring's algorithms are flat ones

    def takes_turns(self) -> bool:
        """As Ring.takes_turns, for these ranks: all on one node of the ring, whose cores they outnumber."""
        return take_turns(self.ring, self.members)

    def position(self, root: int) -> int:
        return (self.rank - root) % self.size

    def rank_at(self, position: int, root: int) -> int:
        return (root + position) % self.size

    def post(self, backend: NumpyBackend, tag: int, sends: Sequence[tuple[Any, int]] = (),
             receives: Sequence[tuple[Any, int]] = ()) -> Step:
        members = self.members
        return self.ring.post(backend, tag, [(buf, members[peer]) for buf, peer in sends],
                              [(buf, members[peer]) for buf, peer in receives])

    def scratch(self, backend: NumpyBackend, count: int, dtype: Any) -> Scratch:
        return self.ring.scratch(backend, count, dtype)
