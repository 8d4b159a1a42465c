"""A MPIRING_SWITCH_POINTS file from `mpiring-bench --algorithm all` runs (docs/tuning.md).

    mpirun -n 8 mpiring-bench -c all -a all -b 8 -e 64M -f 4 --json sweep-8.json
    mpirun -n 16 mpiring-bench -c all -a all -b 8 -e 64M -f 4 --json sweep-16.json
    python scripts/switch_points_from_bench.py sweep-8.json sweep-16.json > switch_points.json
    MPIRING_SWITCH_POINTS=$PWD/switch_points.json mpirun -n 16 python my_program.py

For each collective and world size it takes the fastest algorithm at each size (auto left out),
joins neighbouring sizes with the same winner into one row, and orders the world sizes from the
smallest: a row holds up to the largest world size and size measured, and the largest world
size's rows end in an open row. The bench's size S is the size the switch points compare (per
rank for the reductions, scans, all-to-all and broadcast; the whole result for gather,
all-gather and scatter). Check the result against the runs: a winner by a few percent is noise.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections import defaultdict


def fastest(results: list[dict]) -> dict[str, dict[int, list[tuple[int, str]]]]:
    """collective -> ranks -> [(size, fastest algorithm)] in size order."""
    best: dict[tuple[str, int, int], tuple[float, str]] = {}
    for row in results:
        if row["algorithm"] == "auto" or row.get("wrong"):
            continue
        key = (row["collective"], int(row["ranks"]), int(row["size_bytes"]))
        if key not in best or row["time_us"] < best[key][0]:
            best[key] = (row["time_us"], row["algorithm"])
    table: dict[str, dict[int, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
    for (collective, ranks, size), (_, algorithm) in sorted(best.items()):
        table[collective][ranks].append((size, algorithm))
    return table


def rows(by_ranks: dict[int, list[tuple[int, str]]]) -> list[list]:
    """Switch-point rows [most ranks, largest bytes, algorithm]; the last one open."""
    out: list[list] = []
    world_sizes = sorted(by_ranks)
    for ranks in world_sizes:
        last = ranks == world_sizes[-1]
        sizes = by_ranks[ranks]
        for i, (size, algorithm) in enumerate(sizes):
            if i + 1 < len(sizes) and sizes[i + 1][1] == algorithm:
                continue  # the run of this winner goes on
            open_size = i + 1 == len(sizes)
            out.append([None if last else ranks, None if open_size else size, algorithm])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", help="--json files of mpiring-bench --algorithm all runs")
    args = parser.parse_args(argv)
    results = [row for path in args.json for row in json.loads(pathlib.Path(path).read_text())["results"]]
    table = fastest(results)
    if not table:
        parser.error("no results with a named algorithm: run mpiring-bench with --algorithm all")
    tables = [f'  "{collective}": [\n' + ",\n".join(f"    {json.dumps(row)}" for row in rows(by_ranks)) + "\n  ]"
              for collective, by_ranks in table.items()]
    sys.stdout.write('{"switch_points": {\n' + ",\n".join(tables) + "\n}}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
