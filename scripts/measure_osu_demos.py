#!/usr/bin/env python3
"""mpi4py's own OSU collective demos, unchanged, on MPI and on mpiring's drop-in, in one run.

    mpirun -n 2 python scripts/measure_osu_demos.py [--max-size 4096] [--rounds 2] [--demos osu_gather ...]

Each demo (mpi4py's demo/osu_*.py, from the source distribution tests/run_mpi4py_suite.py
fetches and caches) runs with its module's `MPI` seen either as mpi4py's own or with
`COMM_WORLD` replaced by `mpiring.dropin.COMM_WORLD`, as `python -m mpiring.dropin` runs a
program; the two alternate `--rounds` times and each size keeps its lowest latency. Rank 0
prints one table row per demo and size: the demo's own latency on MPI and on the drop-in, and
drop-in time / MPI time (below 1, the drop-in is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
from pathlib import Path
from typing import Any

from mpi4py import MPI

import mpiring.dropin

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from run_mpi4py_suite import OSU_DEMOS, cache_dir, mpi4py_tests  # noqa: E402


class _WithWorld:
    """mpi4py's MPI module as a demo sees it, but for its COMM_WORLD."""

    def __init__(self, world: Any) -> None:
        self.COMM_WORLD = world

    def __getattr__(self, name: str) -> Any:
        return getattr(MPI, name)


def latencies(module: Any, name: str, world: Any, options: dict[str, int]) -> dict[int, float]:
    """{message size: latency in us} as the demo prints them on rank 0 (empty elsewhere)."""
    module.MPI = _WithWorld(world)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        getattr(module, name)(**options)
    rows = (line.split() for line in printed.getvalue().splitlines() if line and not line.startswith("#"))
    return {int(row[0]): float(row[1]) for row in rows if len(row) == 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demos", nargs="+", default=OSU_DEMOS, choices=OSU_DEMOS)
    parser.add_argument("--max-size", type=int, default=4096, help="largest message in bytes (default 4096)")
    parser.add_argument("--rounds", type=int, default=2, help="times each side runs, alternating (default 2)")
    parser.add_argument("--loop", type=int, default=2000, help="timed calls per small size (default 2000)")
    args = parser.parse_args()
    folder = mpi4py_tests(cache_dir(None))
    sys.path.insert(0, os.path.join(os.path.dirname(folder), "demo"))
    options = {"skip": 200, "loop": args.loop, "skip_large": 10, "loop_large": 100, "MAX_MSG_SIZE": args.max_size}
    sides = {"MPI": MPI.COMM_WORLD, "drop-in": mpiring.dropin.COMM_WORLD}
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"# {MPI.COMM_WORLD.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0].strip()}, "
              f"mpiring {mpiring.__version__}; latency in us, the lowest of {args.rounds} rounds")
        print("| demo | size (B) | MPI | drop-in | drop-in / MPI |")
        print("| --- | --- | --- | --- | --- |")
    for name in args.demos:
        module = importlib.import_module(name)
        best: dict[str, dict[int, float]] = {side: {} for side in sides}
        for _ in range(args.rounds):
            for side, world in sides.items():
                for size, latency in latencies(module, name, world, options).items():
                    best[side][size] = min(latency, best[side].get(size, latency))
        for size, native in best["MPI"].items():
            ours = best["drop-in"][size]
            print(f"| {name} | {size} | {native:.2f} | {ours:.2f} | {ours / native if native else float('nan'):.2f} |")


if __name__ == "__main__":
    main()
