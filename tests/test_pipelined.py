"""The pipelined rings with segments of a few elements, so that small inputs run every path:
many segments per chunk, a short last segment, empty chunks, a scratch slot reused two steps
later, several collectives in flight. Oracles: the plain ring bit for bit (the pipelined ring
reduces every element in the same order) and NumPy on regenerated inputs."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from oracles import all_inputs, assert_same, numpy_reduce, op_valid

from mpiring.algorithms import reduce_scatter_ring_pipelined

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
LENGTHS = sorted({0, 1, max(N - 1, 0), N + 1, 13, 37, 1001})
DTYPES = [np.dtype(d) for d in ("float32", "float64", "float16", "int32", "uint8", "complex64", "bool")]
CASES = [(d, op) for d in DTYPES for op in ("sum", "prod", "max", "avg") if op_valid(op, d)]


def lengths(segment_bytes: int) -> list[int]:
    """LENGTHS, less the long one with segments of one element: there it is hundreds of messages
    per step for the segment arithmetic the shorter lengths already cut every way."""
    return [n for n in LENGTHS if segment_bytes > 1 or n <= 37]


@pytest.fixture(params=[1, 24, 1000], ids=lambda b: f"segment{b}B")
def segment_bytes(request, monkeypatch):
    """Segments of one element (1 B rounds up), a few elements, and a few hundred."""
    monkeypatch.setattr(reduce_scatter_ring_pipelined, "SEGMENT_BYTES", request.param)
    return request.param


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1]}")
def test_allreduce_pipelined_equals_the_ring(comm, segment_bytes, case):
    dtype, op = case
    for seed, length in enumerate(lengths(segment_bytes)):
        inputs = all_inputs(seed, N, length, dtype, op)
        got = comm.allreduce(inputs[RANK], op=op, algorithm="ring_pipelined")
        ring = comm.allreduce(inputs[RANK], op=op, algorithm="ring")
        assert got.tobytes() == ring.tobytes(), f"{op} {dtype} len {length}: not bitwise the ring's"
        assert_same(got, numpy_reduce(op, inputs), f"allreduce ring_pipelined {op} {dtype} len {length}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1]}")
def test_reduce_scatter_pipelined_equals_the_ring(comm, segment_bytes, case):
    dtype, op = case
    for seed, rows in enumerate(lengths(segment_bytes)):
        inputs = all_inputs(seed, N, (rows, 3), dtype, op)
        got = comm.reduce_scatter(inputs[RANK], op=op, algorithm="ring_pipelined")
        ring = comm.reduce_scatter(inputs[RANK], op=op, algorithm="ring")
        assert got.tobytes() == ring.tobytes(), f"{op} {dtype} rows {rows}: not bitwise the ring's"
        want = np.array_split(numpy_reduce(op, inputs), N)[RANK]
        assert_same(got, want, f"reduce_scatter ring_pipelined {op} {dtype} rows {rows}")


def test_in_place_and_several_in_flight(comm, segment_bytes):
    arrays = [all_inputs(s, N, 500 + 7 * s, np.float64) for s in range(3)]
    requests = [comm.iallreduce(a[RANK], algorithm="ring_pipelined") for a in arrays]
    for a, request in zip(reversed(arrays), reversed(requests), strict=True):
        assert_same(request.wait(), numpy_reduce("sum", a), "iallreduce ring_pipelined")
    x = arrays[0][RANK].copy()
    assert comm.allreduce(x, out=x, algorithm="ring_pipelined") is x
    assert_same(x, numpy_reduce("sum", arrays[0]), "in-place allreduce ring_pipelined")


def test_traffic_is_the_rings(comm, segment_bytes):
    """Same bytes as the plain ring; one message per segment instead of one per chunk."""
    x = all_inputs(5, N, 1001, np.float64)[RANK]
    counts = {}
    for algorithm in ("ring", "ring_pipelined"):
        comm.traffic.reset()
        comm.allreduce(x, algorithm=algorithm)
        counts[algorithm] = (comm.traffic.bytes_sent, comm.traffic.bytes_received, comm.traffic.messages)
    assert counts["ring_pipelined"][:2] == counts["ring"][:2]
    assert counts["ring_pipelined"][2] >= counts["ring"][2]
    if N > 1 and segment_bytes < 1000 * 8 // N:
        assert counts["ring_pipelined"][2] > counts["ring"][2]
