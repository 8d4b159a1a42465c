"""Catch a job whose ranks were started without MPI wiring them together.

A plain `srun python train.py` on a cluster whose Slurm has `MpiDefault=none` (a common default)
starts every task as its own one-rank MPI job: each "rank" is rank 0 of 1, trains alone, writes
the same files, and the job exits 0. The same happens under an `mpirun` from a different MPI than
the one mpi4py loaded. Nothing in MPI reports it, but the launcher announced how many processes it
started, so the world size can be checked against that.

What each launcher announces to the processes it starts (measured with Slurm 22.05 and the MPICH
5.0 hydra; see tests/test_slurm.py):

| launch | PMI_SIZE | OMPI_COMM_WORLD_SIZE | SLURM_STEP_NUM_TASKS |
| --- | --- | --- | --- |
| `srun --mpi=pmi2 -n 4` | 4 | - | 4 |
| plain `srun -n 4` (`MpiDefault=none`) | - | - | 4 (but world size 1) |
| `mpirun -n 4` (MPICH hydra, Intel MPI) | 4 | - | - |
| `mpirun -n 4` inside a 2-node allocation | 4 | - | 2 (hydra's proxies, one per node) |
| `mpirun -n 4` (Open MPI) | - | 4 | as for hydra |
| `python x.py` in the batch script | - | - | - (no step) |

So the launcher that started the process speaks first (PMI_SIZE, OMPI_COMM_WORLD_SIZE), because a
launcher's own size is right even where Slurm's step counts its proxies; Slurm's step size counts
only when no MPI launcher spoke. SLURM_NTASKS alone is never used: in the batch script it is the
allocation's size, though a process started there is a legitimate singleton.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from mpiring import environment
from mpiring.errors import MpiringError

SKIP_VARIABLE = "MPIRING_SKIP_LAUNCH_CHECK"

# Launcher variables in order of authority: MPI launchers first, Slurm's job step last. Only an
# srun step sets SLURM_STEP_ID, and SLURM_STEP_NUM_TASKS is that step's task count.
_MPI_LAUNCHER_SIZES = (
    ("PMI_SIZE", "the PMI process manager (srun --mpi=pmi2, MPICH's or Intel MPI's mpirun)"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
)
_SLURM_STEP_SIZE = ("SLURM_STEP_NUM_TASKS", "srun (this Slurm job step)")

HOW_TO_LAUNCH = (
    "Launch the ranks so that MPI joins them into one job: inside Slurm use `srun --mpi=pmi2 ...` "
    "(MPICH, Intel MPI) or `srun --mpi=pmix ...` (Open MPI; `srun --mpi=list` shows what your "
    "Slurm offers), or `mpirun -n N ...` from the same MPI that mpi4py uses "
    "(`python -c \"from mpi4py import MPI; print(MPI.Get_library_version())\"` names it). "
    "slurm/README.md explains each. "
    f"Set {SKIP_VARIABLE}=1 to skip this check if the independent one-rank runs are intended."
)


class LaunchError(MpiringError):
    """MPI's world size is not the number of processes the launcher says it started."""


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None


def launcher_world_size(environ: Mapping[str, str] | None = None) -> tuple[int, str, str] | None:
    """The number of processes the launcher of this process announced, if any.

    Returns (size, variable, who set it), or None outside any launcher that announces a size
    (a plain `python x.py`, or the batch script of a Slurm job).
    """
    env = os.environ if environ is None else environ
    for variable, who in _MPI_LAUNCHER_SIZES:
        size = _positive_int(env.get(variable))
        if size is not None:
            return size, variable, who
    if "SLURM_STEP_ID" in env:
        variable, who = _SLURM_STEP_SIZE
        size = _positive_int(env.get(variable))
        if size is not None:
            return size, variable, who
    return None


def check_world_size(world_size: int, environ: Mapping[str, str] | None = None) -> None:
    """Raise LaunchError when `world_size` disagrees with the size the launcher announced.

    Call it with COMM_WORLD's size on every rank. Does nothing when no launcher announced a size,
    or when MPIRING_SKIP_LAUNCH_CHECK is yes (1, true, yes, on: mpiring.environment's rule).
    """
    env = os.environ if environ is None else environ
    if environment.yes_no(env.get(SKIP_VARIABLE, "").strip(), SKIP_VARIABLE, "Communicator"):
        return
    announced = launcher_world_size(env)
    if announced is None or announced[0] == world_size:
        return
    size, variable, who = announced
    if world_size == 1:
        problem = (
            f"{who} started {size} processes ({variable}={size}), but this one is an MPI job of its "
            "own (world size 1): every process is running alone as rank 0 of 1. This is what a plain "
            "`srun` does on a Slurm whose MpiDefault is none, and what an mpirun from another MPI "
            "than mpi4py's does."
        )
    else:
        problem = (
            f"MPI's world size is {world_size}, but {who} started {size} processes "
            f"({variable}={size}): the processes were not joined into one MPI job."
        )
    raise LaunchError(f"mpiring: {problem} {HOW_TO_LAUNCH}")


# How many ranks a launcher put on this node: MPICH's Hydra, Open MPI, Slurm's srun.
_LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def share_cores_among_local_ranks(environ: dict[str, str] | None = None, cores: int | None = None) -> None:
    """Give each rank's BLAS and OpenMP its share of this node's cores (at least one thread).

    A thread pool as large as the node in every rank oversubscribes the cores many times over
    (eight ranks on two cores crawl). Only under a launcher that says how many ranks share the
    node, only for variables not already set, and only effective before NumPy is imported:
    `import mpiring` calls it first thing.
    """
    env = os.environ if environ is None else environ
    local = local_ranks(env)
    if local < 1:
        return
    share = str(max(1, (cores or os.cpu_count() or 1) // local))
    for name in _THREAD_VARIABLES:
        env.setdefault(name, share)


def local_ranks(environ: dict[str, str] | None = None) -> int:
    """How many ranks the launcher put on this node, as it tells them (0: it does not say)."""
    env = os.environ if environ is None else environ
    return next((int(env[name]) for name in _LOCAL_SIZE_VARIABLES if env.get(name, "").isdigit()), 0)


def launcher_rank() -> int:
    """This process's rank as the launcher tells it, before MPI starts (0 outside mpirun)."""
    for variable in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return 0


class RankZeroArgumentParser(argparse.ArgumentParser):
    """argparse that speaks only on rank 0: under mpirun every rank parses the same flags (and
    exits on an error), one prints."""

    def _print_message(self, message: str, file=None) -> None:  # noqa: ANN001 - argparse's signature
        if launcher_rank() == 0:
            super()._print_message(message, file)
