"""The one harness every collective shares: sizes, buffers, timing, checking, aggregation.

For each size, on every rank:
1. buffers are made once (inputs hold small integers, so every reduction order gives the same
   bits and mpiring's result can be compared with MPI's exactly);
2. two calls of mpiring's collective per buffer set, which build the plans the ceiling replays;
3. a check: one run of mpiring's collective (in the form timed) and the native one into
   sentinel-filled results; `#wrong` counts the elements of mpiring's result that differ from
   the native result, summed over ranks. The native result is always the row's `native` call
   (out of place but for broadcast): the in-place form puts each rank's input in place first,
   which its timed calls do not;
4. mpiring's collective, the native one and the ceiling timed by `mpiring.bench.timing`, the
   method and statistic every mpiring tool shares: `--warmup` untimed calls of each, then `--reps`
   rounds in which each of the three times one batch after a barrier (so a disturbance from
   outside hits all three alike), of `--iters` calls or as many more as last `--min-batch-ms`
   (found by one batch first, the same count on every rank); each rank keeps its median batch, and the
   report gives the mean over ranks (avg, as OSU and nccl-tests do) and the min and max over
   ranks. Bandwidths use the avg.
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy
from mpi4py import MPI

from mpiring.bench import timing
from mpiring.bench.device import Device
from mpiring.bench.options import Options
from mpiring.bench.table import DROP_IN_FORMS, Buffers, CeilingStep, Collective, Setup
from mpiring.engine.requests import MessagesOnly
from mpiring.ops import AVG, PROD

# Fills for result buffers before the check: outside every value the inputs can produce, and
# different, so an element that either side failed to write shows up as wrong.
OURS_SENTINEL, NATIVE_SENTINEL = 113, 127
# Reduction inputs stay tiny so sums over 8+ ranks stay exact even in float16 and int8.
_SUM_RANGE = 4
# Data movers get rank-dependent values, so a block delivered to the wrong place shows up.
_MOVE_RANGE = 97


@dataclass
class Result:
    """One row of the report; field order is the CSV/JSON column order."""

    collective: str
    algorithm: str
    form: str  # how mpiring was called (table.FORMS)
    ranks: int
    device: str
    dtype: str
    op: str | None
    root: int | None
    size_bytes: int
    count: int
    bus_factor: float
    time_us: float
    time_min_us: float
    time_max_us: float
    algbw_gbs: float
    busbw_gbs: float
    native_time_us: float
    native_time_min_us: float
    native_time_max_us: float
    native_algbw_gbs: float
    native_busbw_gbs: float
    ratio: float  # native time / mpiring time: > 1 means mpiring is faster
    ceiling_time_us: float
    ceiling_busbw_gbs: float
    efficiency_pct: float | None  # ceiling time / mpiring time; None with one rank (no messages)
    wrong: int


def sweep(row: Collective, options: Options, world_size: int) -> list[tuple[int, int]]:
    """The (count, S bytes) pairs to run: S from min, multiplied by the factor, and always max.

    S is rounded down to whole elements (per rank where S counts every rank's block), with at
    least one element when S > 0; sizes that round to the same count run once.
    """
    if row.input_elems(1, world_size, True) is None and row.output_elems(1, world_size, True) is None:
        return [(0, 0)]  # moves no data (barrier): one row
    unit = options.dtype.itemsize * (world_size if row.per_rank else 1)
    sizes: list[int] = []
    size = options.min_bytes
    while size < options.max_bytes:
        sizes.append(size)
        size = max(size + 1, int(size * options.factor))
    sizes.append(options.max_bytes)  # the end size, even where the factor steps past it
    counts: list[int] = []
    for size in sizes:
        count = max(1, size // unit) if size else 0
        if count not in counts:
            counts.append(count)
    return [(count, count * unit) for count in counts]


def bandwidths(nbytes: int, seconds: float, factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s), nccl-tests' definitions."""
    algbw = nbytes / seconds / 1e9 if nbytes and seconds > 0 else 0.0
    return algbw, algbw * factor


def input_values(elems: int, rank: int, dtype: numpy.dtype, op: str, reduces: bool) -> numpy.ndarray:
    """Deterministic rank-dependent inputs whose reductions are exact in any order."""
    i = numpy.arange(elems, dtype=numpy.int64)
    if not reduces:
        values = (i + 7 * rank) % _MOVE_RANGE
    elif op == PROD:
        values = 1 + (i + rank) % 2  # products are powers of two: exact, or wrap alike in ints
    else:
        values = (i + 3 * rank) % _SUM_RANGE
    return values.astype(dtype)


def make_buffers(row: Collective, setup: Setup, device: Device, count: int, dtype: numpy.dtype) -> Buffers:
    at_root = setup.rank == setup.root
    n_in = row.input_elems(count, setup.size, at_root)
    n_out = row.output_elems(count, setup.size, at_root)
    host = None if n_in is None else input_values(n_in, setup.rank, dtype, setup.op, row.reduces)
    x = None if host is None else device.put(device.xp, host)
    if row.in_place:
        native = device.put(device.native_xp, host)
        return Buffers(x=x, ours=x, native_x=native, native=native, counts=(count,) * setup.size)
    native_x = x if device.native_xp is device.xp or host is None else device.put(device.native_xp, host)
    return Buffers(
        x=x,
        ours=None if n_out is None else device.empty(device.xp, n_out, dtype),
        native_x=native_x,
        native=None if n_out is None else device.empty(device.native_xp, n_out, dtype),
        counts=(count,) * setup.size,
    )


def rotating(bind: Callable[[Setup, Any], Callable[[], Any]], setup: Setup, sets: list[Any]) -> Callable[[], Any]:
    """The call `bind` makes for each of `sets`, the next one each time (--rotate; one set: always
    that call itself, so a timed call costs only what it does)."""
    calls = [bind(setup, b) for b in sets]
    if len(calls) == 1:
        return calls[0]
    turn = itertools.cycle(calls)
    return lambda: next(turn)()


def bound(run: Callable[[Setup, Any], Any]) -> Callable[[Setup, Any], Callable[[], Any]]:
    """`run(setup, buffers)` as a binding: the call on those, made once."""
    return lambda s, b: partial(run, s, b)


def ceiling(row: Collective, setup: Setup, buffers: Buffers, device: Device, p2p: MPI.Intracomm, count: int,
            itemsize: int) -> Callable[[], None]:
    """The ceiling: the messages of mpiring's plan for this call, replayed without its arithmetic
    (mpiring.engine.requests.MessagesOnly). Calls that are not planned (device buffers) replay
    the ring algorithm's schedule with bare point-to-point calls instead."""
    x = buffers.x if row.name != "scatter" or setup.rank == setup.root else None
    counts = {"gather": buffers.counts, "allgather": buffers.counts, "scatter": buffers.counts,
              "alltoallv": (buffers.counts, buffers.counts)}.get(row.name)  # as table.py's calls pass them
    recorded = setup.comm.plan_of(row.name, x, buffers.ours, op=setup.op, root=setup.root, counts=counts,
                                  algorithm=setup.algorithm)
    # every rank replays the same kind of ceiling: a call may be recorded on some ranks and not on
    # others (a node-aware call whose pipelined phase runs on some ranks only), and the two kinds'
    # messages do not match
    if p2p.allreduce(recorded is not None, op=MPI.LAND):
        return MessagesOnly(recorded, x, buffers.ours)
    steps = row.ceiling(setup.size, setup.rank, setup.root, count, itemsize)
    return ceiling_runner(p2p, steps, itemsize, device.native_xp)


def ceiling_runner(
    p2p: MPI.Intracomm, steps: list[CeilingStep], itemsize: int, xp: Any
) -> Callable[[], None]:
    """A call that replays a ring schedule with bare point-to-point calls on fixed buffers.

    Every call and buffer view is built here, once, so the timed loop does nothing but MPI.
    """
    size, rank = p2p.Get_size(), p2p.Get_rank()
    right, left = (rank + 1) % size, (rank - 1) % size
    send_buf = xp.empty(max([s or 0 for s, _ in steps], default=0) * itemsize, numpy.uint8)
    recv_buf = xp.empty(max([r or 0 for _, r in steps], default=0) * itemsize, numpy.uint8)
    calls = []
    for send, receive in steps:
        out = None if send is None else [send_buf[: send * itemsize], MPI.BYTE]
        into = None if receive is None else [recv_buf[: receive * itemsize], MPI.BYTE]
        if out is not None and into is not None:
            calls.append(partial(p2p.Sendrecv, out, right, 0, into, left, 0))
        elif out is not None:
            calls.append(partial(p2p.Send, out, right, 0))
        else:
            calls.append(partial(p2p.Recv, into, left, 0))

    def replay() -> None:
        for call in calls:
            call()

    return replay


def form_calls(row: Collective, device: Device, form: str) -> tuple[Callable, Callable, Callable]:
    """(mpiring's call, the native call a mpi4py user would write for the same job), each as a
    binding, (setup, buffers) -> the call on them; and mpiring's call returning its result for the
    check, taking (setup, buffers); for one form (table.FORMS).

    A binding makes once what its form derives from (setup, buffers): dataclass copies, mmaps,
    microseconds each that would be charged to the call. So a timed call does only what its form
    does each time: the call, and the arrays that form makes anew. The check's call puts the input
    where the form's own buffers need it first (the timed calls leave them as they are)."""
    xp = device.native_xp
    kept: dict[tuple[str, int, int], Any] = {}

    def derived(what: str, s: Setup, b: Buffers, make: Callable) -> Any:
        """What `make(s, b)` derives, made once: a binding and the check share it."""
        key = (what, id(s), id(b))
        if key not in kept:
            kept[key] = make(s, b)
        return kept[key]

    def new_output(s: Setup, b: Buffers, into: Buffers) -> Buffers:
        """A new native output; an in-place collective's root (broadcast) fills it with its input
        first, as mpiring's root returns a new array holding its x."""
        if b.native is not None:
            into.native = b.native.copy() if row.in_place and s.rank == s.root else xp.empty_like(b.native)
        return into

    def plain_native(s: Setup, b: Buffers) -> Callable[[], Any]:
        into = replace(b)
        return lambda: row.native(s, new_output(s, b, into))

    def fresh(s: Setup, b: Buffers) -> Callable[[], Any]:
        into = replace(b)

        def call() -> Any:
            into.x = None if b.x is None else b.x.copy()
            into.ours = into.x if row.in_place and b.x is b.ours else b.ours
            return row.plain(s, into)
        return call

    def fresh_native(s: Setup, b: Buffers) -> Callable[[], Any]:
        into = replace(b)

        def call() -> Any:
            into.native_x = None if b.native_x is None else b.native_x.copy()
            return row.native(s, new_output(s, b, into))
        return call

    def drop_in_arguments(s: Setup, b: Buffers) -> tuple:  # mpi4py's call, on mpiring's Communicator
        return derived("dropin", s, b, lambda s, b: (replace(s, mpi=s.comm), replace(b, native_x=b.x, native=b.ours)))

    def on_the_drop_in(s: Setup, b: Buffers) -> Callable[[], Any]:
        return partial(row.native, *drop_in_arguments(s, b))

    def into_ours(call: Callable) -> Callable:
        return lambda s, b: (call(s, b), b.ours)[1]

    def mapped(s: Setup, b: Buffers) -> tuple:
        """The dropin-mmap form's messages, [mmap, count, type] (the row's `message`): each array
        of the set copied into an anonymous mmap of its own, as mpi4py's OSU demos allocate (an
        array that mpiring and MPI share, the host input, shares its mmap too). Returns the
        arguments of mpiring's call and of MPI's, and {id(array): (its mmap, an array over it)}."""
        twins: dict[int, tuple[mmap.mmap, numpy.ndarray]] = {}

        def message(a: Any) -> list | None:
            if a is None:
                return None
            if id(a) not in twins:
                memory = mmap.mmap(-1, max(a.nbytes, 1))
                twin = numpy.frombuffer(memory, a.dtype, a.size)
                twin[...] = a
                twins[id(a)] = (memory, twin)
            return row.message(s, twins[id(a)][0], a.itemsize, b.counts)

        return ((replace(s, mpi=s.comm), replace(b, native_x=message(b.x), native=message(b.ours))),
                (s, replace(b, native_x=message(b.native_x), native=message(b.native))), twins)

    def mmap_result(s: Setup, b: Buffers) -> Any:
        mine, _, twins = derived("dropin-mmap", s, b, mapped)
        for a in (b.x, b.ours):  # the input, and the result's sentinels
            if a is not None:
                twins[id(a)][1][...] = a
        row.native(*mine)
        return None if b.ours is None else twins[id(b.ours)][1]

    in_place = row.native_in_place

    def in_place_buffers(s: Setup, b: Buffers) -> tuple:
        """The dropin-inplace form's buffers: a receive buffer of each side's own (InPlace.elems)
        with the input staged in it. Returns the arguments of mpiring's call and of MPI's."""
        elems = in_place.elems(b.counts[s.rank], s.size, s.rank == s.root)
        dtype = (b.x if b.x is not None else b.ours).dtype

        def receive(module: Any, x: Any) -> Any:
            if elems is None:
                return None
            buf = device.empty(module, elems, dtype)
            in_place.stage(s, x, buf)
            return buf

        return ((replace(s, mpi=s.comm), replace(b, native_x=b.x, native=receive(device.xp, b.x))),
                (s, replace(b, native=receive(device.native_xp, b.native_x))))

    def in_place_result(s: Setup, b: Buffers) -> Any:
        mine = derived("dropin-inplace", s, b, in_place_buffers)[0]
        receive = mine[1].native
        if receive is not None:
            receive.fill(OURS_SENTINEL)  # what neither the staging nor the call writes shows up
        result = in_place.stage(s, b.x, receive)  # the input, where the timed calls left results
        in_place.call(*mine)
        return result

    if form == "plain":
        return bound(row.plain), plain_native, row.plain
    if form == "fresh":
        return fresh, fresh_native, lambda s, b: fresh(s, b)()
    if form == "dropin" or (form == "dropin-inplace" and in_place is None):
        return on_the_drop_in, bound(row.native), into_ours(lambda s, b: row.native(*drop_in_arguments(s, b)))
    if form == "dropin-mmap":
        return (lambda s, b: partial(row.native, *derived("dropin-mmap", s, b, mapped)[0]),
                lambda s, b: partial(row.native, *derived("dropin-mmap", s, b, mapped)[1]), mmap_result)
    if form == "dropin-inplace":
        return (lambda s, b: partial(in_place.call, *derived("dropin-inplace", s, b, in_place_buffers)[0]),
                lambda s, b: partial(in_place.call, *derived("dropin-inplace", s, b, in_place_buffers)[1]),
                in_place_result)
    return bound(row.ours), bound(row.native), into_ours(row.ours)


def count_wrong(row: Collective, setup: Setup, buffers: Buffers, device: Device, result_of: Callable,
                averages: bool = True) -> int:
    """Elements of mpiring's result on this rank (`result_of(setup, buffers)`, the form's call)
    that differ from the native result (the row's `native` call, never in place).

    `averages`: whether mpiring's call averages for --op avg (the lowercase calls); the drop-in
    forms pass MPI.SUM, as the native side does.

    Collective: every rank runs both calls, also those that get no result (gather off the root).
    """
    has_result = buffers.ours is not None
    if has_result and (not row.in_place or setup.rank != setup.root):  # in place, root's is input
        buffers.ours.fill(OURS_SENTINEL)
        buffers.native.fill(NATIVE_SENTINEL)
    device.synchronize()
    ours = result_of(setup, buffers)
    row.native(setup, buffers)
    device.synchronize()
    if not has_result or not row.averaged_over(setup.rank, setup.size):  # exscan's rank 0: undefined
        return 0
    ours, native = device.to_host(ours), device.to_host(buffers.native).copy()
    if averages and row.reduces and setup.op == AVG:  # the native side summed; divide as mpiring's avg does
        numpy.true_divide(native, row.averaged_over(setup.rank, setup.size), out=native)
    return int(numpy.count_nonzero(ours.reshape(native.shape) != native))


def measure(
    row: Collective, setup: Setup, device: Device, p2p: MPI.Intracomm, count: int, nbytes: int,
    options: Options, algorithm_label: str,
) -> list[Result]:
    """Run one size of one collective in each form asked for (collective over all ranks); every
    rank gets the Results."""
    sets = [make_buffers(row, setup, device, count, options.dtype) for _ in range(options.rotate)]
    buffers = sets[0]  # the one the check uses
    ours = rotating(bound(row.ours), setup, sets)
    for _ in range(2 * len(sets)):  # a layout's second call records the schedule the ceiling replays
        ours()
    ceilings = [ceiling(row, setup, b, device, p2p, count, options.dtype.itemsize) for b in sets]
    bare = rotating(lambda _setup, replay: replay, setup, ceilings)
    try:
        results = []
        for form in options.forms:
            mine, theirs, result_of = form_calls(row, device, form)
            calls = (rotating(mine, setup, sets), rotating(theirs, setup, sets), bare)
            results.append(_timed(row, setup, device, calls, buffers, nbytes, count, options, algorithm_label,
                                  form, result_of))
        return results
    finally:
        for replay in ceilings:
            if isinstance(replay, MessagesOnly):
                replay.release()  # unpinned: its schedule may be evicted again


def _timed(row: Collective, setup: Setup, device: Device, calls: tuple, buffers: Buffers, nbytes: int,
           count: int, options: Options, algorithm_label: str, form: str, result_of: Callable) -> Result:
    """Check, then warm up and time the three calls of one size; every rank gets the Result."""
    world = setup.mpi
    wrong = count_wrong(row, setup, buffers, device, result_of, averages=form not in DROP_IN_FORMS)
    mine, theirs, bare = timing.time_calls(  # mpiring's, native MPI's, the ceiling's
        world, calls, iters=options.iters, reps=options.reps, warmup=options.warmup, sync=device.synchronize,
        min_batch=options.min_batch)
    wrong = world.allreduce(wrong, MPI.SUM)
    factor = row.bus_factor(setup.size)
    ours_bw, native_bw, ceiling_bw = (bandwidths(nbytes, t.avg, factor) for t in (mine, theirs, bare))
    us = 1e6
    return Result(
        collective=row.name, algorithm=algorithm_label, form=form, ranks=setup.size, device=device.name,
        dtype=options.dtype.name, op=setup.op if row.reduces else None,
        root=setup.root if row.rooted else None, size_bytes=nbytes, count=count, bus_factor=factor,
        time_us=mine.avg * us, time_min_us=mine.min * us, time_max_us=mine.max * us,
        algbw_gbs=ours_bw[0], busbw_gbs=ours_bw[1],
        native_time_us=theirs.avg * us, native_time_min_us=theirs.min * us, native_time_max_us=theirs.max * us,
        native_algbw_gbs=native_bw[0], native_busbw_gbs=native_bw[1],
        ratio=theirs.avg / mine.avg, ceiling_time_us=bare.avg * us, ceiling_busbw_gbs=ceiling_bw[1],
        efficiency_pct=100 * bare.avg / mine.avg if setup.size > 1 else None, wrong=wrong,
    )
