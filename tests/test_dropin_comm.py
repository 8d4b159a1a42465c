"""mpiring.dropin: a whole mpi4py communicator whose buffer collectives are mpiring's. Its
uppercase collectives against NumPy on regenerated inputs, counted by mpiring's traffic (so not
run by MPI's own); everything else is mpi4py's (point-to-point, pickled objects, communicators
made from it, which are drop-ins too). tests/test_package.py runs a program written for mpi4py
unchanged under `python -m mpiring.dropin`."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from oracles import all_inputs, assert_same, rank_input

import mpiring
from mpiring.dropin import Intracomm

pytestmark = pytest.mark.mpi

N, RANK = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()


@pytest.fixture
def comm():
    dropin = Intracomm(MPI.COMM_WORLD).Dup()
    yield dropin
    dropin.Free()


def test_it_is_mpi4pys_communicator_over_the_same_ranks(comm):
    assert isinstance(comm, MPI.Intracomm) and isinstance(comm, Intracomm)
    assert (comm.Get_rank(), comm.Get_size()) == (RANK, N)
    assert MPI.Comm.Compare(comm, MPI.COMM_WORLD) == MPI.CONGRUENT
    assert Intracomm(MPI.COMM_WORLD) == MPI.COMM_WORLD  # the same MPI communicator, not a copy


def test_buffer_collectives_run_on_mpiring(comm):
    x = rank_input(1, RANK, (5,), "float64")
    total = np.empty(5)
    comm.Allreduce(x, total, op=MPI.SUM)
    assert_same(total, np.sum(all_inputs(1, N, (5,), "float64"), axis=0), "Allreduce")
    served = comm.served()
    assert isinstance(served, mpiring.Communicator)
    messages = served.traffic.messages
    joined = np.empty(5 * N)
    comm.Allgather(x, joined)
    assert_same(joined, np.concatenate(all_inputs(1, N, (5,), "float64")), "Allgather")
    assert served.traffic.messages > messages or N == 1
    request = comm.Iallreduce(MPI.IN_PLACE, total, MPI.MAX)
    request.Wait()
    assert_same(total, np.sum(all_inputs(1, N, (5,), "float64"), axis=0), "Iallreduce")  # max of equal totals
    comm.Barrier()


def test_the_rest_is_mpi4pys(comm):
    assert comm.bcast({"rank": RANK}, root=0) == {"rank": 0}
    assert comm.allreduce(RANK) == sum(range(N))  # the pickle-based lowercase API
    assert comm.allgather(RANK) == list(range(N))
    if N > 1:
        buf = np.empty(3)
        if RANK == 0:
            comm.Send(np.arange(3.0), dest=1, tag=7)
        elif RANK == 1:
            comm.Recv(buf, source=0, tag=7)
            assert_same(buf, np.arange(3.0), "Recv")
        got = comm.sendrecv(RANK, dest=(RANK + 1) % N, source=(RANK - 1) % N)
        assert got == (RANK - 1) % N
    group = comm.Get_group()
    assert group.Get_size() == N
    group.Free()


@pytest.mark.parametrize("make", ["Dup", "Split", "Split_type", "Create", "Create_group"])
def test_communicators_made_from_it_are_drop_ins(comm, make):
    group = comm.Get_group()
    made = {
        "Dup": lambda: comm.Dup(),
        "Split": lambda: comm.Split(RANK % 2, RANK),
        "Split_type": lambda: comm.Split_type(MPI.COMM_TYPE_SHARED),
        "Create": lambda: comm.Create(group),
        "Create_group": lambda: comm.Create_group(group),
    }[make]()
    group.Free()
    assert isinstance(made, Intracomm)
    x = np.full(2, float(RANK))
    out = np.empty(2)
    made.Allreduce(x, out)
    assert_same(out, np.full(2, float(made.allreduce(RANK))), make)  # oracle: mpi4py's pickled allreduce
    made.Free()
    assert made == MPI.COMM_NULL
