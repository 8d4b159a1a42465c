"""The scratch pool (Ring.scratch, mpiring.engine.scratch), serially: bounded in bytes
(MPIRING_SCRATCH_BYTES) and released by free()."""

from __future__ import annotations

import pytest
from mpi4py import MPI

import mpiring
from mpiring.backend import NUMPY


def test_the_pool_keeps_at_most_its_bytes_and_free_lets_go(monkeypatch):
    monkeypatch.setenv("MPIRING_SCRATCH_BYTES", str(1 << 20))
    comm = mpiring.Communicator(MPI.COMM_SELF)
    ring = comm._ring
    assert ring.scratch_pool.limit == 1 << 20
    for nbytes in (300_000, 400_000, 500_000, 2_000_000):  # the last is over the bound: never pooled
        with ring.scratch(NUMPY, nbytes, "uint8") as buffer:
            buffer[:] = 1
    pool = ring.scratch_pool._spare[NUMPY.name]
    assert pool and sum(b.nbytes for b in pool) <= 1 << 20 and max(b.nbytes for b in pool) == 500_000
    with ring.scratch(NUMPY, 100_000, "uint8") as buffer:  # reuses the smallest that fits
        assert buffer.base is not None and buffer.base.nbytes in (300_000, 400_000)
    comm.free()
    assert not ring.scratch_pool._spare


def test_the_bound_must_be_a_positive_number_of_bytes(monkeypatch):
    monkeypatch.setenv("MPIRING_SCRATCH_BYTES", "lots")
    with pytest.raises(mpiring.ArgumentError, match="MPIRING_SCRATCH_BYTES"):
        mpiring.Communicator(MPI.COMM_SELF)
