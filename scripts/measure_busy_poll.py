#!/usr/bin/env python3
"""Waits that offer the core between tests against waits that poll without pause (docs/engine.md,
"Busy polling").

    mpirun -n 2 python scripts/measure_busy_poll.py

Two communicators, one made with MPIRING_BUSY_POLL=1 and one with 0, time an 8-byte barrier and
all-reduce and a 64 KiB all-reduce: the whole planned call, and the C replay of its messages
alone (`Program.run`, where the extension was built), beside the native call. The variants take
turns batch by batch (mpiring.bench.timing: each rank's median batch, the mean over ranks).
"""

from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

import mpiring
from mpiring.bench import timing
from mpiring.engine.waiting import YIELD_SECONDS


def main() -> None:
    world = MPI.COMM_WORLD
    comms = {}
    for name, setting in (("offering", "0"), ("busy", "1")):
        os.environ["MPIRING_BUSY_POLL"] = setting
        comms[name] = mpiring.Communicator()
    del os.environ["MPIRING_BUSY_POLL"]
    small, small_out = np.ones(2, np.float32), np.empty(2, np.float32)
    large, large_out = np.ones(16384, np.float32), np.empty(16384, np.float32)
    cases = {
        "barrier": (lambda c: c.barrier(), lambda c: c.plan_of("barrier", None, None), world.Barrier),
        "8 B all-reduce": (lambda c: c.allreduce(small, out=small_out),
                           lambda c: c.plan_of("allreduce", small, small_out),
                           lambda: world.Allreduce(small, small_out)),
        "64 KiB all-reduce": (lambda c: c.allreduce(large, out=large_out),
                              lambda c: c.plan_of("allreduce", large, large_out),
                              lambda: world.Allreduce(large, large_out)),
    }
    variants = {}
    for case, (call, plan_of, native) in cases.items():
        variants[(case, "native")] = native
        for name, comm in comms.items():
            call(comm)
            call(comm)  # the second call with these arrays builds the plan
            variants[(case, f"call, {name}")] = lambda call=call, comm=comm: call(comm)
            program = plan_of(comm).compiled
            if program is not None:
                variants[(case, f"messages, {name}")] = lambda program=program: program.run(0, False, YIELD_SECONDS)
    timings = timing.time_calls(world, list(variants.values()), iters=500, reps=21, warmup=20)
    us = {key: t.avg * 1e6 for key, t in zip(variants, timings, strict=True)}
    for comm in comms.values():
        comm.free()
    if world.rank:
        return
    columns = ["native", "call, offering", "call, busy", "messages, offering", "messages, busy"]
    library = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
    print(f"{world.size} ranks, {library}, us per call")
    print("| case | " + " | ".join(columns) + " |\n|" + " --- |" * (len(columns) + 1))
    for case in cases:
        cells = [f"{us[(case, column)]:.2f}" if (case, column) in us else "-" for column in columns]
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
