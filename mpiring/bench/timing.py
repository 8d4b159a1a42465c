"""How mpiring's tools time a call: one method and one statistic, shared by the benchmark
(`mpiring.bench`), the GPU check (`mpiring.gpu.check`) and the measurement scripts
(scripts/measure_reliability_costs.py, measure_call_cost.py, measure_timed_waits.py).

The contenders are zero-argument callables: an mpiring call, the native MPI call, a ceiling's
replay, a device copy. Every rank of `comm` (the communicator given, explicitly: it is the one
barriered on and reduced over) times the same contenders in the same order:

1. warm-up: `warmup` untimed calls of each contender;
2. `reps` rounds; in each round every contender in turn times one batch, so a disturbance from
   other work on the machine (these machines are shared) hits all of them alike:

       round 1:  A A A A | B B B B | C C C C       (a batch: `iters` calls of one contender)
       round 2:  A A A A | B B B B | C C C C
       ...

3. a batch: `sync()` (device work queued before it is done), `comm.Barrier()`, one clock
   reading (MPI.Wtime), `iters` calls, `sync()`, a second reading; its time per call is
   (second - first) / iters;
4. per rank: the median of its `reps` batch times (one disturbed batch does not move it, and a
   lucky one does not flatter it, as a minimum would);
5. over ranks: the mean of the ranks' medians (`avg`, what OSU and nccl-tests report), and their
   minimum and maximum. Bandwidths and ratios are computed from `avg`.

`describe()` says this in one line; every tool prints it beside its numbers.
"""

from __future__ import annotations

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


def describe(iters: int, reps: int, warmup: int) -> str:
    """The statistic in one line, for reports (the benchmark's JSON `meta.statistic`)."""
    return (f"time per iteration: each rank's median of {reps} batches of {iters} iterations "
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


def rank_medians(comm: MPI.Comm, calls: Sequence[Call], iters: int, reps: int, sync: Call = no_sync,
                 clock: Clock = MPI.Wtime) -> list[float]:
    """This rank's median batch (seconds per call) of each contender, over `reps` interleaved rounds."""
    batches: list[list[float]] = [[] for _ in calls]
    for _ in range(reps):
        for call, times in zip(calls, batches, strict=True):
            times.append(batch(comm, call, iters, sync, clock))
    return [statistics.median(times) for times in batches]


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
               sync: Call = no_sync, clock: Clock = MPI.Wtime) -> list[Timing]:
    """Warm up and time `calls` as the module docstring says; one Timing per call, in order.

    Collective over `comm`: every rank passes the same number of contenders, in the same order,
    and the same counts. `sync` waits for queued device work (e.g. a CuPy stream's synchronize).
    """
    if iters < 1 or reps < 1 or warmup < 0:
        raise ValueError(f"timing needs iters >= 1, reps >= 1 and warmup >= 0; got iters={iters}, "
                         f"reps={reps}, warmup={warmup}")
    warm_up(calls, warmup)
    return over_ranks(comm, rank_medians(comm, calls, iters, reps, sync, clock))
