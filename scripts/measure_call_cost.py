#!/usr/bin/env python3
"""Where the time of a small recorded all-reduce goes (docs/engine.md, "Where the microseconds").

    mpirun -n 2 python scripts/measure_call_cost.py [--bytes 8] [--write docs/engine.md]

Variants of one all-reduce of float32 into out=, timed by mpiring.bench.timing (the
benchmark's method and statistic): they take turns batch by batch in rounds, so a disturbance
from outside hits all alike, each rank keeps each variant's median batch, and the table gives
the mean over ranks:
- native: mpi4py's `Allreduce`;
- Python floor: the same exchange and add written out by hand with persistent requests made once
  (`Startall`, `Waitall` with statuses, one size check, `np.add(..., out=)`), what any Python
  implementation pays at least;
- mpiring: `comm.allreduce(x, out=y)` with its schedule cached, also on a communicator without a
  timeout, and as a persistent request;
- a replay of the schedule, bound once, without the call around it (`run_recorded`), so the
  difference to the full call is the lookup, the binding and the per-call checks;
- the recorded call with its cache hit taken in Python rather than by the C Shortcut
  (native.shortcut), where the C replay was built;
- the recorded call with its schedule replayed in Python (MPIRING_COMPILED=0) rather than in C
  (mpiring.engine.native), where the C replay was built.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import subprocess

import numpy as np
from mpi4py import MPI

import mpiring
from mpiring.bench import timing
from mpiring.engine import native
from mpiring.engine.run import run_recorded

MARKERS = ("<!-- BEGIN CALL COST -->", "<!-- END CALL COST -->")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 20  # untimed calls of each variant


def provenance(write: str | None) -> str:
    """The version, commit, date, machine and command the table comes from."""
    def git(*words: str) -> str:
        return subprocess.run(["git", "-C", ROOT, *words], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no", "--", "mpiring", "setup.py", "setup.cfg"):
        commit += " with uncommitted changes to the package"
    command = "mpirun -n 2 python scripts/measure_call_cost.py" + (f" --write {write}" if write else "")
    return (f"mpiring {mpiring.__version__} at commit {commit}, {datetime.date.today().isoformat()}; "
            f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}; `{command}`.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--write", metavar="DOC", help="replace the table between the CALL COST markers of DOC")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit("run it with 2 ranks")
    comm = mpiring.Communicator()
    peer = 1 - world.rank
    x = np.ones(max(1, args.bytes // 4), np.float32)
    y, incoming = np.empty_like(x), np.empty_like(x)
    requests = [world.Recv_init([incoming, MPI.BYTE], peer, 7), world.Send_init([x, MPI.BYTE], peer, 7)]
    statuses = [MPI.Status(), MPI.Status()]

    def floor() -> None:
        MPI.Prequest.Startall(requests)
        MPI.Request.Waitall(requests, statuses)
        if statuses[0].Get_count(MPI.BYTE) != incoming.nbytes:
            raise AssertionError("size")
        np.add(x, incoming, out=y) if world.rank == 0 else np.add(incoming, x, out=y)

    persistent = comm.allreduce_init(x, out=y)
    os.environ["MPIRING_COMPILED"] = "0"  # read when a schedule is built: this one replays in Python
    in_python = mpiring.Communicator()
    in_python.allreduce(x, out=y)
    in_python.allreduce(x, out=y)
    del os.environ["MPIRING_COMPILED"]
    unlimited = mpiring.Communicator(timeout=math.inf)
    unlimited.allreduce(x, out=y)
    hit_in_python = mpiring.Communicator()
    hit_in_python._blocking = hit_in_python._engine.run_in_python
    hit_in_python.allreduce(x, out=y)

    def start_and_wait() -> None:
        persistent.start()
        persistent.wait()

    variants = {
        "native `Allreduce`": lambda: world.Allreduce(x, y),
        "Python floor (persistent requests, by hand)": floor,
        "mpiring `comm.allreduce(x, out=y)`, recorded": lambda: comm.allreduce(x, out=y),
        "the same on a `Communicator(timeout=math.inf)` (no timeout)": lambda: unlimited.allreduce(x, out=y),
        "persistent: `req.start(); req.wait()`": start_and_wait,
        "the recorded call, its cache hit in Python (no C Shortcut)": lambda: hit_in_python.allreduce(x, out=y),
        "the recorded call replayed in Python (`MPIRING_COMPILED=0`)": lambda: in_python.allreduce(x, out=y),
    }
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)
    schedule = comm.plan_of("allreduce", x, y)
    schedule.bind(x, y)
    variants["the schedule's replay alone (`run_recorded`)"] = lambda: run_recorded(comm._ring, schedule, comm.timeout)
    timings = timing.time_calls(world, list(variants.values()), iters=args.calls, reps=args.rounds, warmup=WARMUP)
    us = {name: t.avg * 1e6 for name, t in zip(variants, timings, strict=True)}
    schedule.unbind()
    for request in requests:
        request.Free()
    persistent.free()
    in_python.free()
    hit_in_python.free()
    if world.rank:
        return
    mpi_us = us["native `Allreduce`"]
    library = " ".join(MPI.Get_library_version().splitlines()[0].split(",")[0].split())
    lines = [provenance(args.write), "", f"{args.bytes}-byte float32 all-reduce, 2 ranks, {library}, "
             f"{timing.describe(args.calls, args.rounds, WARMUP)}:", "",
             "| variant | us per call | x native |", "| --- | --- | --- |"]
    for name, value in us.items():
        lines.append(f"| {name} | {value:.2f} | {value / mpi_us:.2f} |")
    call = us["mpiring `comm.allreduce(x, out=y)`, recorded"]
    replay = us["the schedule's replay alone (`run_recorded`)"]
    floor_us = us["Python floor (persistent requests, by hand)"]
    no_limit = us["the same on a `Communicator(timeout=math.inf)` (no timeout)"]
    lines += ["", f"Schedules replay {native.describe()} here. Of mpiring's {call:.2f} us: {floor_us:.2f} "
              f"the floor's messages and add, {replay - floor_us:+.2f} the replay loop around them (traffic "
              f"counters, step loop; below zero where C beats the hand-written "
              f"Python), {call - replay:.2f} the call itself (method, cache "
              "lookup, binding the arrays, the checks that the thread and communicator still fit). "
              f"The default timeout (10 minutes; a Testall, then a timed poll) costs {call - no_limit:+.2f} us "
              "against no timeout (one Waitall); the replay alone waits as the call does."]
    text = "\n".join(lines)
    print(text)
    if args.write:
        with open(args.write) as file:
            doc = file.read()
        head, rest = doc.split(MARKERS[0])
        _, tail = rest.split(MARKERS[1])
        with open(args.write, "w") as file:
            file.write(f"{head}{MARKERS[0]}\n{text}\n{MARKERS[1]}{tail}")


if __name__ == "__main__":
    main()
