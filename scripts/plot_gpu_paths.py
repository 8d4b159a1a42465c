#!/usr/bin/env python3
"""Device-buffer benchmark runs of several paths side by side: one figure, one panel per
collective, busbw against size per path and for the MPI library's own call; and a Markdown table.

    python scripts/plot_gpu_paths.py --plot paths.png \
        ipc=results/gpu/bench-ipc-*.json staged=results/gpu/bench-staged-*.json

Each LABEL=FILES argument names a path and the `mpiring.bench --json` files of its runs (one per
collective). The native column is taken from the first label's runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from typing import Any


def load(spec: str) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    label, _, pattern = spec.partition("=")
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(glob.glob(pattern)):
        with open(path) as handle:
            for row in json.load(handle)["results"]:
                runs.setdefault(row["collective"], []).append(row)
    if not runs:
        sys.exit(f"no benchmark results match {pattern!r}")
    return label, runs


def size_label(nbytes: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def markdown(paths: list[tuple[str, dict[str, list[dict[str, Any]]]]]) -> str:
    first = paths[0][1]
    header = "| collective | size | " + " | ".join(f"{label} us / busbw GB/s" for label, _ in paths)
    lines = [header + " | native (host buffers) us |", "|" + " --- |" * (len(paths) + 3)]
    for collective, rows in first.items():
        for i, row in enumerate(rows):
            cells = []
            for _, runs in paths:
                other = runs[collective][i]
                cells.append(f"{other['time_us']:.0f} / {other['busbw_gbs']:.2f}")
            lines.append(f"| {collective} | {size_label(row['size_bytes'])} | " + " | ".join(cells)
                         + f" | {row['native_time_us']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="LABEL=FILES")
    parser.add_argument("--plot", metavar="FILE.png")
    args = parser.parse_args(argv)
    paths = [load(spec) for spec in args.runs]
    print(markdown(paths))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        collectives = list(paths[0][1])
        figure, axes = plt.subplots(1, len(collectives), figsize=(4.2 * len(collectives), 3.6), squeeze=False)
        for axis, collective in zip(axes[0], collectives, strict=True):
            for label, runs in paths:
                rows = runs[collective]
                axis.plot([r["size_bytes"] for r in rows], [r["busbw_gbs"] for r in rows], marker="o", label=label)
            rows = paths[0][1][collective]
            axis.plot([r["size_bytes"] for r in rows], [r["native_busbw_gbs"] for r in rows], "k--", marker="s",
                      label="native MPI (host buffers)")
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_title(collective)
            axis.set_xlabel("size (bytes)")
            axis.grid(alpha=0.3)
        axes[0][0].set_ylabel("busbw (GB/s)")
        axes[0][0].legend(fontsize=8)
        meta = paths[0][1][collectives[0]][0]
        figure.suptitle(f"device buffers, {meta['ranks']} ranks sharing one GPU, {meta['dtype']}")
        figure.tight_layout()
        figure.savefig(args.plot, dpi=90)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
