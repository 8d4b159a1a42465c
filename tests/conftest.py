"""Test harness for MPI runs: a failure on one rank aborts the whole job at once, with its
traceback, instead of leaving the other ranks waiting in a collective for ever.

MPI tests are marked `@pytest.mark.mpi` and run under mpirun at world sizes 1, 2, 3, 4 and 8
(tests/run_world_sizes.py). Hypothesis is derandomized so every rank draws the same cases.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "mpi",
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("mpi")


def _world():
    if "mpi4py.MPI" not in sys.modules and not os.environ.get("PMI_RANK") and not os.environ.get(
        "OMPI_COMM_WORLD_RANK"
    ):
        return None  # a plain pytest run: do not start MPI for the serial tests
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """pytest-mpi prints its MPI information block after every run; tests/run_world_sizes.py sets
    MPIRING_MPI_INFO_SHOWN=1 after the first world size, and later runs leave it out."""
    if os.environ.get("MPIRING_MPI_INFO_SHOWN") == "1":
        for plugin in config.pluginmanager.get_plugins():
            if type(plugin).__name__ == "MPIPlugin":  # its summary hook prints only while this is set
                plugin._is_testing_mpi = False


def pytest_report_header(config):
    world = _world()
    size = world.Get_size() if world is not None else 1
    return f"mpiring: MPI world size {size}"


def pytest_runtest_logreport(report):
    """Abort the job when a test fails on any rank of a multi-rank run (see module docstring)."""
    if not report.failed:
        return
    world = _world()
    if world is None or world.Get_size() == 1:
        return
    sys.stderr.write(
        f"\n[rank {world.Get_rank()}] {report.nodeid} failed in {report.when}; aborting the MPI job\n"
        f"{report.longreprtext}\n"
    )
    sys.stderr.flush()
    world.Abort(1)


@pytest.fixture(scope="session")
def comm():
    """One mpiring communicator shared by every test of the run (creating one is collective)."""
    import mpiring

    return mpiring.Communicator()
