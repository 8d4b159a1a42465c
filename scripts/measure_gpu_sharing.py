"""What sharing one GPU between ranks costs a tiny call: every rank at once copies 8 bytes device
to host and waits for the copy's event, `--calls` times; rank 0 prints the slowest rank's time
per copy. Run at 1 rank and at 2 (with and without the CUDA MPS daemon) to see what the ranks'
contexts taking turns on the GPU add to each small device-buffer collective:

    mpirun -n 2 python scripts/measure_gpu_sharing.py
"""

from __future__ import annotations

import argparse
import time

from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    import cupy

    world = MPI.COMM_WORLD
    device = cupy.cuda.Device(0)
    device.use()
    x = cupy.ones(2, dtype=cupy.float32)
    host = cupy.cuda.alloc_pinned_memory(8)
    stream = cupy.cuda.Stream(non_blocking=True)
    event = cupy.cuda.Event(disable_timing=True)

    def one_copy() -> None:
        cupy.cuda.runtime.memcpyAsync(host.ptr, x.data.ptr, 8, cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        event.record(stream)
        while not event.done:
            pass

    def kernel_and_copy() -> None:
        with stream:
            y = x + 1
        cupy.cuda.runtime.memcpyAsync(host.ptr, y.data.ptr, 8, cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        event.record(stream)
        while not event.done:
            pass

    for name, call in (("8 B copy to host + event poll", one_copy),
                       ("kernel + 8 B copy + event poll", kernel_and_copy)):
        for _ in range(100):
            call()
        world.Barrier()
        start = time.perf_counter()
        for _ in range(args.calls):
            call()
        elapsed = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if world.rank == 0:
            print(f"{world.size} ranks on one GPU: {name}: {elapsed / args.calls * 1e6:.1f} us")


if __name__ == "__main__":
    main()
