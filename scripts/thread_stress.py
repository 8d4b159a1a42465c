#!/usr/bin/env python3
"""Threads on mpiring communicators, many times over (tests/thread_scenarios.py's scenarios;
tests/test_threads.py runs a few of them in the suite).

    python scripts/thread_stress.py [--rounds 1000] [--sizes 2 3 4] [--levels multiple serialized]

Splits `--rounds` rounds evenly over every world size and MPI thread level (mpi4py.rc.thread_level,
set before MPI starts) and launches one `mpirun -n SIZE` per pair. A round is one communicator
whose owner thread waits inside a call (blocking, persistent or nonblocking, in turn) while three
other threads call it every way there is (each call must be refused before any message moves,
and the owner's call must return the right data), then, at MPI_THREAD_MULTIPLE, every tenth
round also three threads each calling a communicator of its own at once. A launch that crashes,
hangs (the --launch-timeout) or fails an assertion fails the run; the summary gives each launch's
rounds, seconds and what the intruders' calls raised.

    mpirun -n 2 python scripts/thread_stress.py --worker --rounds 50 --level multiple   # one launch by hand
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(rounds: int, level: str, seed: int) -> None:
    import mpi4py

    mpi4py.rc.thread_level = level
    from mpi4py import MPI

    sys.path.insert(0, str(ROOT / "tests"))
    from thread_scenarios import KINDS, intruded, own_communicators

    world = MPI.COMM_WORLD
    multiple = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
    seen: dict[str, int] = {}
    own = 0
    started = time.perf_counter()
    for n in range(rounds):
        for name, count in intruded(KINDS[n % len(KINDS)], seed=seed + n).items():
            seen[name] = seen.get(name, 0) + count
        if multiple and n % 10 == 9:
            own_communicators(seed=seed + n, iterations=4)
            own += 1
    seconds = time.perf_counter() - started
    totals = world.gather(seen)
    if world.Get_rank() == 0:
        merged: dict[str, int] = {}
        for part in totals:
            for name, count in part.items():
                merged[name] = merged.get(name, 0) + count
        print(json.dumps({"size": world.Get_size(), "level": level, "provided": MPI.Query_thread(),
                          "rounds": rounds, "own_communicator_rounds": own, "seconds": round(seconds, 2),
                          "refused": merged}), flush=True)


def launch(size: int, level: str, rounds: int, seed: int, timeout: float) -> dict:
    command = ["mpirun", "-n", str(size), sys.executable, str(Path(__file__).resolve()), "--worker",
               "--rounds", str(rounds), "--level", level, "--seed", str(seed)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, "MPIEXEC_TIMEOUT": str(int(timeout))})
    except subprocess.TimeoutExpired:
        return {"size": size, "level": level, "rounds": rounds, "failed": f"hung: no end after {timeout} s"}
    report = {"size": size, "level": level, "rounds": rounds, "wall_seconds": round(time.perf_counter() - started, 1)}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        report["failed"] = f"exit status {done.returncode}: {(done.stdout + done.stderr)[-3000:]}"
    else:
        report.update(json.loads(lines[-1]))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1000, help="rounds in all (split over sizes and levels)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--levels", nargs="+", default=["multiple", "serialized"],
                        choices=["single", "funneled", "serialized", "multiple"])
    parser.add_argument("--launch-timeout", type=float, default=900.0, help="seconds for one mpirun")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--level", default="multiple", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.level, args.seed)
        return 0
    pairs = [(size, level) for size in args.sizes for level in args.levels]
    reports = []
    for index, (size, level) in enumerate(pairs):
        rounds = args.rounds // len(pairs) + (index < args.rounds % len(pairs))
        report = launch(size, level, rounds, args.seed + 100_000 * index, args.launch_timeout)
        print(json.dumps(report), flush=True)
        reports.append(report)
    failed = [r for r in reports if "failed" in r]
    print(f"{sum(r['rounds'] for r in reports)} rounds in {len(reports)} launches, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
