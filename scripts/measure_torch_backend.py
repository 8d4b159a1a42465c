#!/usr/bin/env python3
"""All-reduce through torch.distributed on the mpiring backend, against mpiring's own call on the
same tensors, PyTorch's gloo backend and the MPI library (docs/pytorch-and-jax.md).

    mpirun -n 2 python scripts/measure_torch_backend.py [--sizes 8 64 512 4K 64K 512K 4M]
                                                        [--iters N] [--reps 15] [--json PATH]

For each size, one float32 tensor of zeros (the sum stays zero, so no call meets infinities),
reduced in place by each contender, interleaved round by round (mpiring.bench.timing):
- mpiring numpy: `comm.allreduce(a, out=a)`, `a` the NumPy view of the tensor's memory;
- mpiring tensor: `comm.allreduce(t, out=t)`, the tensor itself (mpiring.interop, DLPack);
- torch mpiring: `dist.all_reduce(t)` on the "mpiring" process group;
- torch gloo: `dist.all_reduce(t, group=gloo)`, a gloo group of the same ranks;
- MPI: the MPI library's `Allreduce(MPI.IN_PLACE, a)` on COMM_WORLD.
It decides nothing itself: it prints the table (times in microseconds, mean over ranks of each
rank's median batch) and the ratios the targets are stated in.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from mpi4py import MPI

import mpiring
import mpiring.torch  # noqa: F401 - registers the backend
from mpiring.bench import timing
from mpiring.bench.options import format_bytes, parse_bytes
from mpiring.bench.report import mpi_library_name

CONTENDERS = ("mpiring numpy", "mpiring tensor", "torch mpiring", "torch gloo", "MPI")


def contenders(comm: mpiring.Communicator, world: MPI.Intracomm, gloo: object, tensor: torch.Tensor) -> list:
    """The calls timed, in CONTENDERS' order, each reducing `tensor`'s memory in place."""
    array = tensor.numpy()
    return [
        lambda: comm.allreduce(array, out=array),
        lambda: comm.allreduce(tensor, out=tensor),
        lambda: dist.all_reduce(tensor),
        lambda: dist.all_reduce(tensor, group=gloo),
        lambda: world.Allreduce(MPI.IN_PLACE, array),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["8", "64", "512", "4K", "64K", "512K", "4M"])
    parser.add_argument("--iters", type=int, default=None, help="calls per batch (default: by size)")
    parser.add_argument("--reps", type=int, default=15, help="interleaved rounds (median over them)")
    parser.add_argument("--json", default=None, help="also write the table here")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("mpiring")
    gloo = dist.new_group(backend="gloo")
    world = MPI.COMM_WORLD
    comm = mpiring.Communicator()
    rows = []
    for text in args.sizes:
        nbytes = parse_bytes(text)
        tensor = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
        calls = contenders(comm, world, gloo, tensor)
        iters = args.iters or max(5, min(2000, (1 << 22) // max(nbytes, 1) * 2))
        timings = timing.time_calls(world, calls, iters=iters, reps=args.reps, warmup=max(3, iters // 10))
        rows.append({"bytes": tensor.numel() * 4, **{name: t.avg * 1e6 for name, t in zip(CONTENDERS, timings,
                                                                                             strict=True)}})
    if world.Get_rank() == 0:
        print(f"# all-reduce (sum, float32, in place), {world.Get_size()} ranks, {mpi_library_name()}, "
              f"mpiring {mpiring.__version__}, torch {torch.__version__}")
        print(f"# {timing.describe(args.iters or 0, args.reps, 0)} (iterations: --iters, else 5-2000 by size)")
        print("| size | " + " | ".join(f"{name} (us)" for name in CONTENDERS)
              + " | torch mpiring / mpiring tensor | torch mpiring / mpiring numpy | gloo / torch mpiring |")
        print("|" + " --- |" * (len(CONTENDERS) + 4))
        for row in rows:
            cells = " | ".join(f"{row[name]:.1f}" for name in CONTENDERS)
            ours = row["torch mpiring"]
            print(f"| {format_bytes(row['bytes'])} | {cells} | {ours / row['mpiring tensor']:.2f} | "
                  f"{ours / row['mpiring numpy']:.2f} | {row['torch gloo'] / ours:.1f} |")
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"ranks": world.Get_size(), "mpi": mpi_library_name(), "mpiring": mpiring.__version__,
                           "torch": torch.__version__, "rows": rows}, handle, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
