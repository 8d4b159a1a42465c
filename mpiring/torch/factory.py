"""How torch.distributed makes an mpiring process group (the function the backend registers)."""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

import mpiring
from mpiring.torch.process_group import ProcessGroupMpiring

BACKEND = "mpiring"


def create(options: Any, backend_options: Any = None) -> ProcessGroupMpiring:
    """A process group for torch.distributed's group of `options.global_ranks_in_group` (the
    whole world for the default group), on the matching ranks of MPI's COMM_WORLD. Collective
    over the group's ranks, as torch.distributed calls it."""
    world = MPI.COMM_WORLD
    ranks = list(options.global_ranks_in_group)
    if not ranks:  # the default group: torch's world must be MPI's
        if options.group_size != world.Get_size() or options.group_rank != world.Get_rank():
            raise RuntimeError(
                f"mpiring: torch.distributed's world (rank {options.group_rank} of {options.group_size}) is not "
                f"MPI's (rank {world.Get_rank()} of {world.Get_size()}): start the ranks with mpirun (or srun), "
                "which makes them one MPI job, and leave RANK and WORLD_SIZE unset or equal to MPI's")
        base = world
    else:
        group = world.Get_group().Incl(ranks)
        base = world.Create_group(group)
        group.Free()
        if base.Get_rank() != options.group_rank:
            raise RuntimeError(f"mpiring: torch.distributed's rank {options.group_rank} in this group is MPI's "
                               f"{base.Get_rank()}")
    timeout = options.timeout.total_seconds() if options.timeout is not None else None
    return ProcessGroupMpiring(mpiring.Communicator(base, timeout=timeout))
