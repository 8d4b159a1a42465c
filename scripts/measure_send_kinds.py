#!/usr/bin/env python3
"""Persistent or new sends for a plan's small messages (docs/engine.md, "Sends made anew").

    mpirun -n 4 python scripts/measure_send_kinds.py [--calls 2000] [--rounds 7]

A 4-byte binomial broadcast from rank 0 written out with mpi4py, its receive and its sends each
a persistent request (made once, started every call) or a new one (Irecv/Isend), against the
library's own `Bcast`; timed by mpiring.bench.timing (interleaved rounds, each rank's median
batch, mean over ranks). It decides nothing itself: transport.persistent_sends_suit records
what it showed under each MPI wheel.
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

from mpiring.bench import timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.rank, comm.size
    x = np.zeros(1, np.float32)
    parent = rank - (1 << (rank.bit_length() - 1)) if rank else None  # binomial tree rooted at 0
    children, reach = [], 1 << rank.bit_length() if rank else 1
    while rank + reach < size:
        children.append(rank + reach)
        reach <<= 1
    receive = comm.Recv_init(x, parent, 1) if parent is not None else None
    sends = [comm.Send_init(x, child, 1) for child in children]

    def run(persistent_receive: bool, persistent_sends: bool) -> None:
        if parent is not None:
            if persistent_receive:
                receive.Start()
                receive.Wait()
            else:
                comm.Irecv(x, parent, 1).Wait()
        if children:
            if persistent_sends:
                MPI.Prequest.Startall(sends)
                MPI.Request.Waitall(sends)
            else:
                MPI.Request.Waitall([comm.Isend(x, child, 1) for child in children])

    variants = {
        "persistent receive + persistent send": lambda: run(True, True),
        "persistent receive + new send": lambda: run(True, False),
        "new receive + persistent send": lambda: run(False, True),
        "new receive + new send": lambda: run(False, False),
        "native `Bcast`": lambda: comm.Bcast(x, 0),
    }
    timings = timing.time_calls(comm, list(variants.values()), iters=args.calls, reps=args.rounds, warmup=50)
    if rank == 0:
        print(f"# {MPI.Get_library_version().splitlines()[0].strip()}, {size} ranks, 4-byte binomial broadcast")
        for name, measured in zip(variants, timings, strict=True):
            print(f"{name:40s} {measured.avg * 1e6:8.2f} us")
    for request in ([receive] if receive is not None else []) + sends:
        request.Free()
    comm.Free()


if __name__ == "__main__":
    main()
