"""A communicator's engine: how its calls are found, recorded and run.

`Communicator` checks arguments (its builders, one per collective) and hands every call to its
`Engine`, which does the rest behind a few entries:

- `run(collective, x, out, op, root, counts, algorithm, timeout)`: a blocking call. It is the C
  Shortcut (`native.shortcut`) where the extension was built and MPIRING_CHECK is off, which
  takes a cached host call without entering Python and hands anything else to `run_in_python`;
  else `run_in_python` itself.
- `start(...)`: a nonblocking call, as a `CollectiveRequest`.
- `persistent(...)`: a persistent request (MPI-4 `*_init`), recorded once for its arrays.
- `call(...)`: the `Call` a builder makes once its arguments passed (tag, timeout, MPIRING_CHECK).
- `free()`: the communicator's end (in-flight calls finish, the cache goes, the farewell).
- `plan_of(...)`: the schedule or plan a call would replay (tools, tests, the benchmark).

A blocking call on host arrays looks for the schedule of its layout (the collective, op, root,
counts, algorithm, the dtypes and shapes of x and out, whether out is x): in the common case the
C Shortcut finds and runs it; otherwise `_on_host_arrays` finds it or, not found, has the
builder check the arguments and make the call's generator of steps: the second call of a layout
every rank knows alone is recorded as a schedule, kept and run, any other runs its generator.
Device arrays: small calls run on host copies (Backend.run_on_host), others find a plan by their
arrays' identity (`_on_device_arrays`). Nonblocking calls run their generator. Every slow path
(a C replay that stopped, a failure) comes back here: `_after_shortcut`, `_blocking_failed`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from threading import get_ident
from typing import Any, NamedTuple

import numpy

from mpiring import identity
from mpiring.backend import NUMPY, backend_for
from mpiring.catalogue import CATALOGUE, SAME_SIZE_EVERYWHERE
from mpiring.engine import native
from mpiring.engine.cache import Cache
from mpiring.engine.farewell import say_farewell
from mpiring.engine.plan import Plan, build_plan
from mpiring.engine.recording import SeenOnce, Unschedulable
from mpiring.engine.requests import CollectiveRequest, PersistentRequest
from mpiring.engine.ring import Ring
from mpiring.engine.run import replay_in_python, resume_recorded, run_recorded, run_to_end
from mpiring.engine.schedule import Schedule, bindable, build_schedule, inside, layout_key
from mpiring.engine.transport import Call, Steps
from mpiring.engine.waiting import YIELD_SECONDS, c_spin, leave_notice, no_notice
from mpiring.errors import (
    ArgumentError,
    CommunicationError,
    CommunicatorBrokenError,
    CommunicatorFreedError,
    CommunicatorRevokedError,
    ConcurrentUseError,
    MpiringError,
    RankLostError,
)
from mpiring.ops import SUM
from mpiring.validation import check_algorithm, check_timeout


class Built(NamedTuple):
    """What a builder returns: what running the call needs."""

    call: Call
    backend: Any
    body: Callable[[Any], Steps]  # the call's steps for a backend (its own, or a plan's recorder)
    plannable: bool  # whether it may be recorded as a plan
    exchanging: bool = False  # whether it exchanges a layout before the data (a bit of its tag)

    def identity(self) -> int:
        """What the call's tags say it is (mpiring.identity)."""
        x, op, root, _ = self.call.checked
        return identity.of_call(self.call.collective, x, op, root, self.exchanging)


# A builder: (x, out, op, root, counts, algorithm, timeout) -> Built, checking the arguments first.
Builder = Callable[..., Built]

_NDARRAY = numpy.ndarray

# Survival: how long a call that failed on an MPI error waits for the watcher to say whether a
# peer died (a peer that dies mid-message makes MPI fail the receive; the watcher sees it at once).
LOSS_CONFIRMATION_SECONDS = 0.5

# Calls refused before they began (a freed or broken communicator, a second thread): no notice.
_REFUSALS = (CommunicatorFreedError, CommunicatorBrokenError, ConcurrentUseError)


