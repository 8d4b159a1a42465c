"""Run pytest on every rank of an MPI job with one readable log: rank 0 prints, the other
ranks' standard output is silenced (their standard error, tracebacks included, still shows).

    mpiexec -n 4 python -m mpi4py tests/mpi_pytest.py --with-mpi -m mpi [pytest args]

Any pytest exit other than "passed" or "no tests" aborts the whole job, so one rank that stops
(a usage error, an internal error, a failing test) never leaves the others waiting.
"""

from __future__ import annotations

import os
import sys

import pytest
from mpi4py import MPI

PASSED, NO_TESTS = 0, 5


def main() -> int:
    world = MPI.COMM_WORLD
    if world.Get_rank() != 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process's stdout, kept open
    code = pytest.main(sys.argv[1:])
    if code not in (PASSED, NO_TESTS) and world.Get_size() > 1:
        sys.stderr.write(f"[rank {world.Get_rank()}] pytest exited with {int(code)}; aborting the MPI job\n")
        sys.stderr.flush()
        world.Abort(int(code) or 1)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
