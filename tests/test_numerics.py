"""Numerical edge cases against native MPI (and NumPy where MPI has no type: float16, bool ops):
NaN and Inf propagate, signed zeros, integer overflow wraps as in NumPy, empty arrays; every
collective, every op and every algorithm.

Inputs are chosen so the result does not depend on the order of the reduction (sums of
quarters, products of powers of two, specials that absorb everything), so mpiring, MPI and NumPy,
which all reduce in different orders, must agree exactly. Two differences from MPICH are
inherent and pinned down here (docs/reliability.md):

- min/max with a NaN: mpiring uses numpy.minimum/maximum, which return NaN whenever either
  side is NaN, on every rank and every algorithm. MPICH's MPI_MIN/MPI_MAX are C comparisons
  (a < b ? a : b), which drop or keep the NaN depending on which operand it is, so its result
  depends on the rank order and even on the element's position in the buffer.
- min/max of -0.0 and +0.0 (equal values): both libraries may return either zero; the sign
  of a zero result of min/max is not specified (the values compare equal).
- The sign of a zero real or imaginary part of a complex product depends on the order of the
  multiplications (0*y - x*0 ...), which differs between algorithms and libraries: equal values,
  possibly different zero signs. (Real sums and products have order-free zero signs.)

NaN payloads and signs after arithmetic are not compared (x86 makes its own default NaN);
data-moving collectives must move every bit, NaN payloads and -0.0 included.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from oracles import NATIVE_OPS, native_reduction, numpy_reduce

import mpiring
from mpiring.algorithms import ALGORITHMS
from mpiring.engine.partition import split_bounds

# NumPy warns ("invalid value encountered in add") when arithmetic makes a NaN; so does mpiring's
# reduction, which is NumPy's arithmetic (docs/reliability.md). Here the NaNs are the point.
pytestmark = [pytest.mark.mpi, pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
INF, NAN = np.inf, np.nan

FLOATS = [np.dtype(d) for d in ("float16", "float32", "float64", "complex64", "complex128")]
INTEGERS = [np.dtype(d) for d in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")]
REDUCTIONS = ["allreduce", "reduce", "reduce_scatter"]
LENGTH = 6 * N + 5  # uneven chunks for every algorithm

# What each rank may hold in one element, per op: results stay exact in every order.
PALETTES = {
    "sum": [NAN, INF, -INF, -0.0, 0.0, 1.5, -2.0, 0.25],
    "avg": [NAN, INF, -INF, -0.0, 0.0, 1.5, -2.0, 0.25],
    "prod": [NAN, INF, -INF, -0.0, 0.0, 1.0, -2.0, 0.5],
    "min": [NAN, INF, -INF, -0.0, 0.0, 1.5, -2.0, 0.25],
    "max": [NAN, INF, -INF, -0.0, 0.0, 1.5, -2.0, 0.25],
}
WEIGHTS = [0.04, 0.04, 0.04, 0.2, 0.1, 0.2, 0.2, 0.18]
# Complex products of zeros and infinities depend on the order (the sign of 0*x - 0*y):
# complex prod gets NaN and exact finite values only.
COMPLEX_PROD = [NAN, 1.0, -1.0, 2.0, 0.5]


def _algorithms(collective: str) -> list[str]:
    return ["auto", *ALGORITHMS[collective]]


def _valid(op: str, dtype: np.dtype) -> bool:
    return not (op in ("min", "max") and dtype.kind == "c")


def special_inputs(op: str, dtype: np.dtype, seed: int = 0) -> list[np.ndarray]:
    """Every rank's input (regenerable on any rank): random specials, then fixed patterns.

    Fixed elements: 0 all -0.0; 1 NaN on rank 0 only; 2 +Inf on rank 0 and -Inf on the last;
    3 +Inf everywhere; 4 -0.0 everywhere but +0.0 on the last rank; 5 NaN on the last rank only.
    """
    rng = np.random.default_rng([seed, 4711])
    palette = np.asarray(COMPLEX_PROD if dtype.kind == "c" and op == "prod" else PALETTES[op])
    weights = None if len(palette) != len(WEIGHTS) else WEIGHTS
    values = palette[rng.choice(len(palette), size=(N, LENGTH), p=weights)]
    if dtype.kind == "c":  # an independent imaginary part (1j * inf would make a NaN real part)
        imaginary = palette[rng.choice(len(palette), size=(N, LENGTH), p=weights)]
        values = values.astype(np.complex128)
        values.imag = imaginary
    values = values.astype(dtype)
    if not (dtype.kind == "c" and op == "prod"):
        values[:, 0] = -0.0
        values[:, 1] = 1.0
        values[0, 1] = NAN
        values[:, 2] = 1.0
        values[0, 2] = INF
        values[N - 1, 2] = -INF if N > 1 else INF
        values[:, 3] = INF
        values[:, 4] = -0.0
        values[N - 1, 4] = 0.0
        values[:, 5] = 1.0
        values[N - 1, 5] = NAN
    return [values[k].copy() for k in range(N)]


def _nan(x: np.ndarray) -> np.ndarray:
    return np.isnan(x)


def assert_exact(got: np.ndarray, want: np.ndarray, what: str, zero_sign: bool = True) -> None:
    """Same dtype and shape, NaN in the same places, the other values equal, and (unless told
    otherwise) zeros of the same sign."""
    same = got.dtype == want.dtype and got.shape == want.shape
    assert same, f"{what}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
    assert np.array_equal(_nan(got), _nan(want)), f"{what}: NaN at {np.flatnonzero(_nan(got) != _nan(want))}"
    ok = ~_nan(want)
    assert np.array_equal(got[ok], want[ok]), f"{what}: values differ\n got {got}\nwant {want}"
    if zero_sign:
        parts = (got.real, want.real, got.imag, want.imag) if got.dtype.kind == "c" else (got, want, None, None)
        for g, w in zip(parts[::2], parts[1::2], strict=True):
            if g is not None:
                assert np.array_equal(np.signbit(g[ok]), np.signbit(w[ok])), f"{what}: sign of zero differs"


def _mine(collective: str, whole: np.ndarray) -> np.ndarray:
    """This rank's part of a full-length result (reduce_scatter keeps part RANK)."""
    if collective != "reduce_scatter":
        return whole
    bounds = split_bounds(whole.shape[0], N)
    return whole[bounds[RANK] : bounds[RANK + 1]]


