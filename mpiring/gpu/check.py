"""The GPU goals, measured in one run:  mpirun -n 2 python -m mpiring.gpu.check

1. The limit the staged path's pinned copies set. Every rank copies device->host and
   host->device at once (as the staged ring does, all ranks together, sharing the GPUs' copy
   engines and PCIe links). A staged ring all-reduce moves 2(p-1)/p n bytes
   through each direction per rank, with the two directions and MPI overlapped, so its bus
   bandwidth cannot exceed the slower direction's concurrent bandwidth: that is the limit.
2. mpiring's device-buffer all-reduce on the staged path (MPIRING_CUDA_AWARE=0 forced), busbw
   per size, and its fraction of the limit (goal: >= 0.8 at >= 16 MiB): planned (the same
   buffers every call, as a training loop calls it) and unplanned (a new view of x every call).
3. Where MPI is CUDA-aware: the direct path against MPI's own Allreduce on the same device
   buffers (goal: at least as fast), planned.
4. The IPC path (ranks of one node, device to device by CUDA IPC), busbw per size against the
   device-to-device copy rate every rank gets while all copy at once (goal: >= 0.5 at >= 64 MiB).
5. What MPI itself moves between host buffers (each rank Sendrecv's with its ring neighbours at
   once): the staged path cannot go faster than this either.

Every time is taken by mpiring.bench.timing, the benchmark's method and statistic: --warmup
untimed calls, then --repeats rounds in which the contenders measured together (the three copy
directions; the paths of one size) take turns, each timing one batch of calls after a barrier
(--iters calls for the all-reduce, 4 for the copies and MPI probes), with the streams
synchronized before each clock reading; each rank keeps its median batch and the numbers use the
mean of those medians over ranks.

Rank 0 prints a table; --json writes the numbers too. Every rank binds a GPU round robin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy
from mpi4py import MPI

import mpiring
from mpiring.bench import timing

MIB = 1 << 20


# Calls per timed batch of the copy and MPI probes: each moves 64-256 MiB, so a few calls make a
# batch long enough to time and short enough to repeat.
PROBE_ITERS = 4


def _seconds(world: MPI.Intracomm, calls: Sequence[timing.Call], sync: timing.Call, repeats: int, iters: int,
             warmup: int) -> list[float]:
    """Seconds per call of each of `calls`, taking turns (mpiring.bench.timing: the mean over
    ranks of each rank's median batch)."""
    timings = timing.time_calls(world, calls, iters=iters, reps=repeats, warmup=warmup, sync=sync)
    return [t.avg for t in timings]


def pinned_bandwidth(cupy: Any, world: MPI.Intracomm, nbytes: int, repeats: int,
                     warmup: int = 1) -> dict[str, float]:
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

    d2h_s, h2d_s, duplex_s = _seconds(world, (to_host, to_device, both), sync, repeats, PROBE_ITERS, warmup)
    return {
        "d2h_GBps": nbytes / d2h_s / 1e9,
        "h2d_GBps": nbytes / h2d_s / 1e9,
        "duplex_each_GBps": nbytes / duplex_s / 1e9,
    }


def device_copy_bandwidth(cupy: Any, world: MPI.Intracomm, nbytes: int, repeats: int, warmup: int = 1) -> float:
    """GB/s per rank copied device to device (bytes copied, not read + written), all ranks at once."""
    source, target = cupy.empty(nbytes, cupy.uint8), cupy.empty(nbytes, cupy.uint8)
    stream, runtime = cupy.cuda.get_current_stream(), cupy.cuda.runtime

    def copy() -> None:
        runtime.memcpyAsync(target.data.ptr, source.data.ptr, nbytes, runtime.memcpyDeviceToDevice, stream.ptr)

    [seconds] = _seconds(world, [copy], stream.synchronize, repeats, PROBE_ITERS, warmup)
    return nbytes / seconds / 1e9


def host_mpi_bandwidth(world: MPI.Intracomm, nbytes: int, repeats: int, warmup: int = 1) -> float:
    """GB/s per rank that MPI moves between host buffers, every rank Sendrecv'ing around the ring."""
    p, rank = world.Get_size(), world.Get_rank()
    if p == 1:
        return float("inf")
    send, receive = numpy.ones(nbytes, numpy.uint8), numpy.empty(nbytes, numpy.uint8)

    def exchange() -> None:
        world.Sendrecv([send, MPI.BYTE], (rank + 1) % p, 7, [receive, MPI.BYTE], (rank - 1) % p, 7)

    [seconds] = _seconds(world, [exchange], timing.no_sync, repeats, PROBE_ITERS, warmup)
    return nbytes / seconds / 1e9


def allreduce_busbw(cupy: Any, world: MPI.Intracomm, runs: dict[str, timing.Call], nbytes: int, repeats: int,
                    iters: int, warmup: int = 1) -> dict[str, float]:
    """Bus bandwidth (GB/s, nccl-tests' 2(p-1)/p n / t) of each named all-reduce of `nbytes`,
    the runs taking turns."""
    p = world.Get_size()
    factor = 2 * (p - 1) / p if p > 1 else 1.0
    seconds = _seconds(world, list(runs.values()), lambda: cupy.cuda.get_current_stream().synchronize(), repeats,
                       iters, warmup)
    return {name: nbytes / t / 1e9 * factor for name, t in zip(runs, seconds, strict=True)}


def _on_path(call: timing.Call, **environment: str | None) -> timing.Call:
    """`call` with the environment variables that choose its path set before every call: the
    paths take turns in the timed rounds, and mpiring reads these variables on every call
    (mpiring.gpu.device_backend). Setting them costs microseconds; the calls take milliseconds."""

    def run() -> None:
        _set_env(**environment)
        call()

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpiring.gpu.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed batches of each contender; each rank keeps its median (default 5)")
    parser.add_argument("--iters", type=int, default=5, help="all-reduces per timed batch (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls of each contender (default 1)")
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
    copies = pinned_bandwidth(cupy, world, 256 * MIB, args.repeats, args.warmup)
    limit = min(copies["duplex_each_GBps"], copies["d2h_GBps"], copies["h2d_GBps"])
    results["pinned"] = copies
    results["staged_limit_GBps"] = limit
    results["device_copy_GBps"] = device_copy_bandwidth(cupy, world, 256 * MIB, args.repeats, args.warmup)
    results["host_mpi_GBps"] = host_mpi_bandwidth(world, 64 * MIB, args.repeats, args.warmup)
    results["statistic"] = (f"{timing.describe(args.iters, args.repeats, args.warmup)} (copies and host MPI: "
                            f"batches of {PROBE_ITERS})")
    comm = mpiring.Communicator(world)
    original = {name: os.environ.get(name) for name in ("MPIRING_CUDA_AWARE", "MPIRING_GPU_IPC")}
    aware = original["MPIRING_CUDA_AWARE"]  # the user's own setting, if any, for the paths that follow it
    table = []
    try:
        for mib in args.sizes_mib:
            nbytes = mib * MIB
            x = cupy.ones(nbytes // 4, dtype=cupy.float32)
            outs = {name: cupy.empty_like(x) for name in ("staged", "unplanned", "ipc", "direct", "native")}

            def ours(out: Any, x: Any = x) -> None:  # same arrays every call: replays a plan (not on ipc)
                comm.allreduce(x, out=out)

            def unplanned(x: Any = x, out: Any = outs["unplanned"]) -> None:  # a new view each call: no plan
                comm.allreduce(x[:], out=out)

            # staged whatever the library says, planned and not; IPC where the ranks share a node;
            # where MPI is CUDA-aware, the direct path and MPI's own Allreduce on the same buffers.
            # Each path has its own output, so each keeps its own plan.
            runs = {"staged": _on_path(partial(ours, outs["staged"]), MPIRING_GPU_IPC="0", MPIRING_CUDA_AWARE="0"),
                    "unplanned": _on_path(unplanned, MPIRING_GPU_IPC="0", MPIRING_CUDA_AWARE="0")}
            if comm._ring.node_local:
                runs["ipc"] = _on_path(partial(ours, outs["ipc"]), MPIRING_GPU_IPC="1", MPIRING_CUDA_AWARE=aware)
            if awareness.aware:
                runs["direct"] = _on_path(partial(ours, outs["direct"]), MPIRING_GPU_IPC="0", MPIRING_CUDA_AWARE=aware)
                runs["native"] = lambda x=x, out=outs["native"]: world.Allreduce(x, out, MPI.SUM)
            busbw = allreduce_busbw(cupy, world, runs, nbytes, args.repeats, args.iters, args.warmup)
            row = {"MiB": mib, "staged_busbw_GBps": busbw["staged"], "staged_vs_limit": busbw["staged"] / limit,
                   "staged_unplanned_busbw_GBps": busbw["unplanned"],
                   "staged_planned": comm.plan_of("allreduce", x, outs["staged"]) is not None}
            if "ipc" in busbw:
                row.update(ipc_busbw_GBps=busbw["ipc"], ipc_vs_copy=busbw["ipc"] / results["device_copy_GBps"])
            if "direct" in busbw:
                row.update(direct_busbw_GBps=busbw["direct"], native_busbw_GBps=busbw["native"],
                           direct_planned=comm.plan_of("allreduce", x, outs["direct"]) is not None)
            for name in runs:
                if not bool((outs[name] == p).all()):
                    raise SystemExit(f"rank {rank}: wrong all-reduce result on the {name} path at {mib} MiB")
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
    print(f"timing (mpiring.bench.timing): {results['statistic']}")
    print("\n".join(results["bindings"]))
    pinned = results["pinned"]
    print(f"pinned copies per rank, all ranks at once: D2H {pinned['d2h_GBps']:.1f} GB/s, "
          f"H2D {pinned['h2d_GBps']:.1f} GB/s, both directions at once {pinned['duplex_each_GBps']:.1f} GB/s each")
    print(f"staged all-reduce busbw limit: {results['staged_limit_GBps']:.1f} GB/s")
    print(f"MPI between host buffers, per rank, all ranks at once: {results['host_mpi_GBps']:.1f} GB/s")
    print(f"device-to-device copy per rank, all ranks at once: {results['device_copy_GBps']:.1f} GB/s")
    print(f"{'MiB':>6} {'staged busbw':>13} {'of limit':>9} {'unplanned':>10} {'ipc busbw':>10} {'of copy':>8} "
          f"{'direct':>8} {'native':>8}   (GB/s)")

    def cell(row: dict[str, Any], key: str, form: str, width: int) -> str:
        return format(row[key], form).rjust(width) if key in row else "-".rjust(width)

    for row in results["allreduce"]:
        unplanned = [name for name in ("staged", "direct") if not row.get(f"{name}_planned", True)]
        print(f"{row['MiB']:>6} {row['staged_busbw_GBps']:13.2f} {row['staged_vs_limit']:9.0%} "
              f"{row['staged_unplanned_busbw_GBps']:10.2f} "
              f"{cell(row, 'ipc_busbw_GBps', '.2f', 10)} {cell(row, 'ipc_vs_copy', '.0%', 8)} "
              f"{cell(row, 'direct_busbw_GBps', '.2f', 8)} {cell(row, 'native_busbw_GBps', '.2f', 8)}"
              f"{'   (not planned: ' + ', '.join(unplanned) + ')' if unplanned else ''}")


if __name__ == "__main__":
    sys.exit(main())
