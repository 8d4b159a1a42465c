#!/usr/bin/env python3
"""A loop of small broadcasts with nothing else between them, on mpiring and on MPI: each rank's
time per call after loops of 100, 1,000 and 10,000 calls.

    mpirun -n 2 python scripts/measure_one_way_loops.py [--bytes 8] [--loops 100 1000 10000]
    mpirun -n 2 python scripts/measure_one_way_loops.py --no-notice-probe   # diagnosis only

In such a loop the root only sends, so it can run ahead of the others by as many calls as MPI
lets it; the messages wait in the receivers' queue of unexpected messages. A receiver ends each
call of a recorded schedule with a look for a peer that left it (docs/engine.md, "Notices"): the
ranks' notice board where they share a node, else one MPI_Iprobe for its notice on the notices'
own communicator; neither walks that queue. `--no-notice-probe` records the schedules without
the look, to show its share: a run without the check is not safe to use otherwise.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpiring
from mpiring.engine import native


def per_call(world: MPI.Intracomm, call, calls: int) -> float:
    """Microseconds per call over `calls` calls after 200 untimed ones, between two barriers."""
    for _ in range(200):
        call()
    world.Barrier()
    began = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=8, help="message size (default 8)")
    parser.add_argument("--loops", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--no-notice-probe", action="store_true",
                        help="record schedules without the end-of-call look for a peer that left")
    args = parser.parse_args()
    if args.no_notice_probe:
        make_program = native.program

        def without_probe(schedule, *rest, **options):
            schedule.notice = -1
            return make_program(schedule, *rest, **options)

        native.program = without_probe
    world = MPI.COMM_WORLD
    comm = mpiring.Communicator()
    x = np.ones(args.bytes, np.uint8)
    calls = {"mpiring": lambda: comm.broadcast(x, out=x), "MPI": lambda: world.Bcast(x)}
    if world.rank == 0:
        print(f"# {world.size} ranks, {MPI.Get_library_version().splitlines()[0].strip()}, mpiring "
              f"{mpiring.__version__}, broadcast of {args.bytes} B; us per call, rank 0 (the root) first")
    for loop in args.loops:
        for name, call in calls.items():
            times = world.gather(per_call(world, call, loop))
            if world.rank == 0:
                print(f"{loop:6d} calls  {name:8s} " + " ".join(f"{t:8.2f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
