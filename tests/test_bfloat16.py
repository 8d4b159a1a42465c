"""bfloat16 (ml_dtypes) on the host: reductions run in float32 and round once per element, so
they equal the exact sum rounded once (a bfloat16 ring would round at every step); every rank
gets the same bits; data movers carry it as bytes; what cannot take it says so.

This MPI (the MPICH wheel) has no MPI_BFLOAT16_T (mpi4py names it, as a null datatype), so the
oracle is NumPy: float32 sums of inputs chosen so that every float32 sum is exact."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpiring

ml_dtypes = pytest.importorskip("ml_dtypes", reason="pip install ml_dtypes (mpiring's bf16 extra)")
BF16 = np.dtype(ml_dtypes.bfloat16)

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()


def _input(seed: int, rank: int, length: int) -> np.ndarray:
    """bfloat16 values on a 1/64 grid below 16 in magnitude: any float32 sum of 8 of them is exact."""
    values = np.random.default_rng([seed, rank]).integers(-1000, 1000, length) / 64
    return values.astype(BF16)


def _exact(inputs: list[np.ndarray]) -> np.ndarray:
    return np.sum([a.astype(np.float32) for a in inputs], axis=0, dtype=np.float32)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner", "ring_pipelined"])
def test_allreduce_rounds_once_and_agrees_on_every_rank(comm, algorithm):
    for seed, length in enumerate((0, 1, 7, 5000)):
        inputs = [_input(seed, k, length) for k in range(N)]
        got = comm.allreduce(inputs[RANK], algorithm=algorithm)
        assert got.dtype == BF16 and got.shape == (length,)
        want = _exact(inputs).astype(BF16)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (algorithm, length)
        everyone = WORLD.allgather(got.view(np.uint16).tobytes())
        assert len(set(everyone)) == 1, "ranks got different bits"
        mean = comm.allreduce(inputs[RANK], op="avg", algorithm=algorithm)
        assert np.array_equal(mean.view(np.uint16), (_exact(inputs) / N).astype(BF16).view(np.uint16))


def test_one_rounding_is_more_accurate_than_a_bfloat16_ring(comm):
    """1 + many small values: rounding each partial sum to bfloat16 loses the small ones."""
    x = np.full(64, 1.0 if RANK == 0 else 2.0**-9, dtype=BF16)
    got = comm.allreduce(x)
    exact = 1.0 + (N - 1) * 2.0**-9
    stepwise = np.float32(1.0)
    for _ in range(N - 1):
        stepwise = np.float32(BF16.type(stepwise + np.float32(2.0**-9)))  # what a bfloat16 ring computes
    assert abs(float(got[0]) - exact) <= abs(float(stepwise) - exact)
    assert float(got[0]) == float(np.float32(exact).astype(BF16))


@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_reduce_scan_exscan(comm, op):
    inputs = [_input(3, k, 33) for k in range(N)]
    if op == "prod":
        inputs = [np.where(np.abs(a) > 2, 1, a).astype(BF16) for a in inputs]
    ufunc = {"sum": np.add, "max": np.maximum, "prod": np.multiply}[op]

    def wide(arrays):
        result = arrays[0].astype(np.float32)
        for a in arrays[1:]:
            result = ufunc(result, a.astype(np.float32))
        return result

    got = comm.reduce(inputs[RANK], op=op, root=N - 1)
    if RANK == N - 1:
        assert np.array_equal(got.astype(np.float32), wide(inputs).astype(BF16).astype(np.float32))
    else:
        assert got is None
    for algorithm in ("ring", "recursive_doubling"):
        got = comm.scan(inputs[RANK], op=op, algorithm=algorithm)
        assert got.dtype == BF16
        want = wide(inputs[: RANK + 1]).astype(BF16)
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
        got = comm.exscan(inputs[RANK], op=op, algorithm=algorithm)
        if RANK == 0:
            assert got is None
        else:
            np.testing.assert_array_equal(got.astype(np.float32), wide(inputs[:RANK]).astype(BF16).astype(np.float32))


def test_planned_calls_and_out(comm):
    x = np.empty(100, BF16)
    out = np.empty(100, BF16)
    for seed in range(3):  # unplanned, then planned
        inputs = [_input(seed, k, 100) for k in range(N)]
        x[...] = inputs[RANK]
        assert comm.allreduce(x, out=out) is out
        assert np.array_equal(out.view(np.uint16), _exact(inputs).astype(BF16).view(np.uint16))
    assert comm.plan_of("allreduce", x, out) is not None


def test_data_movers_carry_bfloat16(comm):
    x = _input(5, RANK, (2 * N))
    assert comm.allgather(x).dtype == BF16
    assert np.array_equal(comm.alltoall(x).astype(np.float32),
                          np.concatenate([np.split(_input(5, k, 2 * N), N)[RANK] for k in range(N)]).astype(np.float32))
    got = comm.scatter(x if RANK == 0 else None, root=0)  # the header names bfloat16 to every rank
    assert got.dtype == BF16 and np.array_equal(got.view(np.uint16), np.array_split(x if RANK == 0 else
                                                _input(5, 0, 2 * N), N)[RANK].view(np.uint16))


@pytest.mark.parametrize("algorithm", ["ring", "ring_pipelined", "recursive_halving"])
def test_reduce_scatter_rounds_once_with_and_without_counts(comm, algorithm):
    for seed, rows in enumerate((0, N, 3 * N + 1)):
        inputs = [_input(seed, k, rows) for k in range(N)]
        exact = _exact(inputs).astype(BF16).astype(np.float32)  # the exact sum, rounded once
        got = comm.reduce_scatter(inputs[RANK], algorithm=algorithm)
        assert got.dtype == BF16 and np.array_equal(got.astype(np.float32), np.array_split(exact, N)[RANK])
        counts = [rows] + [0] * (N - 1)  # everything to rank 0
        out = np.empty(counts[RANK], BF16)
        comm.reduce_scatter(inputs[RANK], out=out, counts=counts, algorithm=algorithm)
        assert np.array_equal(out.astype(np.float32), exact if RANK == 0 else exact[:0])


def test_what_cannot_take_bfloat16_says_so(comm):
    x = _input(1, RANK, 4)
    with pytest.raises(mpiring.ArgumentTypeError, match="integer or bool"):
        comm.allreduce(x, op="band")
    assert comm.allreduce(np.ones(2)).tolist() == [N, N]
