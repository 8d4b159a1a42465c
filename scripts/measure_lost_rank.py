#!/usr/bin/env python3
"""Measure how fast the survivors of a lost rank go on: for K ranks, one rank calls os._exit
inside an allreduce loop; each survivor's RankLostError, its shrink and its first allreduce on
the survivors are timed from the moment the rank left (time.time() across processes of one
machine). Prints the worst survivor's figures per launch and the median over launches.

    python scripts/measure_lost_rank.py --ranks 3 4 8 --repeats 5

Launches tests/lost_rank_scenarios.py with the setting that keeps survivors running.
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

from test_lost_rank import SCENARIOS, launcher, reports  # noqa: E402


def once(ranks: int, size: int) -> tuple[float, float, float]:
    """(detected, shrunk, first collective done): seconds after the loss, the slowest survivor's."""
    with tempfile.TemporaryDirectory() as directory:
        command, env = launcher()
        stages = [{"op": "allreduce", "how": "exit", "victim": ranks - 1, "size": size, "delay": 0.3}]
        done = subprocess.run([*command, "-n", str(ranks), sys.executable, SCENARIOS,
                               json.dumps(stages), directory], env=env, capture_output=True, text=True, timeout=120)
        with open(os.path.join(directory, "lost-0")) as file:
            lost_at = float(file.read())
    records = [report["stages"][0] for report in reports(done.stdout)]
    if len(records) != ranks - 1:
        raise SystemExit(f"{len(records)} survivors reported:\n{done.stdout}\n{done.stderr}")
    return tuple(max(record[key] for record in records) - lost_at for key in ("t_error", "t_shrunk", "t_first"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[3, 4, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=1000, help="float64 elements of the allreduce")
    args = parser.parse_args()
    print("| ranks | detected (ms) | shrunk (ms) | first allreduce on the survivors done (ms) |")
    print("| --- | --- | --- | --- |")
    for ranks in args.ranks:
        runs = [once(ranks, args.size) for _ in range(args.repeats)]
        cells = []
        for column in zip(*runs, strict=True):
            cells.append(f"{statistics.median(column) * 1e3:.0f} (max {max(column) * 1e3:.0f})")
        print(f"| {ranks} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
