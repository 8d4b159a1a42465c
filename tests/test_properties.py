"""Property-based cases: hypothesis draws collective, dtype, op, shape and root; every rank
draws the same case (the profile in conftest.py is derandomized) and checks against NumPy on
regenerated inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI
from oracles import DTYPES, all_inputs, assert_same, numpy_reduce, op_valid

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
EXAMPLES = 60 if N < 8 else 25  # 8 ranks share 2 cores here: fewer, same kinds of cases

shapes = st.tuples(st.integers(0, 3 * N + 5), st.sampled_from([(), (1,), (3,), (2, 2)])).map(
    lambda t: (t[0], *t[1])
)
dtype_ops = st.sampled_from([(d, op) for d in DTYPES for op in ("sum", "prod", "min", "max", "avg")
                             if op_valid(op, d)])


@settings(max_examples=EXAMPLES)
@given(case=dtype_ops, shape=shapes, seed=st.integers(0, 2**16))
def test_reductions(comm, case, shape, seed):
    dtype, op = case
    inputs = all_inputs(seed, N, shape, dtype, op)
    total = numpy_reduce(op, inputs)
    assert_same(comm.allreduce(inputs[RANK], op=op), total, f"allreduce {case} {shape}")
    assert_same(comm.reduce_scatter(inputs[RANK], op=op), np.array_split(total, N)[RANK], "reduce_scatter")
    root = seed % N
    got = comm.reduce(inputs[RANK], op=op, root=root)
    if RANK == root:
        assert_same(got, total, "reduce")
    assert_same(comm.allgather(comm.reduce_scatter(inputs[RANK], op=op)), total, "allgather(reduce_scatter)")


@settings(max_examples=EXAMPLES)
@given(dtype=st.sampled_from(DTYPES), rows=st.lists(st.integers(0, 9), min_size=N, max_size=N),
       tail=st.sampled_from([(), (2,), (1, 3)]), seed=st.integers(0, 2**16))
def test_data_movement(comm, dtype, rows, tail, seed):
    blocks = [all_inputs(seed, N, (rows[k], *tail), dtype)[k] for k in range(N)]
    joined = np.concatenate(blocks)
    root = seed % N
    assert_same(comm.allgather(blocks[RANK]), joined, "allgather")
    got = comm.gather(blocks[RANK], root=root)
    if RANK == root:
        assert_same(got, joined, "gather")
    part = comm.scatter(joined if RANK == root else None, root=root)
    assert_same(part, np.array_split(joined, N)[RANK], "scatter")
    assert_same(comm.broadcast(joined if RANK == root else np.empty_like(joined), root=root), joined, "bcast")
