#!/usr/bin/env python3
"""One message from 4 KiB pages or from 2 MiB pages (docs/benchmarks.md, "Buffers and pages").

    mpirun -n 2 python scripts/measure_pages.py [--sizes 64K 256K 1M 4M 16M 64M] [--iters 20]

Rank 0 sends one message of each size to rank 1 (mpi4py `Send`/`Recv`), from and into buffers
in 4 KiB pages (a fresh mapping marked MADV_NOHUGEPAGE) or in 2 MiB pages (the mapping mpiring.empty
makes from 64 KiB up, here at every size), every
pairing of the sender's and the receiver's kind; timed by mpiring.bench.timing. It decides
nothing itself: mpiring.host_memory records what it showed under each MPI wheel.
"""

from __future__ import annotations

import argparse
import mmap

import numpy as np
from mpi4py import MPI

from mpiring import host_memory
from mpiring.bench import timing
from mpiring.bench.options import format_bytes, parse_bytes
from mpiring.bench.report import mpi_library_name


def small_pages(nbytes: int) -> np.ndarray:
    """Bytes in 4 KiB pages, whatever the kernel's huge-page setting."""
    mapping = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mapping, np.uint8)[:nbytes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["64K", "256K", "1M", "4M", "16M", "64M"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    if comm.size != 2:
        raise SystemExit("run it with 2 ranks")
    pairings = [("2 MiB", "2 MiB"), ("2 MiB", "4 KiB"), ("4 KiB", "2 MiB"), ("4 KiB", "4 KiB")]
    if comm.rank == 0:
        print(f"# {mpi_library_name()}, 2 ranks, one message; sender's pages -> receiver's")
        print(f"# {timing.describe(args.iters, args.rounds, 3)}")
        print(f"# {'size':>8} " + " ".join(f"{s + ' -> ' + r:>16}" for s, r in pairings) + "   (us)")
    for size in map(parse_bytes, args.sizes):
        calls = []
        for sender, receiver in pairings:
            kind = sender if comm.rank == 0 else receiver
            buffer = host_memory.in_huge_pages(size) if kind == "2 MiB" else small_pages(size)
            buffer.fill(1)  # first touch: the pages are made here, not in the timed calls
            if comm.rank == 0:
                calls.append(lambda b=buffer: comm.Send(b, 1, 0))
            else:
                calls.append(lambda b=buffer: comm.Recv(b, 0, 0))
        timings = timing.time_calls(comm, calls, iters=args.iters, reps=args.rounds, warmup=3)
        if comm.rank == 0:
            print(f"  {format_bytes(size):>8} " + " ".join(f"{t.avg * 1e6:16.1f}" for t in timings))
    comm.Free()


if __name__ == "__main__":
    main()
