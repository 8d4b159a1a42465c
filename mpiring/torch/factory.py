"""How torch.distributed makes an mpiring process group (the function the backend registers),
and makes the default group again on the survivors of a lost rank (`shrink_process_group`)."""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch.distributed as dist
from mpi4py import MPI

import mpiring
from mpiring import environment
from mpiring.launch import local_ranks
from mpiring.torch.process_group import ProcessGroupMpiring
from mpiring.torch.progress import wanted
from mpiring.torch.rendezvous import survivors_store

BACKEND = "mpiring"

_world: MPI.Intracomm = MPI.COMM_WORLD  # torch.distributed's world: MPI's, then the survivors' after a shrink
_shrunk: mpiring.Communicator | None = None  # the survivors' communicator, for the next default group
_groups: weakref.WeakSet[ProcessGroupMpiring] = weakref.WeakSet()  # the groups made on _world


def create(options: Any, backend_options: Any = None) -> ProcessGroupMpiring:
    """A process group for torch.distributed's group of `options.global_ranks_in_group` (the
    whole world for the default group), on the matching ranks of MPI's COMM_WORLD (of the
    survivors, after `shrink_process_group`). Collective over the group's ranks, as
    torch.distributed calls it."""
    global _shrunk
    world = _world
    ranks = list(options.global_ranks_in_group)
    timeout = options.timeout.total_seconds() if options.timeout is not None else None
    threaded = wanted()
    busy_poll = False if threaded and not _cores_for_a_spinning_thread() else None
    if not ranks:  # the default group: torch's world must be MPI's (or the survivors')
        if options.group_size != world.Get_size() or options.group_rank != world.Get_rank():
            raise RuntimeError(
                f"mpiring: torch.distributed's world (rank {options.group_rank} of {options.group_size}) is not "
                f"MPI's (rank {world.Get_rank()} of {world.Get_size()}): start the ranks with mpirun (or srun), "
                "which makes them one MPI job, and leave RANK and WORLD_SIZE unset or equal to MPI's")
        # after shrink_process_group, the survivors' communicator is made already
        comm = _shrunk if _shrunk is not None else mpiring.Communicator(world, timeout=timeout, busy_poll=busy_poll)
        _shrunk = None
    else:
        group = world.Get_group().Incl(ranks)
        base = world.Create_group(group)
        group.Free()
        if base.Get_rank() != options.group_rank:
            raise RuntimeError(f"mpiring: torch.distributed's rank {options.group_rank} in this group is MPI's "
                               f"{base.Get_rank()}")
        comm = mpiring.Communicator(base, timeout=timeout, busy_poll=busy_poll)
    made = ProcessGroupMpiring(comm, threaded)
    _groups.add(made)
    return made


def _cores_for_a_spinning_thread() -> bool:
    """Whether a progress thread's waits may spin: MPIRING_BUSY_POLL where set, else where this
    rank has two cores of its machine (as the launcher counts its ranks there), one for the
    caller's own work (the backward pass) and one for the thread. With fewer, spinning would take
    the core that work computes on, so the waits offer it."""
    setting = environment.flag("MPIRING_BUSY_POLL", "mpiring.torch")
    if setting is not None:
        return setting
    return len(os.sched_getaffinity(0)) >= 2 * max(1, local_ranks())


def shrink_process_group() -> dist.ProcessGroup:
    """After a lost rank, the default process group again, on the survivors: call it on every
    survivor once a collective raised `mpiring.RankLostError` (survival on: MPIRING_SURVIVE=1,
    docs/lost-rank.md). It shrinks the default group's communicator (the survivors, in their old
    order, renumbered from 0), destroys every process group (torch.distributed's
    destroy_process_group), frees their communicators, and makes the new default group on the
    survivors, with a key-value store served by its rank 0. Returns the new default group.
    Groups made with `dist.new_group` must be made again. Collective over the survivors."""
    global _world, _shrunk
    old = dist.group.WORLD if dist.is_initialized() else None
    if not isinstance(old, ProcessGroupMpiring):
        raise RuntimeError("mpiring: shrink_process_group() needs a default process group on the mpiring backend "
                           "(dist.init_process_group(\"mpiring\"))")
    comm = old.on_thread(old.comm.shrink)  # the old communicator takes calls from its group's thread only
    dist.destroy_process_group()
    for group in list(_groups):
        group.free()
    _groups.clear()
    _world, _shrunk = comm.mpi, comm
    dist.init_process_group(BACKEND, store=survivors_store(comm.mpi), rank=comm.rank, world_size=comm.size)
    return dist.group.WORLD
