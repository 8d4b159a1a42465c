#!/usr/bin/env python3
"""Measure how fast the survivors of a lost rank go on: for K ranks, one rank calls os._exit
inside an allreduce loop (or another rank kills it with SIGKILL: --how sigkill); each survivor's
RankLostError, its shrink and its first allreduce on the survivors are timed from the moment the
rank left (time.time() across processes of one machine). Prints the worst survivor's figures per
launch, the median over the launches where every survivor reported, and how many did.

    python scripts/measure_lost_rank.py --ranks 3 4 8 --repeats 5
    python scripts/measure_lost_rank.py --ranks 4 --repeats 10 --how sigkill --in-a-shell

Launches tests/lost_rank_scenarios.py with the setting that keeps survivors running; with
--in-a-shell each rank runs under a shell that outlives it and ignores the launcher's SIGUSR1
(docs/lost-rank.md, "Launch settings"), which a death by signal needs under MPICH's Hydra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from test_lost_rank import IN_A_SHELL, SCENARIOS, launcher, reports  # noqa: E402


def once(ranks: int, size: int, how: str, in_a_shell: bool, timeout: float) -> tuple[float, float, float] | str:
    """(detected, shrunk, first collective done): seconds after the loss, the slowest survivor's;
    or why not every survivor reported (a hang past `timeout`, or the job ended)."""
    with tempfile.TemporaryDirectory() as directory:
        command, env = launcher()
        stages = [{"op": "allreduce", "how": how, "victim": ranks - 1, "size": size, "delay": 0.3}]
        try:
            done = subprocess.run([*command, "-n", str(ranks), *(IN_A_SHELL if in_a_shell else []), sys.executable,
                                   SCENARIOS, json.dumps(stages), directory], env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"no end within {timeout:.0f} s"
        with open(os.path.join(directory, "lost-0")) as file:
            lost_at = float(file.read())
    records = [report["stages"][0] for report in reports(done.stdout)]
    if len(records) != ranks - 1:
        return f"{len(records)} of {ranks - 1} survivors reported (exit {done.returncode})"
    return tuple(max(record[key] for record in records) - lost_at for key in ("t_error", "t_shrunk", "t_first"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[3, 4, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=1000, help="float64 elements of the allreduce")
    parser.add_argument("--how", choices=("exit", "sigkill"), default="exit",
                        help="the victim calls os._exit, or another rank sends it SIGKILL (default exit)")
    parser.add_argument("--in-a-shell", action="store_true", help="each rank under a shell that outlives it")
    parser.add_argument("--timeout", type=float, default=60, help="seconds before a launch counts as hung")
    args = parser.parse_args()
    print("| ranks | every survivor reported | detected (ms) | shrunk (ms) | first allreduce done (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for ranks in args.ranks:
        outcomes = [once(ranks, args.size, args.how, args.in_a_shell, args.timeout) for _ in range(args.repeats)]
        runs = [outcome for outcome in outcomes if not isinstance(outcome, str)]
        cells = [f"{statistics.median(column) * 1e3:.0f} (max {max(column) * 1e3:.0f})"
                 for column in zip(*runs, strict=True)] or ["-"] * 3
        print(f"| {ranks} | {len(runs)} of {len(outcomes)} | " + " | ".join(cells) + " |", flush=True)
        for outcome in sorted({o for o in outcomes if isinstance(o, str)}):
            print(f"#   {sum(o == outcome for o in outcomes)} x {outcome}", flush=True)

if __name__ == "__main__":
    main()
