#!/usr/bin/env python3
"""Scan's two algorithms, isolated and back to back (docs/algorithms.md, the scan row of "Choosing").

    mpirun -n 4 python scripts/measure_scan_latency.py [--bytes 8] [--calls 200] [--rounds 5]

Isolated: two native barriers before every call, each rank's median call time, the maximum over
ranks. Back to back: `--calls` calls in a row after a barrier, the time per call, the maximum over
ranks. Each figure is the median of `--rounds` rounds in which the chain, recursive doubling and
native `Scan` take turns, so a disturbance from outside hits all alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpiring


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = mpiring.Communicator()
    x = np.ones(max(1, args.bytes // 4), np.float32)
    y = np.empty_like(x)
    variants = {
        "chain (ring)": lambda: comm.scan(x, out=y, algorithm="ring"),
        "recursive doubling": lambda: comm.scan(x, out=y, algorithm="recursive_doubling"),
        "native `Scan`": lambda: world.Scan(x, y),
    }
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, call in variants.items():
            times = []
            for _ in range(args.calls):
                world.Barrier()
                world.Barrier()
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            world.Barrier()
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            in_a_row = (time.perf_counter() - start) / args.calls
            ranks = world.gather((statistics.median(times), in_a_row))
            if world.rank == 0:
                figures[name].append((max(i for i, _ in ranks), max(b for _, b in ranks)))
    comm.free()
    if world.rank == 0:
        print(f"{args.bytes}-byte float32 scan, {world.size} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print("| algorithm | isolated (us) | back to back (us) |\n| --- | --- | --- |")
        for name, values in figures.items():
            isolated = statistics.median(i for i, _ in values) * 1e6
            in_a_row = statistics.median(b for _, b in values) * 1e6
            print(f"| {name} | {isolated:.1f} | {in_a_row:.1f} |")


if __name__ == "__main__":
    main()
