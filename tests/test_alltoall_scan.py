"""All-to-all, all-to-all-v, scan and exscan: every algorithm against NumPy on inputs every
rank regenerates and against mpi4py's native collective, with every op and several dtypes,
uneven and empty blocks; their nonblocking and persistent forms; bad input."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from mpi4py import MPI
from oracles import (
    DTYPES,
    assert_same,
    native_scan,
    numpy_reduce,
    op_cases,
    rank_input,
)

import mpiring
from mpiring.algorithms import ALGORITHMS

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
BIG = 70_001  # float64 elements: past the eager limits, and two segments of the scan chain at p > 2
SCAN_LENGTHS = (0, 1, N + 1, 37)
OP_CASES = op_cases(N)


def _case_id(case) -> str:
    return f"{case[0].name}-{case[1]}"


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


# ---- all-to-all ---------------------------------------------------------------------------


def _native_alltoallv(x: np.ndarray, send: list[int], receive: list[int]) -> np.ndarray:
    row = x[0].nbytes if len(x) else int(np.prod(x.shape[1:], dtype=np.int64)) * x.itemsize
    out = np.empty((sum(receive), *x.shape[1:]), x.dtype)
    WORLD.Alltoallv([_bytes(x), [n * row for n in send], MPI.BYTE], [_bytes(out), [n * row for n in receive], MPI.BYTE])
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("algorithm", list(ALGORITHMS["alltoall"]))
def test_alltoall(comm, dtype, algorithm):
    for seed, rows in enumerate((0, 1, 3)):  # rows per block
        inputs = [rank_input(seed, k, (N * rows, 2), dtype) for k in range(N)]
        got = comm.alltoall(inputs[RANK], algorithm=algorithm)
        want = np.concatenate([np.split(inputs[k], N)[RANK] for k in range(N)])
        assert_same(got, want, f"alltoall {algorithm} {dtype} rows {rows}")
        assert_same(got, _native_alltoallv(inputs[RANK], [rows] * N, [rows] * N), f"alltoall {dtype} vs MPI")


@pytest.mark.parametrize("algorithm", list(ALGORITHMS["alltoall"]))
def test_alltoall_large_and_into_out(comm, algorithm):
    x = rank_input(5, RANK, N * BIG, np.float64)
    out = np.full_like(x, np.nan)
    got = comm.alltoall(x, out=out, algorithm=algorithm)
    native = np.empty_like(x)
    WORLD.Alltoall(x, native)
    assert got is out
    assert_same(got, native, f"alltoall {algorithm} large vs MPI")
    x3 = rank_input(6, RANK, (N, 4, 5), np.int16)  # one row of shape (4, 5) per rank
    native = np.empty_like(x3)
    WORLD.Alltoall(x3, native)
    assert_same(comm.alltoall(x3, algorithm=algorithm), native, f"alltoall {algorithm} 3-d")


@pytest.mark.parametrize("algorithm", list(ALGORITHMS["alltoall"]))
def test_alltoall_in_place_against_mpi(comm, algorithm):
    """out is x (MPI_IN_PLACE): pairwise exchanges each block in place through one block of
    scratch, any other algorithm runs on a copy; recorded and replayed with new contents, and
    every size of block, large ones too."""
    for seed, rows in enumerate((1, 3, 0, BIG // N, 3)):  # the last: its schedule replayed
        x = rank_input(seed, RANK, (N * rows, 2), np.float64)
        native = x.copy()
        WORLD.Alltoall(MPI.IN_PLACE, native)
        assert comm.alltoall(x, out=x, algorithm=algorithm) is x
        assert_same(x, native, f"alltoall {algorithm} in place, rows {rows}")


@pytest.mark.parametrize("algorithm", list(ALGORITHMS["alltoallv"]))
def test_alltoallv_in_place_against_mpi(comm, algorithm):
    """alltoallv with out x (counts the same both ways, as MPI_IN_PLACE has them): uneven blocks,
    empty ones included, against MPI's in-place all-to-all-v."""
    for seed in range(4):
        counts = [(RANK + b + seed) % 3 for b in range(N)]  # rank a's count for b is b's for a
        x = rank_input(seed, RANK, (sum(counts), 2), np.float64)
        native = x.copy()
        row = 2 * 8
        WORLD.Alltoallv(MPI.IN_PLACE, [_bytes(native), [n * row for n in counts], MPI.BYTE])
        assert comm.alltoallv(x, counts, counts, out=x, algorithm=algorithm) is x
        assert_same(x, native, f"alltoallv {algorithm} in place, seed {seed}")


def _sends(a: int, b: int, seed: int) -> int:
    """Rows rank a sends rank b: uneven, often none."""
    return (a + 2 * b + seed) % 4


