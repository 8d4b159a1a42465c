"""The GPU goals, measured in one run:  mpirun -n 2 python -m mpiring.gpu.check

1. The limit the staged path's pinned copies set. Every rank copies device->host and
   host->device at once (as the staged ring does, all ranks together, sharing the GPUs' copy
   engines and PCIe links), best of --repeats. A staged ring all-reduce moves 2(p-1)/p n bytes
   through each direction per rank, with the two directions and MPI overlapped, so its bus
   bandwidth cannot exceed the slower direction's concurrent bandwidth: that is the limit.
2. mpiring's device-buffer all-reduce on the staged path (MPIRING_CUDA_AWARE=0 forced), busbw
   per size, and its fraction of the limit (goal: >= 0.8 at >= 16 MiB).
3. Where MPI is CUDA-aware: the direct path against MPI's own Allreduce on the same device
   buffers (goal: at least as fast).
4. The IPC path (ranks of one node, device to device by CUDA IPC), busbw per size against the
   device-to-device copy rate every rank gets while all copy at once (goal: >= 0.5 at >= 64 MiB).
5. What MPI itself moves between host buffers (each rank Sendrecv's with its ring neighbours at
   once): the staged path cannot go faster than this either.

Rank 0 prints a table; --json writes the numbers too. Every rank binds a GPU round robin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy
from mpi4py import MPI

import mpiring

MIB = 1 << 20


def _best(world: MPI.Intracomm, run: Any, sync: Any, repeats: int, iters: int) -> float:
    """Seconds per iteration, the slowest rank's, best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        sync()
        world.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            run()
        sync()
        best = min(best, world.allreduce(time.perf_counter() - start, op=MPI.MAX) / iters)
    return best


def pinned_bandwidth(cupy: Any, world: MPI.Intracomm, nbytes: int, repeats: int) -> dict[str, float]:
    """GB/s per rank for D2H alone, H2D alone, and each direction while both run at once."""
    device = cupy.empty(nbytes, cupy.uint8)
    device_in = cupy.empty(nbytes, cupy.uint8)
    host = cupy.cuda.alloc_pinned_memory(nbytes)
    host_in = cupy.cuda.alloc_pinned_memory(nbytes)
    d2h, h2d = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    runtime = cupy.cuda.runtime

    def to_host() -> None:
        runtime.memcpyAsync(host.ptr, device.data.ptr, nbytes, runtime.memcpyDeviceToHost, d2h.ptr)

    def to_device() -> None:
        runtime.memcpyAsync(device_in.data.ptr, host_in.ptr, nbytes, runtime.memcpyHostToDevice, h2d.ptr)

    def sync() -> None:
        d2h.synchronize()
        h2d.synchronize()

    def both() -> None:
        to_host()
        to_device()

    seconds = {name: _best(world, run, sync, repeats, 4) for name, run in
               (("d2h", to_host), ("h2d", to_device), ("duplex", both))}
    return {
        "d2h_GBps": nbytes / seconds["d2h"] / 1e9,
        "h2d_GBps": nbytes / seconds["h2d"] / 1e9,
        "duplex_each_GBps": nbytes / seconds["duplex"] / 1e9,
    }


def device_copy_bandwidth(cupy: Any, world: MPI.Intracomm, nbytes: int, repeats: int) -> float:
    """GB/s per rank copied device to device (bytes copied, not read + written), all ranks at once."""
    source, target = cupy.empty(nbytes, cupy.uint8), cupy.empty(nbytes, cupy.uint8)
    stream, runtime = cupy.cuda.get_current_stream(), cupy.cuda.runtime

    def copy() -> None:
        runtime.memcpyAsync(target.data.ptr, source.data.ptr, nbytes, runtime.memcpyDeviceToDevice, stream.ptr)

    return nbytes / _best(world, copy, stream.synchronize, repeats, 4) / 1e9


def host_mpi_bandwidth(world: MPI.Intracomm, nbytes: int, repeats: int) -> float:
    """GB/s per rank that MPI moves between host buffers, every rank Sendrecv'ing around the ring."""
    p, rank = world.Get_size(), world.Get_rank()
    if p == 1:
        return float("inf")
    send, receive = numpy.ones(nbytes, numpy.uint8), numpy.empty(nbytes, numpy.uint8)

    def exchange() -> None:
        world.Sendrecv([send, MPI.BYTE], (rank + 1) % p, 7, [receive, MPI.BYTE], (rank - 1) % p, 7)

    return nbytes / _best(world, exchange, lambda: None, repeats, 4) / 1e9