class Engine:
    """The engine of one communicator: its ring, cache of schedules and plans, consistency check
    (MPIRING_CHECK; None when off), default timeout (None: no limit) and whether it was freed.

    `builders` maps each collective to its builder (the communicator's argument checks). The
    default timeout, whether it was freed and the table of compiled schedules live in the ring's
    HotState (`hot`), which the C Shortcut and a persistent request's C start and wait read."""

    def __init__(self, ring: Ring, check: Any, timeout: float | None, builders: dict[str, Builder]) -> None:
        self.ring = ring
        self.hot = ring.hot
        self.check = check
        self.timeout = timeout
        # schedules (host) and plans (device) of repeated calls; the compiled ones in hot.programs
        self.cache = Cache(self.hot.programs)
        self._builders = builders
        # a blocking call: a cached one in C where it can be (native.shortcut), else in Python
        self.run: Callable[..., Any] = self.run_in_python
        if check is None:
            self.run = native.shortcut(self.hot, self.run_in_python, self._after_shortcut, YIELD_SECONDS)

    @property
    def timeout(self) -> float | None:
        """The default timeout of the communicator's calls in seconds (None: no limit)."""
        return self.hot.timeout

    @timeout.setter
    def timeout(self, seconds: float | None) -> None:
        self.hot.timeout = None if seconds is None else float(seconds)  # (C reads a float)

    @property
    def freed(self) -> bool:
        """Whether the communicator was freed."""
        return self.hot.freed

    def free(self) -> None:
        """Free the communicator (Communicator.free): in-flight calls finish first, then the cache,
        the scratch and the MPI communicator (its farewell) go. A second call does nothing."""
        if self.freed:
            return
        ring = self.ring
        ring.claim_to_free("free")  # from another thread while its own may still call: refused
        for request in list(ring.in_flight):
            with contextlib.suppress(MpiringError):  # kept by the request: its wait() raises it
                request.wait()
        self.hot.freed = True
        ring.served = None  # no fast path takes a call now
        self.run = self.run_in_python  # the shortcut's memo of its last hit goes too
        self.cache.clear(keep=ring.abandoned)
        ring.scratch_pool.clear()
        liveness = ring.liveness
        if liveness is not None:
            liveness.close()
        say_farewell(ring, () if liveness is None else liveness.lost)

    def plan_of(self, collective: str, x: Any = None, out: Any = None, **arguments: Any) -> Schedule | Plan | None:
        """The schedule or plan a blocking call with these arrays replays, None if none yet
        (Communicator.plan_of)."""
        if _on_host(x, out):
            found = self.cache.table.get(self._layout_key(collective, x, out, **arguments))
            return found if type(found) is Schedule else None
        for plan in self.cache.table.values():
            if type(plan) is Plan and plan.call.collective == collective and plan.x is x and plan.out is out:
                return plan
        return None

    def _layout_key(self, collective: str, x: Any, out: Any, op: Any = None, root: Any = None, counts: Any = None,
                    algorithm: Any = None) -> tuple:
        entry = CATALOGUE[collective]
        op = (SUM if op is None else op) if entry.reduces else None
        root = (0 if root is None else root) if entry.rooted else None
        counts = counts_pair(*counts) if entry.send_counts and counts is not None else counts_key(counts)
        return layout_key(collective, x, out, op, root, counts, algorithm)

    def call(self, collective: str, algorithm: Any, timeout: Any, x: Any = None, op: Any = None,
             root: Any = None, counts: list[int] | None = None) -> Call:
        """A builder's call, once its arguments passed: usable here, its algorithm and timeout
        checked, its sequence number taken, and compared across the ranks under MPIRING_CHECK."""
        self._usable(collective)
        algorithm = check_algorithm(collective, algorithm)
        timeout = self.hot.timeout if timeout is None else self.limit(collective, timeout)
        call = Call(collective, algorithm, self.ring.next_tag(), timeout, checked=(x, op, root, counts))
        if self.check is not None:  # MPIRING_CHECK: the ranks compare x, op, root and counts first
            self.check.compare(call, x, op, root, counts)  # its exchange, like every call, breaks the ring on failure
        return call

    def _refused(self, collective: str) -> None:
        """The check at every way into a call that no fast path took: the calling thread is the
        communicator's (Ring.claim), and the communicator usable. A refusal raises here, before
        the call touches any state: a second thread's call leaves the owner's running call, the
        cache and the tags alone."""
        self.ring.claim(collective)
        self._usable(collective)

    def limit(self, collective: str, timeout: Any) -> float | None:
        """A call's own timeout, checked: None (no limit) becomes math.inf under survival, where
        every wait polls (an MPI_Waitall could not end when a peer is lost)."""
        seconds = check_timeout(collective, timeout)
        return math.inf if seconds is None and self.ring.liveness is not None else seconds

    def _usable(self, collective: str) -> None:
        hot = self.hot
        if hot.freed:
            raise CommunicatorFreedError(collective)
        if self.ring.liveness is not None and self.ring.liveness.failed:
            raise self.ring.liveness.error(collective)
        if hot.broken is not None:
            raise CommunicatorBrokenError(collective, hot.broken)

    def _build(self, collective: str, *args: Any) -> Built:
        """Run a collective's builder. A call that raises before it took its sequence number (a
        bad argument on some ranks only) takes it anyway, so every rank's next call has the same
        number and no message of this call can ever be matched by the next one. Only the
        communicator's own thread may call (Ring.claim)."""
        self.ring.claim(collective)
        hot = self.hot
        taken = hot.calls
        try:
            if self.ring.in_flight:
                self._check_aliasing(collective, args[0], args[1])
            return self._builders[collective](*args)  # Communicator._allreduce and the like
        except BaseException as error:
            if hot.calls == taken:
                self.ring.next_tag()
                if self.check is not None and isinstance(error, ArgumentError):
                    self._refuse(collective, error)
            raise

    def _refuse(self, collective: str, error: ArgumentError) -> None:
        """MPIRING_CHECK: this rank's own arguments failed before its call was compared. Send the
        error in the check's exchange, so every other rank raises it too (Checker.refuse); if the
        exchange itself fails, the ArgumentError is still what this rank raises."""
        with contextlib.suppress(MpiringError):
            self.check.refuse(collective, self.timeout, error)

    def checked(self, collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any) -> tuple:
        """(x, op, root, counts) as a call's tag and MPIRING_CHECK name it: scatter with counts= names
        the dtype and rows of the root's x and of every other rank's out= (its tag carries the dtype);
        alltoallv's counts differ by rank (not compared)."""
        if collective == "scatter":
            x = None if counts is None else x if self.ring.rank == root else out
        if collective == "alltoallv":
            counts = None
        return x, op, root, counts

    def _check_aliasing(self, collective: str, x: Any, out: Any) -> None:
        """Refuse a call whose output overlaps an array of a collective still in flight, or whose
        input overlaps such a collective's output: the two would race on each rank, and the ranks
        would disagree. Reading one array in two calls is fine. Host (NumPy) arrays only."""
        for request in self.ring.in_flight:
            their_x, their_out = request.arrays
            for mine, name, theirs, what in ((out, "out", their_x, "input"), (out, "out", their_out, "output"),
                                             (x, "x", their_out, "output")):
                if _overlap(mine, theirs):
                    raise ArgumentError(collective, name, f"shares memory with the {what} of a nonblocking "
                                        "collective still in flight: wait() for it first (the ranks would disagree)")

    def run_in_python(self, collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any,
                      algorithm: Any, timeout: Any) -> Any:
        """A blocking call that the C Shortcut did not take (or `run` where there is none)."""
        if self.hot.served != get_ident():  # another thread, a first call, or not usable
            self._refused(collective)
        if (x.__class__ is _NDARRAY or x is None) and (out is None or out.__class__ is _NDARRAY):
            return self._on_host_arrays(collective, x, out, op, root, counts, algorithm, timeout)
        if _foreign(x, out):  # another library's arrays: the call runs on views of their memory
            from mpiring import interop
            return interop.call(self.run, collective, x, out, op, root, counts, algorithm, timeout)
        if x.__class__ is not _NDARRAY and x is not None and collective in SAME_SIZE_EVERYWHERE:
            backend = backend_for(x)
            if backend.host_bytes and _fits_on_host(backend, x, out):
                return backend.run_on_host(x, out, lambda host_x, host_out: self.run(
                    collective, host_x, host_out, op, root, counts, algorithm, timeout))
        return self._on_device_arrays(collective, x, out, op, root, counts, algorithm, timeout)

    def _on_host_arrays(self, collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any,
                        algorithm: Any, timeout: Any) -> Any:
        ring = self.ring
        if x is not None and x is not out and not x.flags.c_contiguous:
            x = numpy.ascontiguousarray(x)  # what the collective would copy anyway: now the schedule fits
        try:
            key = layout_key(collective, x, out, op, root, counts, algorithm)
            known = self.cache.table.get(key)
        except TypeError:  # an unhashable op, root, counts or algorithm: the builder's checks name it
            key, known = None, None
        received = ring.received
        try:
            # A cached schedule runs only for the thread the ring serves while it is usable, checked
            # on the way in (run_in_python); a call of the owner's that failed also empties the cache.
            if known.__class__ is Schedule:
                hot = self.hot
                if self.check is None and not hot.in_flight:
                    # as the Shortcut runs its hits: in C where compiled, else in the Python replay (each
                    # binds x and out, or leaves them to the rest here)
                    limit = hot.timeout if timeout is None else self.limit(collective, timeout)
                    program = known.compiled
                    if program is not None:
                        known.call.timeout = limit  # (what a run that stopped resumes with)
                        result = program.call(hot, x, out, c_spin(limit), self._after_program_call)
                    else:
                        result = replay_in_python(ring, hot, known, x, out, limit)
                        if known.stale:
                            self._forget(known)
                    if result is not NotImplemented:
                        return result
                if known.fits(x, out):
                    return self._replay(known, collective, x, out, op, root, counts, timeout)
                if out is not None and known.own_offset < 0 and inside(x, out):
                    # x a block of out where the schedule cannot bind it: a copy apart, as it was recorded
                    x = x.copy()
                    if known.fits(x, out):
                        return self._replay(known, collective, x, out, op, root, counts, timeout)
            result = self._host_call(key, known, collective, x, out, op, root, counts, algorithm, timeout)
            if ring.received != received:  # it took data: none may come from a call a peer left
                no_notice(ring, collective, algorithm)
            return result
        except BaseException as error:
            self._blocking_failed(error)
            raise

    def _replay(self, schedule: Schedule, collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any,
                timeout: Any) -> Any:
        """A cached schedule's run on these arrays (`Schedule.fits` them): what the C Shortcut does."""
        # the call count keeps the ranks' sequence numbers together, as a built call does, and
        # dates the schedule's use (the least recently used is evicted first)
        hot = self.hot
        hot.calls = calls = hot.calls + 1
        if hot.in_flight:
            self._check_aliasing(collective, x, out)
        if self.check is not None:
            self.check.compare(schedule.call, *self.checked(collective, x, out, op, root, counts))
        schedule.bind(x, out, calls)
        # raising, it stays bound: MPI may still use the arrays
        result = run_recorded(self.ring, schedule, hot.timeout if timeout is None else self.limit(collective, timeout))
        schedule.unbind()
        if schedule.notice >= 0:  # it took data: none may come from a call a peer left (no_notice)
            schedule.no_notice(self.ring)
        if schedule.stale:
            self._forget(schedule)
        return result

    def _host_call(self, key: tuple | None, known: Any, collective: str, x: Any, out: Any, op: Any, root: Any,
                   counts: Any, algorithm: Any, timeout: Any) -> Any:
        """A host call with no schedule that fits: run unrecorded, or recorded and run."""
        ring = self.ring
        if known.__class__ is SeenOnce and known.recordable and out is not None and inside(x, out):
            # x is a block of out (an in-place gather's own): recorded with a copy of it apart, the
            # schedule binds x where it lies if its writes allow (Schedule.own_offset)
            x = x.copy()
        built = self._build(collective, x, out, op, root, counts, algorithm, timeout)
        call = built.call
        call.tag = ring.blocking_tag(built.identity())
        if key is None or not (built.plannable or built.exchanging):
            return run_to_end(ring, built.body(built.backend), call)
        if known is None:  # seen once: recorded the next time
            self.cache.add(key, SeenOnce(), ring.calls)
        if not (known.__class__ is SeenOnce and known.recordable and bindable(x, out)):
            return run_to_end(ring, built.body(built.backend), call)
        if built.exchanging:  # run it, seeing its layout round's table, then record it
            return self._run_and_record(key, known, built, x, out)
        try:  # the second call of this layout: record it
            schedule = self._record(call, built, x, out)
        except Unschedulable:
            known.recordable = False  # it runs unrecorded from now on, without trying again
            return run_to_end(ring, built.body(built.backend), call)
        self._keep(key, schedule, known)
        return self._run_schedule(schedule, x, out, call.timeout)

    def _run_and_record(self, key: tuple, known: SeenOnce, built: Built, x: Any, out: Any) -> Any:
        """A call with a layout round, run unrecorded while the table its round brings is kept
        (Ring.after_layout); then recorded for that table (schedule.build_schedule)."""
        ring, call = self.ring, built.call
        tag, algorithm = call.tag, call.algorithm
        ring.layouts_seen = []
        try:
            result = run_to_end(ring, built.body(built.backend), call)
        finally:
            seen, ring.layouts_seen = ring.layouts_seen, None
        call.tag, call.algorithm, call.step = tag, algorithm, 0  # as it was before its algorithm was chosen
        try:
            schedule = self._record(call, built, x, out, *seen)
        except Unschedulable:
            known.recordable = False
        else:
            self._keep(key, schedule, known)
        return result

    def _keep(self, key: tuple, schedule: Schedule, seen: SeenOnce) -> None:
        schedule.key, schedule.changes = key, seen.changes
        self.cache.add(key, schedule, self.ring.calls)

    def _forget(self, schedule: Schedule) -> None:
        """A schedule gone stale (its layout round brought another layout: Schedule.after_change)
        gives way to a SeenOnce, so the next call of its key records the layout now in use."""
        if self.cache.table.get(schedule.key) is schedule:
            self.cache.add(schedule.key, SeenOnce(schedule.changes), self.ring.calls)

    def _record(self, call: Call, built: Built, x: Any, out: Any, seen: Any = None) -> Schedule:
        """Record `built` as a schedule (`seen`: the table its layout round brought); where it
        cannot be one, leave the call as it was (the generator chose and tagged its algorithm
        while recording) and raise Unschedulable. A cached schedule keeps no call's arrays."""
        tag, algorithm = call.tag, call.algorithm
        try:
            schedule = build_schedule(self.ring, call, built.body, x, out, seen)
        except Unschedulable:
            call.tag, call.algorithm, call.step = tag, algorithm, 0
            raise
        call.checked = ()
        return schedule

    def _run_schedule(self, schedule: Schedule, x: Any, out: Any, timeout: float | None) -> Any:
        schedule.bind(x, out, self.hot.calls)
        self.ring.received += schedule.receives
        result = run_recorded(self.ring, schedule, timeout)  # raising, it stays bound: MPI may still use them
        schedule.unbind()
        return result

    def _on_device_arrays(self, collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any,
                          algorithm: Any, timeout: Any) -> Any:
        """A call on device arrays (or array-likes): its plan, found by the arrays' identity."""
        ring = self.ring
        table = self.cache.table
        received = ring.received
        try:
            key = (collective, id(x), id(out), op, root, counts, algorithm)
            known = table.get(key)
        except TypeError:  # an unhashable op, root, counts or algorithm: the builder's checks name it
            key, known = None, None
        try:
            # The same arrays may have been reshaped, restrided or retyped in place (Plan.fits).
            # Device arrays may have changed path (mpiring.gpu.device_backend reads the
            # environment on every call): compare their backend too.
            if (known.__class__ is Plan and known.fits(x, out)  # (the thread was checked on the way in)
                    and backend_for(out if x is None else x) is known.backend):
                self.hot.calls = known.used = self.hot.calls + 1
                if ring.in_flight:
                    self._check_aliasing(collective, x, out)
                if self.check is not None:
                    self.check.compare(known.call, *known.call.checked)
                timeout = self.hot.timeout if timeout is None else self.limit(collective, timeout)
                result = run_recorded(ring, known, timeout)
                if known.receives:  # it took data: none may come from a call a peer left
                    no_notice(ring, collective, algorithm)
                return result
            built = self._build(collective, x, out, op, root, counts, algorithm, timeout)
            call = built.call
            call.tag = ring.blocking_tag(built.identity(), numbered=built.backend is NUMPY)
            if built.plannable and key is not None and _caller_arrays(x, out, built.backend):
                if known is not None and known.seen(x, out):  # the second call with these arrays: plan it
                    plan = build_plan(ring, built.backend, call, built.body)
                    plan.bind(x, out)
                    self.cache.add(key, plan, ring.calls)
                    result = run_recorded(ring, plan, call.timeout)
                else:
                    self.cache.add(key, SeenOnce(x=x, out=out), ring.calls)
                    result = run_to_end(ring, built.body(built.backend), call)
            else:
                result = run_to_end(ring, built.body(built.backend), call)
            if ring.received != received:  # it took data: none may come from a call a peer left
                no_notice(ring, collective, algorithm)
            return result
        except BaseException as error:
            self._blocking_failed(error)
            raise

    def _after_shortcut(self, program: Any, stopped: tuple[int, int, int] | None, spin: float,
                        error: BaseException | None) -> Any:
        """Python takes over a cached call the C Shortcut ran (with the default timeout): it
        stopped waiting after `spin` seconds, or saw a wrong size or an MPI error (`stopped`), or
        recorded work raised `error`."""
        try:
            return self._after_c_run(program.schedule, self.timeout, stopped, spin, error)
        except BaseException as failure:
            self._blocking_failed(failure)
            raise

    def _after_program_call(self, program: Any, stopped: tuple[int, int, int] | None, spin: float,
                            error: BaseException | None) -> Any:
        """The same for a cached call found in Python and run by `Program.call` (its timeout on
        the call); `_on_host_arrays` handles a failure."""
        schedule = program.schedule
        return self._after_c_run(schedule, schedule.call.timeout, stopped, spin, error)

    def _after_c_run(self, schedule: Schedule, timeout: float | None, stopped: tuple[int, int, int] | None,
                     spin: float, error: BaseException | None) -> Any:
        try:
            if error is not None:
                raise error
            result = resume_recorded(self.ring, schedule, timeout, stopped, spin)
        except BaseException:
            self.ring.abandoned.append(schedule.bound_roots())  # MPI may still use the call's arrays
            raise
        finally:
            schedule.unbind()  # (the arrays the Python replay took from C's binding; C lets them go too)
        if schedule.stale:
            self._forget(schedule)
        return result

    def _blocking_failed(self, error: BaseException) -> None:
        """A blocking call raised `error`: its peers hear of it, the ring takes new tags. Under
        survival, an MPI error or a wrong size from a peer that died mid-message is the loss: it is
        raised as RankLostError once the watcher confirms it (it has, or will within a moment)."""
        lost = self._loss_behind(error)
        if not isinstance(error, _REFUSALS):  # peers waiting for this rank in this call raise now
            leave_notice(self.ring, lost or error)
        self._failed()
        if lost is not None:
            raise lost from error

    def _loss_behind(self, error: BaseException) -> BaseException | None:
        liveness = self.ring.liveness
        if liveness is None or not isinstance(error, CommunicationError) or isinstance(error, (
                RankLostError, CommunicatorRevokedError)):
            return None
        deadline = time.monotonic() + LOSS_CONFIRMATION_SECONDS
        while not liveness.failed and time.monotonic() < deadline:
            time.sleep(0.001)
        return liveness.error(getattr(error, "collective", "collective")) if liveness.failed else None

    def _failed(self) -> None:
        """A call raised here: later blocking calls take new tags (Ring.blocking_tag), so
        none of them can match a message the other ranks sent for this one."""
        self.ring.failures += 1
        self.cache.clear(keep=self.ring.abandoned)  # their messages carry the old tag

    def start(self, collective: str, *args: Any) -> CollectiveRequest:
        """A nonblocking call (args: x, out, op, root, counts, algorithm, timeout)."""
        if _foreign(args[0], args[1]):  # x, out of another library: see run_in_python
            from mpiring import interop
            return interop.start(self.start, collective, *args)
        if self.hot.served != get_ident():
            self._refused(collective)
        try:
            built = self._build(collective, *args)
            call = built.call
            # its sequence number, with its kind beside it: ranks that start different kinds of
            # call at the same place never match each other's messages
            call.tag = self.ring.tags.sequence(self.hot.calls, built.identity())
            call.arrays = (args[0], args[1])  # x, out
            return CollectiveRequest(self.ring, built.body(built.backend), built.call)
        except BaseException:
            self._failed()
            raise

    def persistent(self, collective: str, x: Any, out: Any, *args: Any) -> PersistentRequest:
        """A persistent request (args: op, root, counts, algorithm, timeout), recorded for its
        arrays where it can be."""
        if _foreign(x, out):  # see run_in_python
            from mpiring import interop
            return interop.start(self.persistent, collective, x, out, *args)
        ring, hot = self.ring, self.hot
        if hot.served != get_ident():
            self._refused(collective)
        try:
            built = self._build(collective, x, out, *args)
            call, backend, body = built.call, built.backend, built.body
            recorded = None
            # one tag for the request's life, recorded or not: whether a rank could record it
            # (its arrays may not bind) does not change a message, so ranks need not agree on it
            call.tag = ring.persistent_tag(built.identity())
            if built.plannable and _caller_arrays(x, out, backend):
                recorded = self._record_persistent(built, x, out)
        except BaseException:
            self._failed()
            raise

        call.arrays = (x, out)

        def started() -> None:  # what every call checks, for each start (the checks inline: a hot path)
            if hot.served != get_ident() or hot.freed or hot.broken is not None:
                self._refused(call.collective)
            hot.calls += 1
            if hot.in_flight:
                self._check_aliasing(call.collective, x, out)
            if self.check is not None:
                self.check.compare(call, *call.checked)

        request = PersistentRequest(ring, call, recorded, lambda: body(backend), started)
        if self.check is None:  # else `started` compares every run's arguments: in Python
            request.take_shortcut(hot)
        return request

    def _record_persistent(self, built: Built, x: Any, out: Any) -> Schedule | Plan | None:
        """A persistent request's own schedule (host) or plan (device), bound to its arrays for life;
        None where it cannot be recorded (it then runs its generator each start)."""
        if built.backend is not NUMPY:
            plan = build_plan(self.ring, built.backend, built.call, built.body)
            plan.bind(x, out)
            return plan
        if not bindable(x, out):
            return None
        try:
            schedule = self._record(built.call, built, x, out)
        except Unschedulable:
            return None
        if not schedule.fits(x, out):
            schedule.free()
            return None
        schedule.bind(x, out)
        return schedule