@pytest.mark.parametrize("dtype", [np.dtype(d) for d in ("bool", "int8", "uint32", "float16", "complex128")], ids=str)
@pytest.mark.parametrize("given", [False, True], ids=["exchanged", "given"])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS["alltoallv"]))
def test_alltoallv(comm, dtype, given, algorithm):
    for seed in range(3):
        send = [_sends(RANK, b, seed) for b in range(N)]
        receive = [_sends(a, RANK, seed) for a in range(N)]
        inputs = [rank_input(seed, k, (sum(_sends(k, b, seed) for b in range(N)), 3), dtype) for k in range(N)]
        got = comm.alltoallv(inputs[RANK], send, receive if given else None, algorithm=algorithm)
        # rank k's rows for this rank start after those it sends the ranks before it
        pieces = []
        for k in range(N):
            start = sum(_sends(k, b, seed) for b in range(RANK))
            pieces.append(inputs[k][start : start + _sends(k, RANK, seed)])
        assert_same(got, np.concatenate(pieces), f"alltoallv {algorithm} {dtype} seed {seed}")
        assert_same(got, _native_alltoallv(inputs[RANK], send, receive), f"alltoallv {algorithm} {dtype} vs MPI")


def test_alltoallv_large_and_all_empty(comm):
    send = [BIG + b if b != RANK else 0 for b in range(N)]
    receive = [BIG + RANK if a != RANK else 0 for a in range(N)]
    x = rank_input(3, RANK, sum(send), np.float64)
    out = np.empty(sum(receive))
    assert comm.alltoallv(x, send, out=out) is out
    assert_same(out, _native_alltoallv(x, send, receive), "alltoallv large")
    empty = np.empty((0, 2), np.int32)
    assert_same(comm.alltoallv(empty, [0] * N), empty, "alltoallv nothing at all")
    assert_same(comm.alltoallv(empty, [0] * N, [0] * N), empty, "alltoallv nothing at all, counts given")


# ---- scan and exscan -----------------------------------------------------------------------


@pytest.mark.parametrize("case", OP_CASES, ids=_case_id)
@pytest.mark.parametrize("algorithm", list(ALGORITHMS["scan"]))
def test_scan_and_exscan(comm, case, algorithm):
    dtype, op = case
    for seed, length in enumerate(SCAN_LENGTHS):
        inputs = [rank_input(seed, k, (length, 2), dtype, op) for k in range(N)]
        got = comm.scan(inputs[RANK], op=op, algorithm=algorithm)
        assert_same(got, numpy_reduce(op, inputs[: RANK + 1]), f"scan {algorithm} {op} {dtype} len {length}")
        native = native_scan(inputs[RANK], op, exclusive=False)
        if native is not None:
            assert_same(got, native, f"scan {op} {dtype} len {length} vs MPI")
        got = comm.exscan(inputs[RANK], op=op, algorithm=algorithm)
        if RANK == 0:
            assert got is None
        else:
            assert_same(got, numpy_reduce(op, inputs[:RANK]), f"exscan {algorithm} {op} {dtype} len {length}")
        native = native_scan(inputs[RANK], op, exclusive=True)
        if native is not None:
            assert_same(got, native, f"exscan {op} {dtype} len {length} vs MPI")


@pytest.mark.parametrize("algorithm", list(ALGORITHMS["scan"]))
def test_scan_large(comm, algorithm):
    for dtype, op in ((np.float64, "sum"), (np.int32, "bxor")):
        inputs = [rank_input(8, k, BIG, dtype, op) for k in range(N)]
        out = np.empty(BIG, dtype)
        assert comm.scan(inputs[RANK], op=op, out=out, algorithm=algorithm) is out
        assert_same(out, numpy_reduce(op, inputs[: RANK + 1]), f"scan {algorithm} {dtype} large")
        got = comm.exscan(inputs[RANK], op=op, algorithm=algorithm)
        assert (got is None) if RANK == 0 else np.array_equal(got, numpy_reduce(op, inputs[:RANK]))