def allreduce_busbw(cupy: Any, world: MPI.Intracomm, run: Any, nbytes: int, repeats: int, iters: int) -> float:
    p = world.Get_size()
    seconds = _best(world, run, lambda: cupy.cuda.get_current_stream().synchronize(), repeats, iters)
    return nbytes / seconds / 1e9 * (2 * (p - 1) / p if p > 1 else 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpiring.gpu.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this file (rank 0)")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    try:
        import cupy

        usable = cupy.is_available()
    except ImportError:
        usable = False
    if not world.allreduce(usable, op=MPI.LAND):
        if rank == 0:
            print("mpiring.gpu.check: no usable GPU with CuPy on every rank; nothing to measure", file=sys.stderr)
        return 2
    device = mpiring.bind_device(world)
    from mpiring.gpu.binding import describe_binding

    rows = world.gather(describe_binding(world, cupy).describe(), root=0)
    awareness = mpiring.cuda_awareness()
    results: dict[str, Any] = {"ranks": p, "bindings": rows, "cuda_aware": awareness.aware,
                               "cuda_aware_how": awareness.how, "cupy": cupy.__version__,
                               "mpi": MPI.Get_library_version().strip().splitlines()[0], "device": device}
    props = cupy.cuda.runtime.getDeviceProperties(device)
    results["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    copies = pinned_bandwidth(cupy, world, 256 * MIB, args.repeats)
    limit = min(copies["duplex_each_GBps"], copies["d2h_GBps"], copies["h2d_GBps"])
    results["pinned"] = copies
    results["staged_limit_GBps"] = limit
    results["device_copy_GBps"] = device_copy_bandwidth(cupy, world, 256 * MIB, args.repeats)
    results["host_mpi_GBps"] = host_mpi_bandwidth(world, 64 * MIB, args.repeats)
    comm = mpiring.Communicator(world)
    original = {name: os.environ.get(name) for name in ("MPIRING_CUDA_AWARE", "MPIRING_GPU_IPC")}
    table = []
    try:
        for mib in args.sizes_mib:
            nbytes = mib * MIB
            x = cupy.ones(nbytes // 4, dtype=cupy.float32)
            out = cupy.empty_like(x)

            def ours(x: Any = x, out: Any = out) -> None:
                comm.allreduce(x, out=out)

            _set_env(MPIRING_GPU_IPC="0", MPIRING_CUDA_AWARE="0")  # staged, whatever the library says
            staged = allreduce_busbw(cupy, world, ours, nbytes, args.repeats, args.iters)
            row = {"MiB": mib, "staged_busbw_GBps": staged, "staged_vs_limit": staged / limit}
            if comm._ring.node_local:  # the IPC path
                _set_env(MPIRING_GPU_IPC="1", MPIRING_CUDA_AWARE=original["MPIRING_CUDA_AWARE"])
                ipc = allreduce_busbw(cupy, world, ours, nbytes, args.repeats, args.iters)
                row.update(ipc_busbw_GBps=ipc, ipc_vs_copy=ipc / results["device_copy_GBps"])
            if awareness.aware:  # the direct path, and MPI's own Allreduce on the same buffers
                _set_env(MPIRING_GPU_IPC="0", MPIRING_CUDA_AWARE=original["MPIRING_CUDA_AWARE"])
                row["direct_busbw_GBps"] = allreduce_busbw(cupy, world, ours, nbytes, args.repeats, args.iters)
                row["native_busbw_GBps"] = allreduce_busbw(
                    cupy, world, lambda x=x, out=out: world.Allreduce(x, out, MPI.SUM), nbytes, args.repeats,
                    args.iters)
            if not bool((out == p).all()):
                raise SystemExit(f"rank {rank}: wrong all-reduce result at {mib} MiB")
            table.append(row)
    finally:
        _set_env(**original)
    results["allreduce"] = table
    comm.free()
    if rank == 0:
        _report(results)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(results, handle, indent=2)
    return 0


def _set_env(**values: str | None) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _report(results: dict[str, Any]) -> None:
    print(f"{results['ranks']} ranks, {results['gpu']}, cupy {results['cupy']}, {results['mpi']}")
    print(f"CUDA-aware: {results['cuda_aware']} ({results['cuda_aware_how']})")
    print("\n".join(results["bindings"]))
    pinned = results["pinned"]
    print(f"pinned copies per rank, all ranks at once: D2H {pinned['d2h_GBps']:.1f} GB/s, "
          f"H2D {pinned['h2d_GBps']:.1f} GB/s, both directions at once {pinned['duplex_each_GBps']:.1f} GB/s each")
    print(f"staged all-reduce busbw limit: {results['staged_limit_GBps']:.1f} GB/s")
    print(f"MPI between host buffers, per rank, all ranks at once: {results['host_mpi_GBps']:.1f} GB/s")
    print(f"device-to-device copy per rank, all ranks at once: {results['device_copy_GBps']:.1f} GB/s")
    print(f"{'MiB':>6} {'staged busbw':>13} {'of limit':>9} {'ipc busbw':>10} {'of copy':>8} {'direct':>8} "
          f"{'native':>8}   (GB/s)")

    def cell(row: dict[str, Any], key: str, form: str, width: int) -> str:
        return format(row[key], form).rjust(width) if key in row else "-".rjust(width)

    for row in results["allreduce"]:
        print(f"{row['MiB']:>6} {row['staged_busbw_GBps']:13.2f} {row['staged_vs_limit']:9.0%} "
              f"{cell(row, 'ipc_busbw_GBps', '.2f', 10)} {cell(row, 'ipc_vs_copy', '.0%', 8)} "
              f"{cell(row, 'direct_busbw_GBps', '.2f', 8)} {cell(row, 'native_busbw_GBps', '.2f', 8)}")


if __name__ == "__main__":
    sys.exit(main())