def counts_key(counts: Any) -> Any:
    """counts= as part of a plan's key: hashable (a tuple), or left as given when it is not a
    sequence (its check then names it)."""
    try:
        return None if counts is None else tuple(counts)
    except TypeError:
        return counts


def counts_pair(send_counts: Any, recv_counts: Any) -> tuple[Any, Any]:
    """alltoallv's counts as the one counts= part of a plan's key (see counts_key)."""
    return counts_key(send_counts), counts_key(recv_counts)


def _foreign(x: Any, out: Any) -> bool:
    """Whether x or out is another library's array (PyTorch, JAX, ...: mpiring.interop, loaded
    only once an argument is neither a NumPy array nor None)."""
    for array in (x, out):
        if array is not None and array.__class__ is not _NDARRAY:
            from mpiring import interop

            if interop.is_foreign(array):
                return True
    return False


def _caller_arrays(x: Any, out: Any, backend: Any) -> bool:
    """Whether the caller's own x and out (not arrays made from them) are what a plan would hold:
    arrays of the backend's own type (numpy.ndarray, cupy.ndarray), not array-likes."""
    kind = backend.xp.ndarray
    return (x is None or type(x) is kind) and (out is None or type(out) is kind)


def _overlap(a: Any, b: Any) -> bool:
    """Whether two host arrays share memory (exactly, within a bounded effort; beyond it, when
    their address ranges overlap)."""
    if a.__class__ is not _NDARRAY or b.__class__ is not _NDARRAY or not numpy.may_share_memory(a, b):
        return False
    try:
        return bool(numpy.shares_memory(a, b, max_work=10_000))
    except numpy.exceptions.TooHardError:
        return True


def _fits_on_host(backend: Any, x: Any, out: Any) -> bool:
    """Whether a small device call may run on host copies (Backend.run_on_host): x and out (if
    given) are the backend's own arrays, out contiguous so the result lands in it, and x small."""
    return (backend.is_array(x) and x.nbytes <= backend.host_bytes
            and (out is None or (backend.is_array(out) and out.flags.c_contiguous)))


def _on_host(x: Any, out: Any) -> bool:
    return (x is None or x.__class__ is _NDARRAY) and (out is None or out.__class__ is _NDARRAY)


def plannable(backend: Any, x: Any) -> bool:
    """Whether a call can be recorded as a plan: host arrays, or device arrays on the direct or
    staged path (not IPC: `plannable`), with the (checked) input C-contiguous, since the plan
    reads it in place. That the caller passed arrays, not array-likes, is _caller_arrays' to check."""
    return backend.plannable and (x is None or x.flags.c_contiguous)