def _run(comm, collective: str, x: np.ndarray, op: str, root: int, algorithm: str):
    if collective == "reduce":
        return comm.reduce(x, op=op, root=root, algorithm=algorithm)
    return getattr(comm, collective)(x, op=op, algorithm=algorithm)


FLOAT_CASES = [(d, op) for d in FLOATS for op in PALETTES if _valid(op, d)]


@pytest.mark.parametrize("collective", REDUCTIONS)
@pytest.mark.parametrize(("dtype", "op"), FLOAT_CASES, ids=[f"{d.name}-{op}" for d, op in FLOAT_CASES])
def test_nan_inf_and_signed_zeros_propagate_as_in_numpy_and_mpi(comm, collective, dtype, op):
    inputs = special_inputs(op, dtype)
    want = _mine(collective, numpy_reduce(op, inputs))
    root = N - 1
    # see the module docstring: zero signs of min/max, and of complex products, hang on the order
    exact_zeros = op not in ("min", "max") and not (dtype.kind == "c" and op == "prod")
    native = native_reduction(collective, inputs[RANK], op, root)  # collective: on every rank
    for algorithm in _algorithms(collective):
        what = f"{collective} {op} {dtype} ({algorithm})"
        got = _run(comm, collective, inputs[RANK], op, root, algorithm)
        if collective == "reduce" and RANK != root:
            assert got is None
            continue
        assert_exact(got, want, what + " vs NumPy", zero_sign=exact_zeros)
        if native is None:
            continue
        if op in ("min", "max"):
            # MPICH keeps a NaN only sometimes; mpiring always. Where MPI has NaN, so does
            # mpiring; where neither has, the values agree.
            assert np.all(_nan(got)[_nan(native)]), what
            both = ~_nan(got) & ~_nan(native)
            assert np.array_equal(got[both], native[both]), what
        else:
            assert_exact(got, native, what + " vs MPI", zero_sign=exact_zeros)