@pytest.mark.parametrize("algorithm", list(ALGORITHMS["scan"]))
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_scan_and_exscan_in_place(comm, algorithm, op):
    """out is x (MPI_IN_PLACE): the chain and recursive doubling read each element of x before
    they write it, the others run on a copy; every length, large ones in segments, recorded and
    replayed, against the oracle (and exscan's rank 0 keeps what it held)."""
    for seed, length in enumerate((*SCAN_LENGTHS, BIG, 37)):
        inputs = [rank_input(seed, k, length, np.float64, op) for k in range(N)]
        x = inputs[RANK].copy()
        assert comm.scan(x, op=op, out=x, algorithm=algorithm) is x
        assert_same(x, numpy_reduce(op, inputs[: RANK + 1]), f"scan {algorithm} {op} in place, length {length}")
        x = inputs[RANK].copy()
        got = comm.exscan(x, op=op, out=x, algorithm=algorithm)
        want = inputs[0] if RANK == 0 else numpy_reduce(op, inputs[:RANK])
        assert (got is None) if RANK == 0 else (got is x)
        assert_same(x, want, f"exscan {algorithm} {op} in place, length {length}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scan_rounding_orders(comm, dtype):
    """Random floats: the chain reduces left to right, bitwise as a rank-ordered cumulative
    reduction; recursive doubling groups by halves, so it may differ in the last bits only."""
    inputs = [np.random.default_rng([77, k]).standard_normal(1000).astype(dtype) for k in range(N)]
    linear = functools.reduce(np.add, inputs[: RANK + 1])
    tolerance = dict(rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5 if dtype == np.float32 else 1e-12)
    chain = comm.scan(inputs[RANK], algorithm="ring")
    assert_same(chain, np.cumsum(np.stack(inputs[: RANK + 1]), axis=0, dtype=dtype)[-1], "chain = cumsum")
    assert_same(chain, linear, "chain = rank-ordered reduction")
    doubling = comm.scan(inputs[RANK], algorithm="recursive_doubling")
    np.testing.assert_allclose(doubling, linear, **tolerance)
    assert WORLD.allreduce(int(np.array_equal(chain, doubling)), MPI.MIN) in (0, 1)  # either may hold


# ---- nonblocking and persistent ------------------------------------------------------------


def test_nonblocking_forms_in_flight_together(comm):
    x = rank_input(1, RANK, (2 * N, 3), np.int64)
    send = [_sends(RANK, b, 1) for b in range(N)]
    xv = rank_input(2, RANK, (sum(send), 2), np.float32)
    y = rank_input(3, RANK, 11, np.float64)
    requests = [comm.ialltoall(x), comm.ialltoallv(xv, send), comm.ialltoallv(xv, send, [_sends(a, RANK, 1)
                for a in range(N)]), comm.iscan(y, op="max"), comm.iexscan(y)]
    results = [r.wait() for r in reversed(requests)][::-1]  # waited for in the opposite order
    assert_same(results[0], comm.alltoall(x), "ialltoall")
    assert_same(results[1], comm.alltoallv(xv, send), "ialltoallv")
    assert_same(results[2], results[1], "ialltoallv, counts given")
    assert_same(results[3], comm.scan(y, op="max"), "iscan")
    blocking = comm.exscan(y)
    assert (results[4] is None and blocking is None) if RANK == 0 else np.array_equal(results[4], blocking)


def test_persistent_forms_started_many_times(comm):
    x, y = np.empty((N, 2)), np.empty(9, np.int32)
    send = [_sends(RANK, b, 0) for b in range(N)]
    receive = [_sends(a, RANK, 0) for a in range(N)]
    xv = np.empty((sum(send), 2))
    requests = {
        "alltoall": comm.alltoall_init(x, out=np.empty_like(x)),
        "alltoallv": comm.alltoallv_init(xv, send, receive, out=np.empty((sum(receive), 2))),
        "alltoallv exchanged": comm.alltoallv_init(xv, send),
        "scan": comm.scan_init(y, op="bor", out=np.empty_like(y)),
        "exscan": comm.exscan_init(y, op="sum"),
    }
    for seed in range(3):
        x[...] = rank_input(seed, RANK, x.shape, x.dtype)
        xv[...] = rank_input(seed, RANK, xv.shape, xv.dtype)
        y[...] = rank_input(seed, RANK, y.shape, y.dtype)
        expected = {"alltoall": comm.alltoall(x.copy()), "alltoallv": comm.alltoallv(xv.copy(), send),
                    "scan": comm.scan(y.copy(), op="bor"), "exscan": comm.exscan(y.copy())}
        expected["alltoallv exchanged"] = expected["alltoallv"]
        for name, request in requests.items():
            request.start()
            got = request.wait()
            if expected[name] is None:
                assert got is None, name
            else:
                assert_same(got, expected[name], f"persistent {name} start {seed}")
    for request in requests.values():
        request.free()


# ---- bad input -----------------------------------------------------------------------------


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
def test_alltoallv_counts_that_do_not_fit_raise_on_every_rank(comm):
    x = np.zeros((N, 2))
    wrong_rows = np.zeros((N + 1 if RANK == 0 else N, 2))  # rank 0's out= has a row too many
    with pytest.raises(mpiring.ArgumentError, match="rows on rank 0"):
        comm.alltoallv(x, [1] * N, out=wrong_rows)
    y = np.zeros((N, 2 if RANK == 0 else 3))
    with pytest.raises(mpiring.CollectiveMismatchError, match="dtype or row shape"):
        comm.alltoallv(y, [1] * N)
    fresh = mpiring.Communicator()  # a given recv_counts that its peer does not send breaks that rank
    raised = 0
    try:
        fresh.alltoallv(x, [1] * N, [2 if a == (RANK + 1) % N else 1 for a in range(N)], timeout=10)
    except (mpiring.CommunicationError, mpiring.CollectiveTimeout):
        raised = 1
    assert WORLD.allreduce(raised) >= 1
    WORLD.Barrier()
    assert comm.alltoall(np.arange(N)).tolist() == [RANK] * N
