#!/usr/bin/env python3
"""What the reliability features cost: MPIRING_CHECK's latency, and the CPU a rank burns while
it waits for a late peer with and without a timeout.

    mpirun -n 2 python scripts/measure_reliability_costs.py      # also -n 4; --bytes 8 4096

Prints, from rank 0: the per-call latency of mpiring without and with the check, and of mpi4py's
native Allreduce for scale; the cost of creating a communicator; then the CPU seconds per second
of waiting of the ranks that wait --late seconds for rank 0 (MPI_Waitall without a timeout,
mpiring's backing-off poll with one). Latencies are timed by mpiring.bench.timing, the
benchmark's method and statistic: the variants take turns batch by batch, each rank keeps its
median batch, and the mean over ranks is printed. docs/reliability.md holds the last result.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpiring
from mpiring.bench import timing

WORLD = MPI.COMM_WORLD
CREATIONS = 10  # communicators made and freed per timed batch


def warmup_calls(iterations: int) -> int:
    return max(iterations // 10, 10)


def measure(calls: list, iterations: int, repeats: int) -> list[float]:
    """Seconds per call of each of `calls` (mpiring.bench.timing's mean over ranks of each rank's
    median batch); the calls take turns batch by batch, so they see the same load."""
    timings = timing.time_calls(WORLD, calls, iters=iterations, reps=repeats, warmup=warmup_calls(iterations))
    return [t.avg for t in timings]


def waiting_cpu(comm: mpiring.Communicator, late: float, timeout: float | None) -> float:
    """CPU seconds per wall second the other ranks spend waiting while rank 0 arrives `late` s late."""
    WORLD.Barrier()
    if WORLD.Get_rank() == 0:
        time.sleep(late)
    cpu, wall = time.process_time(), time.perf_counter()
    comm.allreduce(np.ones(1), timeout=timeout)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    shares = WORLD.gather(cpu / wall if WORLD.Get_rank() else None)
    return statistics.mean(shares[1:]) if WORLD.Get_rank() == 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, nargs="+", default=[8])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--late", type=float, default=2.0, help="seconds rank 0 arrives late (CPU while waiting)")
    args = parser.parse_args()
    plain, checked = mpiring.Communicator(check=False), mpiring.Communicator(check=True)
    rows = []
    for nbytes in args.bytes:
        x = np.ones(max(nbytes // 8, 1))
        out = np.empty_like(x)
        native, off, on = measure([lambda x=x, out=out: WORLD.Allreduce(x, out), lambda x=x: plain.allreduce(x),
                                   lambda x=x: checked.allreduce(x)], args.iterations, args.repeats)
        rows.append((nbytes, native, off, on))
    # Creating a communicator: Dup, plus the check agreement (one exchange) in both modes.
    create, dup = measure([lambda: mpiring.Communicator(check=False).free(), lambda: WORLD.Dup().Free()],
                          CREATIONS, args.repeats)
    spinning = waiting_cpu(plain, args.late, math.inf)  # no timeout: one MPI_Waitall (None is the 10-min default)
    polling = waiting_cpu(plain, args.late, 3600.0)
    if WORLD.Get_rank() == 0:
        print(MPI.Get_library_version().splitlines()[0].strip())
        statistic = timing.describe(args.iterations, args.repeats, warmup_calls(args.iterations))
        print(f"{WORLD.Get_size()} ranks; {statistic} (communicators: batches of {CREATIONS})")
        print("| bytes | native Allreduce | mpiring, check off | mpiring, MPIRING_CHECK=1 | check adds |")
        print("| --- | --- | --- | --- | --- |")
        for nbytes, native, off, on in rows:
            print(f"| {nbytes} | {native * 1e6:.1f} us | {off * 1e6:.1f} us | {on * 1e6:.1f} us | "
                  f"{(on - off) * 1e6:+.1f} us ({on / off:.2f}x) |")
        print(f"Communicator() + free(): {create * 1e6:.0f} us; MPI Dup + Free alone: {dup * 1e6:.0f} us")
        print(f"waiting {args.late:g} s for a late rank: {spinning:.2f} CPU s per s without a timeout (MPI_Waitall), "
              f"{polling:.2f} with one (backing-off poll)")


if __name__ == "__main__":
    main()
