"""Where a small all-reduce on device buffers spends its time, per path:

    MPIRING_GPU_IPC=1 mpirun -n 2 python scripts/profile_device_call.py --bytes 8 --calls 2000
    MPIRING_GPU_IPC=0 mpirun -n 2 python scripts/profile_device_call.py --bytes 8 --calls 2000

Each rank binds a GPU, warms up, then times `--calls` all-reduces of the same CuPy arrays (planned
form, out= given) and of new input arrays each call (everyday form), with the stream synchronized
once at the end. Rank 0 then runs the planned form again under cProfile and prints the functions
with the most time of their own, so Python, stream synchronizes and event polls can be told apart.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

from mpi4py import MPI

import mpiring
from mpiring.gpu import bind_device


def _per_call_us(world: MPI.Intracomm, call, calls: int, sync) -> float:
    world.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    elapsed = time.perf_counter() - start
    return world.allreduce(elapsed, op=MPI.MAX) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()

    import cupy

    world = MPI.COMM_WORLD
    bind_device(world)
    comm = mpiring.Communicator(world)
    n = max(1, args.bytes // 4)
    x = cupy.arange(n, dtype=cupy.float32)
    out = cupy.empty_like(x)
    sync = cupy.cuda.get_current_stream().synchronize

    def planned() -> None:
        comm.allreduce(x, out=out)

    def fresh() -> None:
        comm.allreduce(x + 0)

    for _ in range(50):
        planned()
        fresh()
    sync()
    expected = cupy.arange(n, dtype=cupy.float32) * world.size
    planned()
    sync()
    assert bool((out == expected).all()), "wrong all-reduce result"

    rows = [(name, _per_call_us(world, call, args.calls, sync)) for name, call in
            (("planned (same arrays, out=)", planned), ("new input each call", fresh))]
    native_host = _native_host_us(world, n, args.calls)
    profiler = cProfile.Profile()
    world.Barrier()
    profiler.enable()
    for _ in range(args.calls):
        planned()
    sync()
    profiler.disable()
    if world.rank == 0:
        print(f"{world.size} ranks, {n * 4} B float32, MPIRING_GPU_IPC={os.environ.get('MPIRING_GPU_IPC', 'unset')}")
        for name, us in rows:
            print(f"  {name:32s} {us:9.1f} us per call (slowest rank)")
        print(f"  {'MPI Allreduce on host arrays':32s} {native_host:9.1f} us per call")
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue())


def _native_host_us(world: MPI.Intracomm, n: int, calls: int) -> float:
    import numpy

    a = numpy.ones(n, numpy.float32)
    b = numpy.empty_like(a)
    for _ in range(50):
        world.Allreduce(a, b)
    return _per_call_us(world, lambda: world.Allreduce(a, b), calls, lambda: None)


if __name__ == "__main__":
    main()
