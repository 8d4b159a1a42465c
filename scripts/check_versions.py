#!/usr/bin/env python3
"""Check the declared range: mpiring installed from this checkout into a fresh virtual environment
for every Python from 3.10 to 3.13 found here, with the oldest NumPy that Python can take (at least
the declared minimum, setup.cfg's numpy>=1.25) and the newest, then the serial quick tests and a
2-rank collective checked against mpi4py's own.

    python scripts/check_versions.py                    # every Python found, oldest and newest NumPy
    python scripts/check_versions.py --pythons 3.12     # one Python

Pythons are looked up as `python3.X` on PATH (pyenv's shims left out), then under `pyenv root`. A Python not found is
reported as such, not as passed. Needs the package index (NumPy, mpi4py and the mpich wheel).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the oldest NumPy with wheels for each Python, at least the declared minimum
OLDEST_NUMPY = {"3.10": "1.25.2", "3.11": "1.25.2", "3.12": "1.26.4", "3.13": "2.1.3"}
QUICK_TESTS = ["tests/test_package.py", "tests/test_topology.py", "tests/test_selection.py", "tests/test_schedules.py"]
SMOKE = """
import numpy as np
from mpi4py import MPI
import mpiring
comm = mpiring.Communicator()
x = np.arange(10.0) + comm.rank
want = np.empty_like(x)
MPI.COMM_WORLD.Allreduce(x, want)
assert np.array_equal(comm.allreduce(x), want)
assert np.array_equal(comm.allreduce(x), want)  # replayed from its recorded schedule
from mpiring.engine import native
print("smoke ok, C replay", native.available(), "numpy", np.__version__)
"""


def find_python(version: str) -> str | None:
    """`python3.X` on PATH (not a pyenv shim, which may refuse), else the newest under `pyenv root`."""
    found = shutil.which(f"python{version}")
    if found and "/shims/" not in found:
        return found
    root = os.path.expanduser("~/.pyenv")
    if shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() or root
    matches = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")))
    return matches[-1] if matches else None


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)


def check(python: str, numpy: str | None) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="mpiring-range-") as folder:
        venv = os.path.join(folder, "venv")
        bin_dir = os.path.join(venv, "bin")
        steps = [
            [python, "-m", "venv", venv],
            [os.path.join(bin_dir, "pip"), "install", "-q", f"numpy=={numpy}" if numpy else "numpy", "mpi4py>=4",
             "mpich", "pytest", "pytest-mpi", "pytest-timeout", "hypothesis"],
            [os.path.join(bin_dir, "pip"), "install", "-q", "--no-deps", ROOT],
            # pytest's own script, not `python -m pytest`: the installed mpiring, not the checkout's
            [os.path.join(bin_dir, "pytest"), "-q", "-p", "no:cacheprovider", *QUICK_TESTS],
            [os.path.join(bin_dir, "mpiexec"), "-n", "2", os.path.join(bin_dir, "python"), "-c", SMOKE],
        ]
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], MPIEXEC_TIMEOUT="120")
        for step in steps:
            done = run(step, env=env, cwd=ROOT if step[0].endswith("pytest") else folder)
            if done.returncode != 0:
                return False, f"{' '.join(step[:3])}...: {(done.stdout + done.stderr).strip()[-1500:]}"
        lines = (done.stdout.strip().splitlines() or [""])
        return True, lines[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pythons", nargs="+", default=list(OLDEST_NUMPY))
    args = parser.parse_args()
    failed = 0
    for version in args.pythons:
        python = find_python(version)
        if python is None:
            print(f"Python {version}: not found here (not checked)")
            continue
        for numpy in (OLDEST_NUMPY.get(version), None):
            ok, said = check(python, numpy)
            failed += not ok
            print(f"Python {version}, NumPy {numpy or 'newest'}: {'ok' if ok else 'FAILED'}: {said}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
