"""How mpiring's tools time a call: one method and one statistic, shared by the benchmark
(`mpiring.bench`), the GPU check (`mpiring.gpu.check`) and the measurement scripts
(scripts/measure_reliability_costs.py, measure_call_cost.py, measure_timed_waits.py).

The contenders are zero-argument callables: an mpiring call, the native MPI call, a ceiling's
replay, a device copy. Every rank of `comm` (the communicator given, explicitly: it is the one
barriered on and reduced over) times the same contenders in the same order:

1. warm-up: `warmup` untimed calls of each contender; then, with `min_batch` (seconds), a batch
   of each (below) that sets its batch size: `iters` calls, or as many more as fill `min_batch`
   on the slowest rank, the same count on every rank. A batch of a few short calls would time the
   barrier before it (ranks leave it microseconds apart) as much as the calls;
2. `reps` rounds; in each round every contender in turn times one batch, so a disturbance from
   other work on the machine (these machines are shared) hits all of them alike:

       round 1:  A A A A | B B B B | C C C C       (a batch: its count of calls of one contender)
       round 2:  A A A A | B B B B | C C C C
       ...

3. a batch: `sync()` (device work queued before it is done), `comm.Barrier()`, one clock
   reading (MPI.Wtime), its calls, `sync()`, a second reading; its time per call is
   (second - first) / calls;
4. per rank: the median of its `reps` batch times (one disturbed batch does not move it, and a
   lucky one does not flatter it, as a minimum would);
5. over ranks: the mean of the ranks' medians (`avg`, what OSU and nccl-tests report), and their
   minimum and maximum. Bandwidths and ratios are computed from `avg`.

`describe()` says this in one line; every tool prints it beside its numbers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy
from mpi4py import MPI

Call = Callable[[], object]
Clock = Callable[[], float]


def no_sync() -> None:
    """The `sync` of host-only contenders: nothing is queued anywhere."""


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one contender: the mean over ranks of each rank's median batch, and
    the minimum and maximum of those medians over ranks."""

    avg: float
    min: float
    max: float


# the most calls a batch takes to fill `min_batch` (a call that costs nothing cannot fill it)
MAX_BATCH_CALLS = 100_000


def describe(iters: int, reps: int, warmup: int, min_batch: float = 0.0) -> str:
    """The statistic in one line, for reports (the benchmark's JSON `meta.statistic`)."""
    size = f"{iters} iterations" if min_batch <= 0 else f"at least {iters} iterations and {min_batch * 1e3:g} ms"
    return (f"time per iteration: each rank's median of {reps} batches of {size} "
            f"(after {warmup} warm-up), then mean/min/max over ranks")


def warm_up(calls: Sequence[Call], times: int) -> None:
    """`times` untimed calls of each contender."""
    for call in calls:
        for _ in range(times):
            call()


def batch(comm: MPI.Comm, call: Call, iters: int, sync: Call = no_sync, clock: Clock = MPI.Wtime) -> float:
    """Seconds per call of `iters` back-to-back calls, started together after a barrier on `comm`."""
    sync()
    comm.Barrier()
    start = clock()
    for _ in range(iters):
        call()
    sync()  # a device call has only been queued: the clock must see it done
    return (clock() - start) / iters


def rank_medians(comm: MPI.Comm, calls: Sequence[Call], iters: int | Sequence[int], reps: int, sync: Call = no_sync,
                 clock: Clock = MPI.Wtime) -> list[float]:
    """This rank's median batch (seconds per call) of each contender, over `reps` interleaved
    rounds; `iters`: the calls of every batch, or of each contender's."""
    counts = [iters] * len(calls) if isinstance(iters, int) else list(iters)
    batches: list[list[float]] = [[] for _ in calls]
    for _ in range(reps):
        for call, count, times in zip(calls, counts, batches, strict=True):
            times.append(batch(comm, call, count, sync, clock))
    return [statistics.median(times) for times in batches]


def batch_counts(comm: MPI.Comm, calls: Sequence[Call], iters: int, min_batch: float, sync: Call = no_sync,
                 clock: Clock = MPI.Wtime) -> list[int]:
    """Each contender's calls per batch: `iters`, or as many as fill `min_batch` seconds on the
    slowest rank by one batch of `iters` (at most MAX_BATCH_CALLS); the same on every rank."""
    seconds = numpy.array([batch(comm, call, iters, sync, clock) for call in calls], dtype=numpy.float64)
    slowest = numpy.empty_like(seconds)
    comm.Allreduce(seconds, slowest, MPI.MAX)
    return [max(iters, min(MAX_BATCH_CALLS, math.ceil(min_batch / t) if t > 0 else MAX_BATCH_CALLS))
            for t in slowest.tolist()]


def over_ranks(comm: MPI.Comm, seconds: Sequence[float]) -> list[Timing]:
    """Each contender's Timing from every rank's `seconds` (collective over `comm`)."""
    mine = numpy.array(seconds, dtype=numpy.float64)
    low, high, total = (numpy.empty_like(mine) for _ in range(3))
    comm.Allreduce(mine, low, MPI.MIN)
    comm.Allreduce(mine, high, MPI.MAX)
    comm.Allreduce(mine, total, MPI.SUM)
    avg = total / comm.Get_size()
    return [Timing(float(a), float(lo), float(hi)) for a, lo, hi in zip(avg, low, high, strict=True)]


def time_calls(comm: MPI.Comm, calls: Sequence[Call], *, iters: int, reps: int, warmup: int = 0,
               sync: Call = no_sync, clock: Clock = MPI.Wtime, min_batch: float = 0.0) -> list[Timing]:
    """Warm up and time `calls` as the module docstring says; one Timing per call, in order.

    Collective over `comm`: every rank passes the same number of contenders, in the same order,
    and the same counts. `sync` waits for queued device work (e.g. a CuPy stream's synchronize);
    `min_batch`: seconds a batch lasts at least (0: `iters` calls each).
    """
    if iters < 1 or reps < 1 or warmup < 0 or min_batch < 0:
        raise ValueError(f"timing needs iters >= 1, reps >= 1, warmup >= 0 and min_batch >= 0; got iters={iters}, "
                         f"reps={reps}, warmup={warmup}, min_batch={min_batch}")
    warm_up(calls, warmup)
    counts = batch_counts(comm, calls, iters, min_batch, sync, clock) if min_batch > 0 else iters
    return over_ranks(comm, rank_medians(comm, calls, counts, reps, sync, clock))