def test_nan_in_min_max_differs_from_mpich_as_documented(comm):
    """Pin down the documented difference: one NaN on rank 0 against numbers elsewhere."""
    if N < 2:
        pytest.skip("needs a NaN on one rank and a number on another")
    x = np.full(4, NAN if RANK == 0 else float(RANK))
    for op in ("min", "max"):
        got = comm.allreduce(x, op=op)
        assert np.isnan(got).all(), f"mpiring {op} must propagate NaN like numpy.{op}imum"


@pytest.mark.parametrize("collective", REDUCTIONS)
@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: d.name)
def test_integer_overflow_wraps_as_in_numpy_and_mpi(comm, collective, dtype):
    """Sums and products of extremes wrap modulo 2**bits (the same in any order); min/max are exact."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng([7, dtype.num])
    palette = np.array([info.max, info.min, info.max // 2 + 1, 1, 0, info.max - 1, 3], dtype=object)
    inputs = [palette[rng.integers(0, len(palette), LENGTH)].astype(dtype) for _ in range(N)]
    for k in range(N):  # element 0: max on every rank, so any two ranks overflow
        inputs[k][0] = info.max
    for op in ("sum", "prod", "min", "max"):
        want = _mine(collective, numpy_reduce(op, inputs))
        root = 0
        native = native_reduction(collective, inputs[RANK], op, root)
        for algorithm in _algorithms(collective):
            got = _run(comm, collective, inputs[RANK], op, root, algorithm)
            if collective == "reduce" and RANK != root:
                continue
            what = f"{collective} {op} {dtype} ({algorithm})"
            assert got.dtype == dtype and np.array_equal(got, want), f"{what} vs NumPy\n{got}\n{want}"
            if native is not None:  # None: the library saturates these sums (oracles.native_sum_wraps)
                assert np.array_equal(got, native), f"{what} vs MPI\n{got}\n{native}"


@pytest.mark.parametrize("collective", REDUCTIONS)
def test_bool_reductions_are_logical_as_in_numpy(comm, collective):
    """MPI has no sum/prod on C bool: NumPy's add is or, multiply and min are and, max is or."""
    rng = np.random.default_rng(3)
    inputs = [rng.integers(0, 2, LENGTH).astype(bool) for _ in range(N)]
    for op in ("sum", "prod", "min", "max"):
        want = _mine(collective, numpy_reduce(op, inputs))
        for algorithm in _algorithms(collective):
            got = _run(comm, collective, inputs[RANK], op, 0, algorithm)
            if collective != "reduce" or RANK == 0:
                assert got.dtype == bool and np.array_equal(got, want), f"{collective} {op} ({algorithm})"


# Bit patterns a data-moving collective must carry unchanged: quiet and signalling NaNs with
# payloads, a negative NaN, -0.0, infinities, the smallest subnormal.
FLOAT64_BITS = np.array([0x7FF8000000000123, 0x7FF0000000000001, 0xFFF8000000000000, 0x8000000000000000,
                         0x7FF0000000000000, 0xFFF0000000000000, 0x0000000000000001, 0x3FF0000000000000],
                        dtype=np.uint64)
FLOAT16_BITS = np.array([0x7E01, 0x7C01, 0xFE00, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x3C00], dtype=np.uint16)


@pytest.mark.parametrize("bits", [FLOAT64_BITS, FLOAT16_BITS], ids=["float64", "float16"])
@pytest.mark.parametrize("collective", ["broadcast", "gather", "allgather", "scatter"])
def test_data_moving_collectives_carry_every_bit(comm, collective, bits):
    float_type = np.float64 if bits.dtype == np.uint64 else np.float16
    mine_bits = np.roll(bits, RANK)  # each rank's own arrangement
    x = mine_bits.view(float_type)
    root = N // 2
    for algorithm in _algorithms(collective):
        if collective == "broadcast":
            got, want = comm.broadcast(x, root=root, algorithm=algorithm), np.roll(bits, root)
        elif collective == "allgather":
            got, want = comm.allgather(x, algorithm=algorithm), np.concatenate([np.roll(bits, k) for k in range(N)])
        elif collective == "gather":
            got = comm.gather(x, root=root, algorithm=algorithm)
            want = np.concatenate([np.roll(bits, k) for k in range(N)]) if RANK == root else None
        else:
            whole = np.tile(bits, N)
            got = comm.scatter(whole.view(float_type) if RANK == root else None, root=root, algorithm=algorithm)
            want = np.array_split(whole, N)[RANK]
        if want is None:
            assert got is None
            continue
        assert got.dtype == float_type and np.array_equal(got.view(bits.dtype), want), f"{collective} ({algorithm})"
    if float_type is np.float64:  # and MPI agrees, bit for bit
        native = np.empty_like(x) if RANK != root else x.copy()
        WORLD.Bcast(native, root=root)
        assert np.array_equal(comm.broadcast(x, root=root).view(np.uint64), native.view(np.uint64))


