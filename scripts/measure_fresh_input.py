#!/usr/bin/env python3
"""A reduction on an input the caller has just written, against one written long ago
(docs/algorithms.md, "Inputs written just before the call").

    mpirun -n 2 python scripts/measure_fresh_input.py [--collective allreduce|reduce_scatter|reduce]
                                                      [--sizes 64K 256K 1M 4M 16M 64M] [--iters 20]

The benchmark calls a collective on the same input again and again, and nothing writes it
between calls; a training step writes its gradients just before it reduces them. For each size
this times, for the MPI library's own call and for every mpiring algorithm of the collective:
- stale: the call alone;
- fresh: `x` rewritten from a copy (np.copyto), then the call; the rewrite alone is timed too
  and subtracted.
Timed by mpiring.bench.timing, one contender at a time rather than interleaved: on this VM
what ran just before changes these numbers (docs/algorithms.md). It decides nothing itself.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial

import numpy as np
from mpi4py import MPI

import mpiring
from mpiring.algorithms import ALGORITHMS
from mpiring.bench import timing
from mpiring.bench.options import format_bytes, parse_bytes
from mpiring.bench.report import mpi_library_name

# the MPI library's own call for each collective measured, on (comm, x, out)
NATIVE: dict[str, Callable[[MPI.Intracomm, np.ndarray, np.ndarray], object]] = {
    "allreduce": lambda comm, x, out: comm.Allreduce(x, out, MPI.SUM),
    "reduce_scatter": lambda comm, x, out: comm.Reduce_scatter_block(x, out, MPI.SUM),
    "reduce": lambda comm, x, out: comm.Reduce(x, out, MPI.SUM, 0),
}


def calls_for(collective: str, comm: MPI.Intracomm, ours: mpiring.Communicator, x: np.ndarray,
              out: np.ndarray) -> dict[str, Callable[[], object]]:
    """The MPI library's call, then one per mpiring algorithm, all on the same buffers."""
    method = getattr(ours, collective)
    calls: dict[str, Callable[[], object]] = {"native": partial(NATIVE[collective], comm, x, out)}
    for algorithm in ALGORITHMS[collective]:
        calls[algorithm] = lambda a=algorithm: method(x, out=out, algorithm=a)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collective", choices=list(NATIVE), default="allreduce")
    parser.add_argument("--sizes", nargs="+", default=["64K", "256K", "1M", "4M", "16M", "64M"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    ours = mpiring.Communicator(comm)
    if comm.rank == 0:
        print(f"# {mpi_library_name()}, {comm.size} ranks, {args.collective}, float32 sum; "
              "time in us, stale / fresh input, fresh = (rewrite + call) - rewrite")
        print(f"# {timing.describe(args.iters, args.rounds, 3)}")
    for size in map(parse_bytes, args.sizes):
        count = size // 4 // comm.size * comm.size  # float32 elements, a multiple of the ranks
        x, source = mpiring.empty(count, np.float32), mpiring.empty(count, np.float32)
        source[:] = np.arange(count, dtype=np.float32) % 97 + comm.rank
        x[:] = source
        out = mpiring.empty(count // comm.size if args.collective == "reduce_scatter" else count, np.float32)
        out.fill(0)  # first touch outside the timed calls
        rewrite = partial(np.copyto, x, source)
        calls = calls_for(args.collective, comm, ours, x, out)
        contenders: list[Callable[[], object]] = [rewrite]
        for call in calls.values():
            contenders += [call, lambda c=call, w=rewrite: (w(), c())]
        timings = [timing.time_calls(comm, [c], iters=args.iters, reps=args.rounds, warmup=3)[0].avg * 1e6
                   for c in contenders]
        if comm.rank == 0:
            cells = [f"{name} {stale:.1f} / {both - timings[0]:.1f}"
                     for name, stale, both in zip(calls, timings[1::2], timings[2::2], strict=True)]
            print(f"  {format_bytes(size):>6}  rewrite {timings[0]:.1f}  |  " + "  |  ".join(cells))
    ours.free()
    comm.Free()


if __name__ == "__main__":
    main()
