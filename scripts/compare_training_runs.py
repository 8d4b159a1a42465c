#!/usr/bin/env python3
"""Compare training reports (examples/train.py --report) made on the host and on a GPU.

    python scripts/compare_training_runs.py runs/*.json

Pairs the reports that differ only in `device` (same strategy, world size, dtype, seed, steps) and
prints, per pair, the largest relative loss difference over all steps, the final losses, the
measured state per rank against the ZeRO formula, and the bytes sent per rank per step against the
theory. Exits 1 if a pair's losses differ by more than --tolerance (float32 rounding by default)
or a GPU report has no host partner.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def key(report: dict[str, Any]) -> tuple:
    return (report["strategy"], report["world_size"], report["dtype"], report["seed"], report["steps"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest relative loss difference")
    args = parser.parse_args(argv)

    runs: dict[tuple, dict[str, dict[str, Any]]] = {}
    for path in args.reports:
        with open(path) as handle:
            report = json.load(handle)
        runs.setdefault(key(report), {})[report["device"]] = report

    print(f"{'strategy':<8} {'N':>2} {'max rel loss diff':>18} {'final cpu':>10} {'final gpu':>10} "
          f"{'state/DDP':>9} {'formula':>8} {'sent/step MB':>12} {'theory':>8}")
    bad = 0
    for (strategy, n, *_), pair in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
        gpu, cpu = pair.get("gpu"), pair.get("cpu")
        if gpu is None or cpu is None:
            print(f"{strategy:<8} {n:>2} missing the {'cpu' if cpu is None else 'gpu'} run")
            bad += 1
            continue
        diff = max((abs(a - b) / max(abs(a), 1e-30) for a, b in zip(cpu["losses"], gpu["losses"], strict=True)),
                   default=0.0)
        bad += diff > args.tolerance
        print(f"{strategy:<8} {n:>2} {diff:>18.2e} {cpu['final_loss']:>10.5f} {gpu['final_loss']:>10.5f} "
              f"{gpu['model_state_ratio_to_ddp']:>9.3f} {gpu['expected_ratio_to_ddp']:>8.3f} "
              f"{gpu['bytes_sent_per_rank'] / 1e6:>12.3f} {gpu['bytes_sent_per_rank_theory'] / 1e6:>8.3f}")
    print(f"{len(runs) - bad} pairs within {args.tolerance:g}, {bad} not")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