EMPTY_SHAPES = [(0,), (0, 3), (N, 0)]


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [np.dtype("float64"), np.dtype("float16"), np.dtype("int32")], ids=lambda d: d.name)
def test_empty_arrays_in_every_collective(comm, shape, dtype):
    """Every op with "auto", every algorithm with sum: empty results of the right shape and dtype."""
    x = np.zeros(shape, dtype)
    ops = ["sum", "prod", "min", "max"] + (["avg"] if dtype.kind == "f" else [])
    for op, algorithm in [(op, "auto") for op in ops[1:]] + [("sum", a) for a in _algorithms("allreduce")]:
        got = comm.allreduce(x, op=op, algorithm=algorithm)
        assert got.shape == shape and got.dtype == dtype
    for op, algorithm in [(op, "auto") for op in ops] + [("sum", a) for a in ALGORITHMS["reduce"]]:
        got = comm.reduce(x, op=op, root=N - 1, algorithm=algorithm)
        assert (got is None) if RANK != N - 1 else (got.shape == shape and got.dtype == dtype)
    for op, algorithm in [(op, "auto") for op in ops] + [("sum", a) for a in ALGORITHMS["reduce_scatter"]]:
        got = comm.reduce_scatter(x, op=op, algorithm=algorithm)
        part = np.array_split(x, N)[RANK]
        assert got.shape == part.shape and got.dtype == dtype
    if dtype != np.float16:  # and MPI agrees
        for op in ops:
            native = np.empty_like(x)
            WORLD.Allreduce(x, native, NATIVE_OPS[op])
            assert np.array_equal(comm.allreduce(x, op=op), native)
        counts = [p.size for p in np.array_split(x, N)]
        native = np.empty(np.array_split(x, N)[RANK].shape, dtype)
        WORLD.Reduce_scatter(x, native, counts, MPI.SUM)
        assert np.array_equal(comm.reduce_scatter(x), native)
    for algorithm in _algorithms("broadcast"):
        assert comm.broadcast(x, root=0, algorithm=algorithm).shape == shape
    for algorithm in _algorithms("allgather"):
        got = comm.allgather(x, algorithm=algorithm)
        assert got.shape == (shape[0] * N, *shape[1:]) and got.dtype == dtype
    for algorithm in _algorithms("gather"):
        got = comm.gather(x, root=0, algorithm=algorithm)
        assert got is None if RANK else got.shape == (shape[0] * N, *shape[1:])
    for algorithm in _algorithms("scatter"):
        got = comm.scatter(x if RANK == 0 else None, root=0, algorithm=algorithm)
        assert got.shape == np.array_split(x, N)[RANK].shape and got.dtype == dtype


def test_some_ranks_empty_in_gather_and_allgather_match_mpi(comm):
    """Row counts 0 on every other rank: the result matches MPI's Allgatherv byte for byte."""
    rows = 2 if RANK % 2 else 0
    x = np.full((rows, 3), RANK, dtype=np.float64)
    counts = [(2 if k % 2 else 0) * 3 for k in range(N)]
    native = np.empty((sum(counts) // 3, 3))
    WORLD.Allgatherv(x, [native, counts])
    for algorithm in _algorithms("allgather"):
        assert np.array_equal(comm.allgather(x, algorithm=algorithm), native)
    for algorithm in _algorithms("gather"):
        got = comm.gather(x, root=N - 1, algorithm=algorithm)
        assert got is None if RANK != N - 1 else np.array_equal(got, native)


def test_mpiring_exports_the_reliability_errors():
    assert issubclass(mpiring.CollectiveTimeout, TimeoutError)
    assert issubclass(mpiring.CollectiveMismatchError, mpiring.MpiringError)
