#!/usr/bin/env python3
"""What a timeout costs a small planned call: the same 8-byte all-reduce and barrier on a
Communicator with the default 10-minute timeout (timed waits: Testall, then mpiring.engine.waiting.poll) and on
one with `timeout=math.inf` (one MPI_Waitall per step), native MPI beside them, timed by
mpiring.bench.timing (the benchmark's method and statistic: the variants take turns batch by
batch, each rank keeps its median batch, the table gives the mean over ranks).

    mpirun -n 2 python scripts/measure_timed_waits.py      # also -n 4 (oversubscribed on 2 cores)
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from mpi4py import MPI

import mpiring
from mpiring.bench import timing

WARMUP = 20  # untimed calls of each variant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9, help="timed batches of each variant (default 9)")
    parser.add_argument("--calls", type=int, default=300, help="calls per batch (default 300)")
    args = parser.parse_args()
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
    timings = timing.time_calls(world, list(variants.values()), iters=args.calls, reps=args.rounds, warmup=WARMUP)
    if world.rank == 0:
        print(f"{world.size} ranks; {timing.describe(args.calls, args.rounds, WARMUP)}")
        for name, t in zip(variants, timings, strict=True):
            print(f"{name:28s} {t.avg * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
