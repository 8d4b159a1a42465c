#!/usr/bin/env python3
"""What survival (Communicator(survive=True), docs/lost-rank.md) costs a small call when no rank
is lost: recorded all-reduces of float32 into out=, 8 B to 4 KiB, on communicators with survival
off (the default timeout, and timeout=math.inf, which waits in one MPI_Waitall) and on, timed by
mpiring.bench.timing in interleaved rounds (a disturbance from outside hits all alike; the table
gives the mean over ranks of each rank's median batch).

    mpiexec -n 2 python scripts/measure_survival_cost.py [--calls 2000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from mpi4py import MPI

import mpiring
from mpiring.bench import timing

WARMUP = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per batch")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (batches per variant)")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    communicators = {"off": mpiring.Communicator(), "off, timeout=inf": mpiring.Communicator(timeout=math.inf),
                     "survive=True": mpiring.Communicator(survive=True)}
    rows = []
    for nbytes in (8, 64, 512, 4096):
        x = np.ones(nbytes // 4, np.float32)
        out = np.empty_like(x)
        calls = [lambda comm=comm, x=x, out=out: comm.allreduce(x, out=out) for comm in communicators.values()]
        timings = timing.time_calls(world, calls, iters=args.calls, reps=args.rounds, warmup=WARMUP)
        rows.append((nbytes, [t.avg * 1e6 for t in timings]))
    if world.Get_rank() == 0:
        print(f"{world.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0]}, mpiring {mpiring.__version__}; "
              f"{timing.describe(args.calls, args.rounds, WARMUP)}")
        print("| bytes | " + " | ".join(f"{name} (us)" for name in communicators) + " | survive / off |")
        print("| --- |" + " --- |" * (len(communicators) + 1))
        for nbytes, micros in rows:
            print(f"| {nbytes} | " + " | ".join(f"{m:.2f}" for m in micros) + f" | {micros[2] / micros[0]:.3f} |")
    for comm in communicators.values():
        comm.free()


if __name__ == "__main__":
    main()
