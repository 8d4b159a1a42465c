"""The public face of mpiring: `Communicator`, one method per collective, blocking and
nonblocking (the `i` prefix, as in MPI).

Each method checks its arguments (raising before any message moves), then drives the
collective's generator of ring steps: to the end for a blocking call, or step by step from
the returned request's test()/wait(). Names follow mpi4py's lowercase API.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from threading import get_ident
from typing import Any, NamedTuple

import numpy
from mpi4py import MPI

from mpiring import collectives, consistency, environment, identity, topology
from mpiring.backend import NUMPY, backend_for
from mpiring.buffer_api import BufferAPI
from mpiring.catalogue import CATALOGUE, SAME_SIZE_EVERYWHERE
from mpiring.engine import compiled
from mpiring.engine.cache import Cache, Seen
from mpiring.engine.executor import CollectiveRequest, PersistentRequest, resume_recorded, run_recorded, run_to_end
from mpiring.engine.farewell import leaving, let_go, say_farewell
from mpiring.engine.partition import row_bounds
from mpiring.engine.plan import Plan, Sighting, build_plan
from mpiring.engine.schedule import Schedule, Unschedulable, bindable, build_schedule, layout_key
from mpiring.engine.scratch import POOL_BYTES
from mpiring.engine.transport import Call, Steps, Traffic, persistent_sends_suit
from mpiring.engine.waiting import YIELD_SECONDS, leave_notice, no_notice
from mpiring.errors import (
    ArgumentError,
    CommunicationError,
    CommunicatorBrokenError,
    CommunicatorFreedError,
    ConcurrentUseError,
    MpiringError,
)
from mpiring.launch import check_world_size
from mpiring.ops import SUM
from mpiring.ring import IN_FLIGHT_BYTES, Ring
from mpiring.selection import read_environment
from mpiring.validation import (
    check_algorithm,
    check_array,
    check_counts,
    check_op,
    check_out,
    check_root,
    check_timeout,
)


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


_NDARRAY = numpy.ndarray

# Calls refused before they began (a freed or broken communicator, a second thread): no notice.
_REFUSALS = (CommunicatorFreedError, CommunicatorBrokenError, ConcurrentUseError)

# How long a collective step waits by default before raising CollectiveTimeout (torch.distributed's
# default): long enough for any honest imbalance, short enough that a lost rank ends the job.
DEFAULT_TIMEOUT = 600.0


class Communicator(BufferAPI):
    """Ring collectives over an mpi4py intracommunicator (COMM_WORLD by default).

    Creating one is collective: every rank of `comm` must do it. mpiring's messages travel on
    a private duplicate of `comm`, so they never mix with the caller's own messages.

    `timeout` (seconds; default from the MPIRING_TIMEOUT environment variable, else 10 minutes,
    as in torch.distributed) bounds how long any collective of this communicator waits for a
    step before raising `CollectiveTimeout`, so no job hangs for ever by default; `math.inf` (or
    MPIRING_TIMEOUT=none) waits without limit. Each call may override it with its own `timeout=`.

    `check` (default from the MPIRING_CHECK environment variable, else off) makes every
    collective first compare a fingerprint of its call across the ranks and raise
    `CollectiveMismatchError` on every rank where they differ (see mpiring.consistency).
    """

    def __init__(self, comm: MPI.Intracomm | None = None, *, timeout: float | None = None,
                 check: bool | None = None) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm) or base == MPI.COMM_NULL:
            raise ArgumentError("Communicator", "comm", f"must be an mpi4py intracommunicator, got {base!r}")
        if comm is None:  # a launcher that started N processes but not one N-rank job: say so now
            check_world_size(base.Get_size())
        read_environment()
        if timeout is None:
            from_environment = environment.seconds("MPIRING_TIMEOUT", "Communicator")
            timeout = DEFAULT_TIMEOUT if from_environment is None else from_environment
        self.timeout = check_timeout("Communicator", timeout)  # None: no limit
        self._mpi = base
        self._freed = False
        let_go()  # communicators freed earlier whose peers' farewells have come since
        with _communicator_made():
            private = base.Dup()
        self._ring = Ring(private)
        self._ring.describe = identity.describe
        self._ring.scratch_pool.limit = environment.positive_int("MPIRING_SCRATCH_BYTES", "Communicator") or POOL_BYTES
        self._ring.in_flight_bytes = (environment.positive_int("MPIRING_INFLIGHT_BYTES", "Communicator")
                                      or IN_FLIGHT_BYTES)
        try:
            with _communicator_made():
                self._ring.nodes, self._ring.node_local, cores_for_all = topology.discover(self._ring.comm)
        except CommunicationError:
            private.Free()
            raise
        busy_poll = environment.flag("MPIRING_BUSY_POLL", "Communicator")
        self._ring.busy_poll = cores_for_all if busy_poll is None else busy_poll
        persistent_sends = environment.flag("MPIRING_PERSISTENT_SENDS", "Communicator")
        self._ring.persistent_sends = persistent_sends_suit() if persistent_sends is None else persistent_sends
        self._check = consistency.make_checker(self._ring, check, self.timeout)
        self._cache = Cache()  # schedules (host) and plans (device) of repeated calls
        # what the methods call: a cached call in C where it can be (compiled.shortcut), else in Python
        self._blocking = self._blocking_in_python
        if self._check is None:
            self._blocking = compiled.shortcut(self._cache.compiled, self._ring, self, self._blocking_in_python,
                                               self._after_shortcut, YIELD_SECONDS)

    @property
    def rank(self) -> int:
        return self._ring.rank

    @property
    def size(self) -> int:
        return self._ring.size

    @property
    def mpi(self) -> MPI.Intracomm:
        """The mpi4py communicator this one wraps."""
        return self._mpi

    @property
    def traffic(self) -> Traffic:
        """Bytes and messages this communicator has handed to MPI; `traffic.reset()` zeroes them."""
        return self._ring.traffic

    def plan_of(self, collective: str, x: Any = None, out: Any = None, **arguments: Any) -> Schedule | Plan | None:
        """The schedule (host arrays: any of this layout) or plan (device arrays: these very ones) a
        blocking `collective` call with these arrays replays, None if it has none yet: for tools,
        tests and the benchmark (docs/engine.md). `arguments`: the call's op, root, counts and
        algorithm where they are not the defaults (op "sum", root 0 for rooted calls)."""
        if _on_host(x, out):
            found = self._cache.table.get(self._layout_key(collective, x, out, **arguments))
            return found if type(found) is Schedule else None
        for plan in self._cache.table.values():
            if type(plan) is Plan and plan.call.collective == collective and plan.x is x and plan.out is out:
                return plan
        return None

    def _layout_key(self, collective: str, x: Any, out: Any, op: Any = None, root: Any = None, counts: Any = None,
                    algorithm: Any = None) -> tuple:
        entry = CATALOGUE[collective]
        op = (SUM if op is None else op) if entry.reduces else None
        root = (0 if root is None else root) if entry.rooted else None
        counts = _counts_pair(*counts) if entry.send_counts and counts is not None else _key(counts)
        return layout_key(collective, x, out, op, root, counts, algorithm)

    def free(self) -> None:
        """Release the private MPI communicator (collective; a second call does nothing).

        Nonblocking collectives still in flight finish first (each up to its timeout; an error
        stays with its request, whose wait() raises it). Collectives called afterwards raise
        CommunicatorFreedError. The MPI communicator is freed once every peer's farewell has
        come (engine.farewell): free() never waits for it, a later free() or Communicator()
        of the process finishes the job. A rank where a call was abandoned with messages in
        flight (a timeout) keeps its MPI communicator (one context id): MPI may still use them.
        """
        if self._freed:
            return
        ring = self._ring
        ring.claim_to_free("free")  # from another thread while its own may still call: refused
        for request in list(ring.in_flight):
            with contextlib.suppress(MpiringError):  # kept by the request: its wait() raises it
                request.wait()
        self._freed = True
        ring.served = None  # no fast path takes a call now
        self._blocking = self._blocking_in_python  # the shortcut's memo of its last hit goes too
        self._cache.clear(keep=ring.abandoned)
        ring.scratch_pool.clear()
        say_farewell(ring)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.free()

    # ---- plumbing ----
    #
    # A blocking call on host arrays looks for the schedule of its layout (the collective, op,
    # root, counts, algorithm, the dtypes and shapes of x and out, whether out is x): in the
    # common case the C Shortcut finds and runs it without entering Python (compiled.shortcut);
    # here, `_on_host_arrays` finds it or, not found, has a builder check the arguments and make
    # the call's generator of steps: the second call of a layout every rank knows alone is
    # recorded as a schedule, kept and run, any other runs its generator. Device arrays: small
    # calls run on host copies (Backend.run_on_host), others find a plan by their arrays'
    # identity (`_on_device_arrays`). Nonblocking calls run their generator.

    def _call(self, collective: str, algorithm: Any, timeout: Any, x: Any = None, op: Any = None,
              root: Any = None, counts: list[int] | None = None) -> Call:
        self._usable(collective)
        algorithm = check_algorithm(collective, algorithm)
        timeout = self.timeout if timeout is None else check_timeout(collective, timeout)
        call = Call(collective, algorithm, self._ring.next_tag(), timeout, checked=(x, op, root, counts))
        if self._check is not None:  # MPIRING_CHECK: the ranks compare x, op, root and counts first
            self._check.compare(call, x, op, root, counts)  # its exchange, like every call, breaks the ring on failure
        return call

    def _refused(self, collective: str) -> None:
        """The check at every way into a call that no fast path took: the calling thread is the
        communicator's (Ring.claim), and the communicator usable. A refusal raises here, before
        the call touches any state: a second thread's call leaves the owner's running call, the
        cache and the tags alone."""
        self._ring.claim(collective)
        self._usable(collective)

    def _usable(self, collective: str) -> None:
        if self._freed:
            raise CommunicatorFreedError(collective)
        if self._ring.broken is not None:
            raise CommunicatorBrokenError(collective, self._ring.broken)

    def _build(self, collective: str, *args: Any) -> Built:
        """Run a collective's builder. A call that raises before it took its sequence number (a
        bad argument on some ranks only) takes it anyway, so every rank's next call has the same
        number and no message of this call can ever be matched by the next one. Only the
        communicator's own thread may call (Ring.claim)."""
        self._ring.claim(collective)
        taken = self._ring.calls
        try:
            if self._ring.in_flight:
                self._check_aliasing(collective, args[0], args[1])
            return getattr(self, "_" + collective)(*args)  # _allreduce and the like, below
        except BaseException as error:
            if self._ring.calls == taken:
                self._ring.next_tag()
                if self._check is not None and isinstance(error, ArgumentError):
                    self._refuse(collective, error)
            raise

    def _refuse(self, collective: str, error: ArgumentError) -> None:
        """MPIRING_CHECK: this rank's own arguments failed before its call was compared. Send the
        error in the check's exchange, so every other rank raises it too (Checker.refuse); if the
        exchange itself fails, the ArgumentError is still what this rank raises."""
        with contextlib.suppress(MpiringError):
            self._check.refuse(collective, self.timeout, error)

    def _checked(self, collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any) -> tuple:
        """(x, op, root, counts) as a call's tag and MPIRING_CHECK name it: scatter with counts= names
        the dtype and rows of the root's x and of every other rank's out= (its tag carries the dtype);
        alltoallv's counts differ by rank (not compared)."""
        if collective == "scatter":
            x = None if counts is None else x if self.rank == root else out
        if collective == "alltoallv":
            counts = None
        return x, op, root, counts

    def _check_aliasing(self, collective: str, x: Any, out: Any) -> None:
        """Refuse a call whose output overlaps an array of a collective still in flight, or whose
        input overlaps such a collective's output: the two would race on each rank, and the ranks
        would disagree. Reading one array in two calls is fine. Host (NumPy) arrays only."""
        for request in self._ring.in_flight:
            their_x, their_out = request.arrays
            for mine, name, theirs, what in ((out, "out", their_x, "input"), (out, "out", their_out, "output"),
                                             (x, "x", their_out, "output")):
                if _overlap(mine, theirs):
                    raise ArgumentError(collective, name, f"shares memory with the {what} of a nonblocking "
                                        "collective still in flight: wait() for it first (the ranks would disagree)")

    def _blocking_in_python(self, collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any,
                            algorithm: Any, timeout: Any) -> Any:
        if self._ring.served != get_ident():  # another thread, a first call, or not usable
            self._refused(collective)
        if (x.__class__ is _NDARRAY or x is None) and (out is None or out.__class__ is _NDARRAY):
            return self._on_host_arrays(collective, x, out, op, root, counts, algorithm, timeout)
        if _foreign(x, out):  # another library's arrays: the call runs on views of their memory
            from mpiring import interop
            return interop.call(self._blocking, collective, x, out, op, root, counts, algorithm, timeout)
        if x.__class__ is not _NDARRAY and x is not None and collective in SAME_SIZE_EVERYWHERE:
            backend = backend_for(x)
            if backend.host_bytes and _fits_on_host(backend, x, out):
                return backend.run_on_host(x, out, lambda host_x, host_out: self._blocking(
                    collective, host_x, host_out, op, root, counts, algorithm, timeout))
        return self._on_device_arrays(collective, x, out, op, root, counts, algorithm, timeout)

    def _on_host_arrays(self, collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any,
                        algorithm: Any, timeout: Any) -> Any:
        ring = self._ring
        if x is not None and x is not out and not x.flags.c_contiguous:
            x = numpy.ascontiguousarray(x)  # what the collective would copy anyway: now the schedule fits
        try:
            key = layout_key(collective, x, out, op, root, counts, algorithm)
            known = self._cache.table.get(key)
        except TypeError:  # an unhashable op, root, counts or algorithm: the builder's checks name it
            key, known = None, None
        received = ring.received
        try:
            result = self._host_call(key, known, collective, x, out, op, root, counts, algorithm, timeout)
            if ring.received != received:  # it took data: none may come from a call a peer left
                no_notice(ring, collective, algorithm)
            return result
        except BaseException as error:
            self._blocking_failed(error)
            raise

    def _host_call(self, key: tuple | None, known: Any, collective: str, x: Any, out: Any, op: Any, root: Any,
                   counts: Any, algorithm: Any, timeout: Any) -> Any:
        ring = self._ring
        # A cached schedule runs only for the thread the ring serves while it is usable, checked on
        # the way in (_blocking_in_python); a call of the owner's that failed also empties the cache.
        if known.__class__ is Schedule and known.fits(x, out):
            # the call count keeps the ranks' sequence numbers together, as a built call does,
            # and dates the schedule's use (the least recently used is evicted first)
            ring.calls = known.used = ring.calls + 1
            if ring.in_flight:
                self._check_aliasing(collective, x, out)
            if self._check is not None:
                self._check.compare(known.call, *self._checked(collective, x, out, op, root, counts))
            result = self._run_schedule(known, x, out, self.timeout if timeout is None else
                                        check_timeout(collective, timeout))
            if known.stale:
                self._forget(known)
            return result
        built = self._build(collective, x, out, op, root, counts, algorithm, timeout)
        call = built.call
        call.tag = ring.blocking_tag(built.identity())
        if key is None or not (built.plannable or built.exchanging):
            return run_to_end(ring, built.body(built.backend), call)
        if known is None:  # seen once: recorded the next time
            self._cache.add(key, Seen(), ring.calls)
        if not (known.__class__ is Seen and known.recordable and bindable(x, out)):
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

    def _run_and_record(self, key: tuple, known: Seen, built: Built, x: Any, out: Any) -> Any:
        """A call with a layout round, run unrecorded while the table its round brings is kept
        (Ring.after_layout); then recorded for that table (schedule.build_schedule)."""
        ring, call = self._ring, built.call
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

    def _keep(self, key: tuple, schedule: Schedule, seen: Seen) -> None:
        schedule.key, schedule.changes = key, seen.changes
        self._cache.add(key, schedule, self._ring.calls)

    def _forget(self, schedule: Schedule) -> None:
        """A schedule gone stale (its layout round brought another layout: Schedule.after_change)
        gives way to a Seen, so the next call of its key records the layout now in use."""
        if self._cache.table.get(schedule.key) is schedule:
            self._cache.add(schedule.key, Seen(schedule.changes), self._ring.calls)

    def _record(self, call: Call, built: Built, x: Any, out: Any, seen: Any = None) -> Schedule:
        """Record `built` as a schedule (`seen`: the table its layout round brought); where it
        cannot be one, leave the call as it was (the generator chose and tagged its algorithm
        while recording) and raise Unschedulable. A cached schedule keeps no call's arrays."""
        tag, algorithm = call.tag, call.algorithm
        try:
            schedule = build_schedule(self._ring, call, built.body, x, out, seen)
        except Unschedulable:
            call.tag, call.algorithm, call.step = tag, algorithm, 0
            raise
        call.checked = ()
        return schedule

    def _run_schedule(self, schedule: Schedule, x: Any, out: Any, timeout: float | None) -> Any:
        schedule.count_run()
        schedule.number(self._ring.calls)
        self._ring.received += schedule.receives
        schedule.bind(x, out)
        result = run_recorded(self._ring, schedule, timeout)  # raising, it stays bound: MPI may still use them
        schedule.unbind()
        return result

    def _on_device_arrays(self, collective: str, x: Any, out: Any, op: Any, root: Any, counts: Any,
                          algorithm: Any, timeout: Any) -> Any:
        """A call on device arrays (or array-likes): its plan, found by the arrays' identity."""
        ring = self._ring
        table = self._cache.table
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
                ring.calls = known.used = ring.calls + 1
                if ring.in_flight:
                    self._check_aliasing(collective, x, out)
                if self._check is not None:
                    self._check.compare(known.call, *known.call.checked)
                timeout = self.timeout if timeout is None else check_timeout(collective, timeout)
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
                    self._cache.add(key, plan, ring.calls)
                    result = run_recorded(ring, plan, call.timeout)
                else:
                    self._cache.add(key, Sighting(x, out), ring.calls)
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
        """Python takes over a cached call the C Shortcut ran: it stopped waiting after `spin`
        seconds, or saw a wrong size or an MPI error (`stopped`), or recorded work raised `error`."""
        schedule = program.schedule
        try:
            if error is not None:
                raise error
            result = resume_recorded(self._ring, schedule, self.timeout, stopped, spin)
            if schedule.stale:
                self._forget(schedule)
            return result
        except BaseException as failure:
            self._ring.abandoned.append(schedule.bound_roots())  # MPI may still use the call's arrays
            self._blocking_failed(failure)
            raise

    def _blocking_failed(self, error: BaseException) -> None:
        if not isinstance(error, _REFUSALS):  # peers waiting for this rank in this call raise now
            leave_notice(self._ring, error)
        self._failed()

    def _failed(self) -> None:
        """A call raised here: later blocking calls take new tags (Ring.blocking_tag), so
        none of them can match a message the other ranks sent for this one."""
        self._ring.failures += 1
        self._cache.clear(keep=self._ring.abandoned)  # their messages carry the old tag

    def _start(self, collective: str, *args: Any) -> CollectiveRequest:
        if _foreign(args[0], args[1]):  # x, out of another library: see _blocking_in_python
            from mpiring import interop
            return interop.start(self._start, collective, *args)
        if self._ring.served != get_ident():
            self._refused(collective)
        try:
            built = self._build(collective, *args)
            call = built.call
            # its sequence number, with its kind beside it: ranks that start different kinds of
            # call at the same place never match each other's messages
            call.tag = self._ring.tags.sequence(self._ring.calls, built.identity())
            call.arrays = (args[0], args[1])  # x, out
            return CollectiveRequest(self._ring, built.body(built.backend), built.call)
        except BaseException:
            self._failed()
            raise

    def _persistent(self, collective: str, x: Any, out: Any, *args: Any) -> PersistentRequest:
        if _foreign(x, out):  # see _blocking_in_python
            from mpiring import interop
            return interop.start(self._persistent, collective, x, out, *args)
        ring = self._ring
        if ring.served != get_ident():
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
            if ring.served != get_ident() or self._freed or ring.broken is not None:
                self._refused(call.collective)
            ring.calls += 1
            if ring.in_flight:
                self._check_aliasing(call.collective, x, out)
            if self._check is not None:
                self._check.compare(call, *call.checked)

        request = PersistentRequest(ring, call, recorded, lambda: body(backend), started)
        if self._check is None:  # else `started` compares every run's arguments: in Python
            request.take_shortcut(self)
        return request

    def _record_persistent(self, built: Built, x: Any, out: Any) -> Schedule | Plan | None:
        """A persistent request's own schedule (host) or plan (device), bound to its arrays for life;
        None where it cannot be recorded (it then runs its generator each start)."""
        if built.backend is not NUMPY:
            plan = build_plan(self._ring, built.backend, built.call, built.body)
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

    # ---- the collectives: builders check arguments and return what running the call needs ----

    def _broadcast(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("broadcast", "x", x, backend)
        root = check_root("broadcast", root, self.size)
        out = check_out("broadcast", out, x.shape, x.dtype, backend)
        call = self._call("broadcast", algorithm, timeout, x, None, root)
        body = partial(collectives.broadcast, self._ring, call=call, x=x, root=root, out=out)
        return Built(call, backend, body, _plannable(backend, x))

    def _reduce(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("reduce", "x", x, backend)
        op = check_op("reduce", op, x.dtype)
        root = check_root("reduce", root, self.size)
        if self.rank == root:
            out = check_out("reduce", out, x.shape, x.dtype, backend)
        call = self._call("reduce", algorithm, timeout, x, op, root)
        body = partial(collectives.reduce, self._ring, call=call, x=x, op=op, root=root, out=out)
        return Built(call, backend, body, _plannable(backend, x))

    def _allreduce(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("allreduce", "x", x, backend)
        op = check_op("allreduce", op, x.dtype)
        out = check_out("allreduce", out, x.shape, x.dtype, backend)
        call = self._call("allreduce", algorithm, timeout, x, op)
        body = partial(collectives.allreduce, self._ring, call=call, x=x, op=op, out=out)
        return Built(call, backend, body, _plannable(backend, x))

    def _gather(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("gather", "x", x, backend, split=True)
        root = check_root("gather", root, self.size)
        rows = self._known_rows("gather", x, out if self.rank == root else None, counts, backend)
        call = self._call("gather", algorithm, timeout, x, None, root, rows)
        body = partial(collectives.gather, self._ring, call=call, x=x, root=root, out=out, rows=rows)
        return Built(call, backend, body, rows is not None and _plannable(backend, x), rows is None)

    def _allgather(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("allgather", "x", x, backend, split=True)
        rows = self._known_rows("allgather", x, out, counts, backend)
        call = self._call("allgather", algorithm, timeout, x, None, None, rows)
        body = partial(collectives.allgather, self._ring, call=call, x=x, out=out, rows=rows)
        return Built(call, backend, body, rows is not None and _plannable(backend, x), rows is None)

    def _known_rows(self, collective: str, x: Any, out: Any, counts: Any, backend: Any) -> list[int] | None:
        """Every rank's row count when `counts=` gives them (the same list on every rank), else
        None: they are exchanged. An out= cannot tell: one rank's rows times the world size may
        equal the total of ragged rows, and a rank that skipped the exchange while the others
        ran it would wait for ever (or, blocking, raise a mismatch)."""
        counts = check_counts(collective, counts, self.size)
        if counts is None:
            return None
        if x.shape[0] != counts[self.rank]:
            raise ArgumentError(collective, "counts", f"gives rank {self.rank} {counts[self.rank]} rows "
                                f"but its x has {x.shape[0]}")
        check_out(collective, out, (sum(counts), *x.shape[1:]), x.dtype, backend)
        return list(counts)

    def _scatter(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        root = check_root("scatter", root, self.size)
        counts = check_counts("scatter", counts, self.size)
        backend = backend_for(out) if out is not None else NUMPY
        root_problem, layout = None, None
        if self.rank == root:
            backend = backend_for(x)
            try:
                x = check_array("scatter", "x", x, backend, split=True)
                if counts is not None and sum(counts) != x.shape[0]:
                    raise ArgumentError("scatter", "counts", f"add up to {sum(counts)} rows but x has {x.shape[0]}")
            except ArgumentError as problem:
                if counts is not None:
                    raise  # no header goes out with counts=: the other ranks time out
                root_problem = problem  # every rank must hear of it in the header, or they would wait for data
            if counts is not None:
                layout = (x.shape, x.dtype)
        elif counts is not None:
            if out is None or not backend.is_array(out) or out.ndim == 0:
                raise ArgumentError("scatter", "out", "must be given on every rank with counts= (it gives the "
                                    "dtype and row shape, which only the root's x has)")
            check_array("scatter", "out", out, backend)  # a dtype it can take, in native byte order
            check_out("scatter", out, out.shape, out.dtype, backend)  # writable
            layout = ((sum(counts), *out.shape[1:]), out.dtype)
        call = self._call("scatter", algorithm, timeout, *self._checked("scatter", x, out, None, root, counts))
        body = partial(collectives.scatter, self._ring, call=call, x=x, root=root, out=out, root_problem=root_problem,
                       counts=counts, layout=layout)
        plannable = layout is not None and _plannable(backend, x if self.rank == root else None)
        return Built(call, backend, body, plannable, layout is None)

    def _reduce_scatter(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("reduce_scatter", "x", x, backend, split=True)
        op = check_op("reduce_scatter", op, x.dtype)
        counts = check_counts("reduce_scatter", counts, self.size)
        if counts is not None and sum(counts) != x.shape[0]:
            raise ArgumentError("reduce_scatter", "counts", f"add up to {sum(counts)} rows but x has {x.shape[0]}")
        rows = row_bounds(x.shape[0], self.size, counts)
        check_out("reduce_scatter", out, (rows[self.rank + 1] - rows[self.rank], *x.shape[1:]), x.dtype, backend)
        call = self._call("reduce_scatter", algorithm, timeout, x, op, None, counts)
        body = partial(collectives.reduce_scatter, self._ring, call=call, x=x, op=op, out=out, counts=counts)
        return Built(call, backend, body, _plannable(backend, x))

    def _barrier(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        call = self._call("barrier", algorithm, timeout)
        return Built(call, NUMPY, partial(collectives.barrier, self._ring, call=call), True)

    def _alltoall(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        backend = backend_for(x)
        x = check_array("alltoall", "x", x, backend, split=True)
        if x.shape[0] % self.size:
            raise ArgumentError("alltoall", "x", f"has {x.shape[0]} rows, not a multiple of the {self.size} ranks "
                                "(every rank gets an equal block; alltoallv takes uneven ones)")
        out = check_out("alltoall", out, x.shape, x.dtype, backend)
        call = self._call("alltoall", algorithm, timeout, x)
        body = partial(collectives.alltoall, self._ring, call=call, x=x, out=out)
        return Built(call, backend, body, _plannable(backend, x))

    def _alltoallv(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        send_counts, recv_counts = counts  # as _counts_pair made them
        backend = backend_for(x)
        x = check_array("alltoallv", "x", x, backend, split=True)
        send_counts = check_counts("alltoallv", send_counts, self.size, "send_counts")
        if send_counts is None or sum(send_counts) != x.shape[0]:
            have = "are missing" if send_counts is None else f"add up to {sum(send_counts)} rows"
            raise ArgumentError("alltoallv", "send_counts", f"{have}, but x has {x.shape[0]}")
        recv_counts = check_counts("alltoallv", recv_counts, self.size, "recv_counts")
        if recv_counts is not None:  # else out= is checked in the count exchange, on every rank alike
            out = check_out("alltoallv", out, (sum(recv_counts), *x.shape[1:]), x.dtype, backend)
        call = self._call("alltoallv", algorithm, timeout, x)
        body = partial(collectives.alltoallv, self._ring, call=call, x=x, out=out, send_counts=send_counts,
                       recv_counts=recv_counts)
        return Built(call, backend, body, recv_counts is not None and _plannable(backend, x), recv_counts is None)

    def _scan(self, x, out, op, root, counts, algorithm, timeout, collective: str = "scan") -> Built:
        backend = backend_for(x)
        x = check_array(collective, "x", x, backend)
        op = check_op(collective, op, x.dtype)
        exclusive = collective == "exscan"
        if not (exclusive and self.rank == 0):  # exscan's rank 0 has no result: its out= is ignored
            out = check_out(collective, out, x.shape, x.dtype, backend)
        call = self._call(collective, algorithm, timeout, x, op)
        body = partial(collectives.scan, self._ring, call=call, x=x, op=op, out=out, exclusive=exclusive)
        return Built(call, backend, body, _plannable(backend, x))

    def _exscan(self, x, out, op, root, counts, algorithm, timeout) -> Built:
        return self._scan(x, out, op, root, counts, algorithm, timeout, "exscan")

    # ---- blocking ----

    def broadcast(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> Any:
        """Every rank gets root's `x`. Every rank passes an array of root's shape and dtype."""
        return self._blocking("broadcast", x, out, None, root, None, algorithm, timeout)

    def reduce(self, x: Any, op: str = SUM, root: int = 0, *, out: Any = None, algorithm: str | None = None,
               timeout: float | None = None) -> Any:
        """The root gets the elementwise reduction of every rank's `x`; other ranks get None."""
        return self._blocking("reduce", x, out, op, root, None, algorithm, timeout)

    def allreduce(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> Any:
        """Every rank gets the elementwise reduction of every rank's `x` (bitwise the same)."""
        return self._blocking("allreduce", x, out, op, None, None, algorithm, timeout)

    def gather(self, x: Any, root: int = 0, *, out: Any = None, counts: Any = None, algorithm: str | None = None,
               timeout: float | None = None) -> Any:
        """The root gets every rank's `x` concatenated along axis 0 in rank order; others get None.

        Ranks may pass different numbers of rows; the other dimensions and the dtype must agree.
        `counts=` (every rank's rows, the same list on every rank) saves the exchange of row counts.
        """
        return self._blocking("gather", x, out, None, root, _key(counts), algorithm, timeout)

    def allgather(self, x: Any, *, out: Any = None, counts: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> Any:
        """Every rank gets every rank's `x` concatenated along axis 0 in rank order.

        Ranks may pass different numbers of rows. `counts=` (every rank's rows, the same on every
        rank) saves the exchange of row counts.
        """
        return self._blocking("allgather", x, out, None, None, _key(counts), algorithm, timeout)

    def scatter(self, x: Any = None, root: int = 0, *, out: Any = None, counts: Any = None,
                algorithm: str | None = None, timeout: float | None = None) -> Any:
        """Root's `x` is split along axis 0 as numpy.array_split does; rank r gets part r.

        Non-root ranks pass None (anything they pass is ignored). With `counts=` (the rows of
        each part, the same on every rank) rank r gets counts[r] rows, and every rank passes
        `out=`; the call then skips the header the root otherwise sends first.
        """
        x = x if root == self.rank else None  # ignored off the root: kept out of the plan's key
        return self._blocking("scatter", x, out, None, root, _key(counts), algorithm, timeout)

    def reduce_scatter(self, x: Any, op: str = SUM, *, out: Any = None, counts: Any = None,
                       algorithm: str | None = None, timeout: float | None = None) -> Any:
        """`x` is split along axis 0 into size parts; rank r gets part r reduced over all ranks.

        The parts are cut as numpy.array_split does, or with `counts=` (every rank's rows, the
        same list on every rank, adding up to x's rows) rank r gets counts[r] rows, as in MPI's
        Reduce_scatter with recvcounts.
        """
        return self._blocking("reduce_scatter", x, out, op, None, _key(counts), algorithm, timeout)

    def barrier(self, *, algorithm: str | None = None, timeout: float | None = None) -> None:
        """Return only once every rank has entered the barrier."""
        self._blocking("barrier", None, None, None, None, None, algorithm, timeout)

    def alltoall(self, x: Any, *, out: Any = None, algorithm: str | None = None,
                 timeout: float | None = None) -> Any:
        """`x` is cut along axis 0 into size equal blocks (its rows must be a multiple of size);
        block j goes to rank j. Row block i of the result (x's shape and dtype) came from rank i."""
        return self._blocking("alltoall", x, out, None, None, None, algorithm, timeout)

    def alltoallv(self, x: Any, send_counts: Any, recv_counts: Any = None, *, out: Any = None,
                  algorithm: str | None = None, timeout: float | None = None) -> Any:
        """The first send_counts[0] rows of `x` go to rank 0, the next send_counts[1] to rank 1, ...;
        the result holds recv_counts[i] rows from each rank i, in rank order.

        Without `recv_counts` the ranks first exchange their counts (every rank checks them all);
        with them, they must match what each peer sends (a mismatch is a CommunicationError).
        """
        return self._blocking("alltoallv", x, out, None, None, _counts_pair(send_counts, recv_counts), algorithm,
                              timeout)

    def scan(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
             timeout: float | None = None) -> Any:
        """Inclusive prefix reduction: rank r gets `x` of ranks 0..r reduced elementwise, in rank
        order (avg: their mean)."""
        return self._blocking("scan", x, out, op, None, None, algorithm, timeout)

    def exscan(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
               timeout: float | None = None) -> Any:
        """Exclusive prefix reduction: rank r gets `x` of ranks 0..r-1 reduced elementwise. MPI
        leaves rank 0's result undefined; here rank 0 gets None (as mpi4py's lowercase exscan)
        and its out= is left untouched."""
        return self._blocking("exscan", x, out, op, None, None, algorithm, timeout)

    # ---- nonblocking: same arguments, return a request; wait() returns the result ----

    def ibroadcast(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                   timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `broadcast`."""
        return self._start("broadcast", x, out, None, root, None, algorithm, timeout)

    def ireduce(self, x: Any, op: str = SUM, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `reduce`."""
        return self._start("reduce", x, out, op, root, None, algorithm, timeout)

    def iallreduce(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                   timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `allreduce`."""
        return self._start("allreduce", x, out, op, None, None, algorithm, timeout)

    def igather(self, x: Any, root: int = 0, *, out: Any = None, counts: Any = None, algorithm: str | None = None,
                timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `gather`."""
        return self._start("gather", x, out, None, root, counts, algorithm, timeout)

    def iallgather(self, x: Any, *, out: Any = None, counts: Any = None, algorithm: str | None = None,
                   timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `allgather`."""
        return self._start("allgather", x, out, None, None, counts, algorithm, timeout)

    def iscatter(self, x: Any = None, root: int = 0, *, out: Any = None, counts: Any = None,
                 algorithm: str | None = None, timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `scatter`."""
        return self._start("scatter", x, out, None, root, counts, algorithm, timeout)

    def ireduce_scatter(self, x: Any, op: str = SUM, *, out: Any = None, counts: Any = None,
                        algorithm: str | None = None, timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `reduce_scatter`."""
        return self._start("reduce_scatter", x, out, op, None, counts, algorithm, timeout)

    def ibarrier(self, *, algorithm: str | None = None, timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `barrier`: wait() returns once every rank has entered."""
        return self._start("barrier", None, None, None, None, None, algorithm, timeout)

    def ialltoall(self, x: Any, *, out: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `alltoall`."""
        return self._start("alltoall", x, out, None, None, None, algorithm, timeout)

    def ialltoallv(self, x: Any, send_counts: Any, recv_counts: Any = None, *, out: Any = None,
                   algorithm: str | None = None, timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `alltoallv`."""
        return self._start("alltoallv", x, out, None, None, (send_counts, recv_counts), algorithm, timeout)

    def iscan(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
              timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `scan`."""
        return self._start("scan", x, out, op, None, None, algorithm, timeout)

    def iexscan(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                timeout: float | None = None) -> CollectiveRequest:
        """Nonblocking `exscan` (rank 0's wait() returns None)."""
        return self._start("exscan", x, out, op, None, None, algorithm, timeout)

    # ---- persistent (MPI-4): made once, collectively; then start() and wait() per use ----

    def broadcast_init(self, x: Any, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                       timeout: float | None = None) -> PersistentRequest:
        """Persistent `broadcast`: each start() broadcasts root's contents of `x` at that time."""
        return self._persistent("broadcast", x, out, None, root, None, algorithm, timeout)

    def reduce_init(self, x: Any, op: str = SUM, root: int = 0, *, out: Any = None, algorithm: str | None = None,
                    timeout: float | None = None) -> PersistentRequest:
        """Persistent `reduce`."""
        return self._persistent("reduce", x, out, op, root, None, algorithm, timeout)

    def allreduce_init(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                       timeout: float | None = None) -> PersistentRequest:
        """Persistent `allreduce`: `req = comm.allreduce_init(x, out=y)`, then `req.start()` and
        `req.wait()` per use, with new contents in `x` each time."""
        return self._persistent("allreduce", x, out, op, None, None, algorithm, timeout)

    def gather_init(self, x: Any, root: int = 0, *, out: Any = None, counts: Any = None,
                    algorithm: str | None = None, timeout: float | None = None) -> PersistentRequest:
        """Persistent `gather`."""
        return self._persistent("gather", x, out, None, root, counts, algorithm, timeout)

    def allgather_init(self, x: Any, *, out: Any = None, counts: Any = None, algorithm: str | None = None,
                       timeout: float | None = None) -> PersistentRequest:
        """Persistent `allgather`."""
        return self._persistent("allgather", x, out, None, None, counts, algorithm, timeout)

    def scatter_init(self, x: Any = None, root: int = 0, *, out: Any = None, counts: Any = None,
                     algorithm: str | None = None, timeout: float | None = None) -> PersistentRequest:
        """Persistent `scatter`."""
        return self._persistent("scatter", x, out, None, root, counts, algorithm, timeout)

    def reduce_scatter_init(self, x: Any, op: str = SUM, *, out: Any = None, counts: Any = None,
                            algorithm: str | None = None, timeout: float | None = None) -> PersistentRequest:
        """Persistent `reduce_scatter`."""
        return self._persistent("reduce_scatter", x, out, op, None, counts, algorithm, timeout)

    def barrier_init(self, *, algorithm: str | None = None, timeout: float | None = None) -> PersistentRequest:
        """Persistent `barrier`."""
        return self._persistent("barrier", None, None, None, None, None, algorithm, timeout)

    def alltoall_init(self, x: Any, *, out: Any = None, algorithm: str | None = None,
                      timeout: float | None = None) -> PersistentRequest:
        """Persistent `alltoall`."""
        return self._persistent("alltoall", x, out, None, None, None, algorithm, timeout)

    def alltoallv_init(self, x: Any, send_counts: Any, recv_counts: Any = None, *, out: Any = None,
                       algorithm: str | None = None, timeout: float | None = None) -> PersistentRequest:
        """Persistent `alltoallv`: give `recv_counts` to have it planned (without them every
        start() exchanges the counts first)."""
        return self._persistent("alltoallv", x, out, None, None, (send_counts, recv_counts), algorithm, timeout)

    def scan_init(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> PersistentRequest:
        """Persistent `scan`."""
        return self._persistent("scan", x, out, op, None, None, algorithm, timeout)

    def exscan_init(self, x: Any, op: str = SUM, *, out: Any = None, algorithm: str | None = None,
                    timeout: float | None = None) -> PersistentRequest:
        """Persistent `exscan`."""
        return self._persistent("exscan", x, out, op, None, None, algorithm, timeout)


def _foreign(x: Any, out: Any) -> bool:
    """Whether x or out is another library's array (PyTorch, JAX, ...: mpiring.interop, loaded
    only once an argument is neither a NumPy array nor None)."""
    for array in (x, out):
        if array is not None and array.__class__ is not _NDARRAY:
            from mpiring import interop

            if interop.is_foreign(array):
                return True
    return False


def _counts_pair(send_counts: Any, recv_counts: Any) -> tuple[Any, Any]:
    """alltoallv's counts as the one counts= part of a plan's key (see _key)."""
    return _key(send_counts), _key(recv_counts)


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


def _key(counts: Any) -> Any:
    """counts= as part of a plan's key: hashable (a tuple), or left as given when it is not a
    sequence (its check then names it)."""
    try:
        return None if counts is None else tuple(counts)
    except TypeError:
        return counts


def _fits_on_host(backend: Any, x: Any, out: Any) -> bool:
    """Whether a small device call may run on host copies (Backend.run_on_host): x and out (if
    given) are the backend's own arrays, out contiguous so the result lands in it, and x small."""
    return (backend.is_array(x) and x.nbytes <= backend.host_bytes
            and (out is None or (backend.is_array(out) and out.flags.c_contiguous)))


def _on_host(x: Any, out: Any) -> bool:
    return (x is None or x.__class__ is _NDARRAY) and (out is None or out.__class__ is _NDARRAY)


def _plannable(backend: Any, x: Any) -> bool:
    """Whether a call can be recorded as a plan: host arrays, or device arrays on the direct or
    staged path (not IPC: `plannable`), with the (checked) input C-contiguous, since the plan
    reads it in place. That the caller passed arrays, not array-likes, is _caller_arrays' to check."""
    return backend.plannable and (x is None or x.flags.c_contiguous)


@contextlib.contextmanager
def _communicator_made() -> Iterator[None]:
    """Around an MPI call that makes a communicator: MPI's error, most often that every context
    id is in use, becomes CommunicationError."""
    try:
        yield
    except MPI.Exception as error:
        waiting = f"; {leaving()} freed here still wait for a peer's free()" if leaving() else ""
        raise CommunicationError(
            "Communicator", f"MPI could not make a communicator ({_last_line(error.Get_error_string())}{waiting}); "
            "if the program makes many, free() each one it no longer needs on every rank, or use "
            "`with mpiring.Communicator() as comm:`",
        ) from error


def _last_line(text: str) -> str:
    """The most specific part of an MPI error stack (MPICH puts it last, after the call chain)."""
    line = text.strip().splitlines()[-1]
    return line.split(": ", 1)[-1].strip() if ": " in line else line
