"""How to start the benchmark under mpirun with either PyPI MPI wheel (MPICH or Open MPI),
for the tests and scripts/regenerate_benchmarks.py. Pure standard library: the regeneration
script imports it without mpi4py.
"""

from __future__ import annotations

import os

# Open MPI 5 as root, with more ranks than cores, starts fast without the OFI transport. MPICH
# ignores these variables and rejects Open MPI's flags, so variables serve both.
OPEN_MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    "OMPI_MCA_btl": "^ofi",
}


def mpirun_env(timeout_s: int | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for an mpirun: Open MPI's settings, unbuffered output, and with
    `timeout_s` MPIEXEC_TIMEOUT, which makes either MPI kill the whole job after that long."""
    env = dict(os.environ if base is None else base)
    env.update(OPEN_MPI_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    if timeout_s is not None:
        env["MPIEXEC_TIMEOUT"] = str(timeout_s)
    return env


def bench_command(mpirun: str, ranks: int, python: str, args: list[str]) -> list[str]:
    """`mpirun -n RANKS PYTHON -m mpiring.bench ARGS`."""
    return [mpirun, "-n", str(ranks), python, "-m", "mpiring.bench", *args]
