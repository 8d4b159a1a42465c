#!/usr/bin/env python3
"""What a timeout costs a small planned call: the same 8-byte all-reduce and barrier on a
Communicator with the default 10-minute timeout (timed waits: Testall, then Ring.poll) and on
one with `timeout=math.inf` (one MPI_Waitall per step), native MPI beside them, interleaved in
rounds; each round's time is the slowest rank's, the table gives the median round.

    mpirun -n 2 python scripts/measure_timed_waits.py      # also -n 4 (oversubscribed on 2 cores)
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpiring


def main() -> None:
    world = MPI.COMM_WORLD
    timed, unlimited = mpiring.Communicator(), mpiring.Communicator(timeout=math.inf)
    x, y = np.ones(2), np.empty(2)
    variants = {
        "native Allreduce": lambda: world.Allreduce(x, y),
        "allreduce, default timeout": lambda: timed.allreduce(x, out=y),
        "allreduce, no timeout": lambda: unlimited.allreduce(x, out=y),
        "native Barrier": world.Barrier,
        "barrier, default timeout": timed.barrier,
        "barrier, no timeout": unlimited.barrier,
    }
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(9):
        for name, call in variants.items():
            for _ in range(20):
                call()
            world.Barrier()
            start = time.perf_counter()
            for _ in range(300):
                call()
            rounds[name].append(world.allreduce((time.perf_counter() - start) / 300 * 1e6, op=MPI.MAX))
    if world.rank == 0:
        print(f"{world.size} ranks, median of 9 rounds of 300 calls")
        for name, times in rounds.items():
            print(f"{name:28s} {statistics.median(times):7.1f} us")


if __name__ == "__main__":
    main()
