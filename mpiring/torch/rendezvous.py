"""What torch.distributed needs to start under an MPI launcher, from MPI itself.

`dist.init_process_group("mpiring")` rendezvous through env:// by default: RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT, which torchrun sets and mpirun does not. `fill_environment` sets
the missing ones (and LOCAL_RANK, LOCAL_WORLD_SIZE) from MPI, so a program written for torchrun
runs under mpirun unchanged. torch.distributed keeps a small TCP key-value store at
MASTER_ADDR:MASTER_PORT for its own bookkeeping; mpiring's collectives never use it.
`survivors_store` makes that store again on the survivors of a lost rank (whose old store may
have been served by the lost rank).
"""

from __future__ import annotations

import os
import socket

import torch.distributed as dist
from mpi4py import MPI

_LOCAL_RANK = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "SLURM_LOCALID")
_LOCAL_SIZE = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE")


def fill_environment(comm: MPI.Intracomm | None = None) -> None:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT where they
    are not set already. Collective over `comm` (COMM_WORLD) when MASTER_ADDR or MASTER_PORT is
    missing: rank 0 picks a free port and tells the others its host name."""
    comm = MPI.COMM_WORLD if comm is None else comm
    env = os.environ
    env.setdefault("RANK", str(comm.Get_rank()))
    env.setdefault("WORLD_SIZE", str(comm.Get_size()))
    env.setdefault("LOCAL_RANK", next((env[n] for n in _LOCAL_RANK if env.get(n, "").isdigit()), env["RANK"]))
    env.setdefault("LOCAL_WORLD_SIZE", next((env[n] for n in _LOCAL_SIZE if env.get(n, "").isdigit()),
                                            env["WORLD_SIZE"]))
    # the launcher gives every rank the same environment: all ranks take this branch, or none
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return
    host, port = _announce(comm, _free_port() if comm.Get_rank() == 0 else 0)
    env.setdefault("MASTER_ADDR", host)
    env.setdefault("MASTER_PORT", str(port))


def survivors_store(comm: MPI.Intracomm) -> dist.TCPStore:
    """torch.distributed's key-value store for a group on `comm`, served by its rank 0 on a port
    the system picks (collective over `comm`). RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are
    set to `comm`'s, so that the environment describes the world the program now runs in."""
    rank = comm.Get_rank()
    served = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) if rank == 0 else None
    host, port = _announce(comm, served.port if served is not None else 0)
    store = served or dist.TCPStore(host, port, is_master=False, wait_for_workers=False)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(comm.Get_size()), MASTER_ADDR=host, MASTER_PORT=str(port))
    return store


def _announce(comm: MPI.Intracomm, port: int) -> tuple[str, int]:
    """Rank 0's address (127.0.0.1 on its own host) and `port`, on every rank of `comm` (collective)."""
    here = socket.gethostname()
    host, port = comm.bcast((here, port) if comm.Get_rank() == 0 else None, root=0)
    return ("127.0.0.1" if host == here else host), port


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
