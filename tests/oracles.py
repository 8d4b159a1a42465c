"""Independent oracles for the collective tests: inputs every rank can regenerate from a seed,
NumPy reductions over them, and mpi4py's own native collectives.

Float inputs hold small integers, so every summation order gives the same exact result and the
comparisons can be exact; tests of rounding-order behaviour use random floats separately.
"""

from __future__ import annotations

import functools
import os

import numpy as np
from mpi4py import MPI

DTYPES = [
    np.dtype(d)
    for d in ("bool", "int8", "uint8", "int16", "int32", "uint32", "int64", "uint64",
              "float16", "float32", "float64", "complex64", "complex128")
]
BIT_OPS = ["band", "bor", "bxor", "land", "lor", "lxor"]
OPS = ["sum", "prod", "min", "max", "avg", *BIT_OPS]
# the bitwise and logical ops are tested on these (the other integer dtypes take the same ufuncs)
BIT_DTYPES = [np.dtype(d) for d in ("bool", "int8", "uint16", "int32", "uint64")]
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "avg": np.add,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
          "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor}
NATIVE_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM,
              "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR, "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR}
# MPI defines only the logical ops on C_BOOL: the bitwise ones are the same on bools
NATIVE_BOOL_OPS = {"band": MPI.LAND, "bor": MPI.LOR, "bxor": MPI.LXOR, "land": MPI.LAND, "lor": MPI.LOR,
                   "lxor": MPI.LXOR}


def native_op(op: str, dtype: np.dtype):
    """mpi4py's op for this mpiring op and dtype."""
    return NATIVE_BOOL_OPS[op] if dtype.kind == "b" else NATIVE_OPS[op]


def op_valid(op: str, dtype: np.dtype) -> bool:
    if op in BIT_OPS:
        return dtype.kind in "biu"
    if op == "avg":
        return dtype.kind in "fc"
    if op in ("min", "max"):
        return dtype.kind != "c"
    return True


def op_cases(world_size: int) -> list[tuple[np.dtype, str]]:
    """The (dtype, op) pairs the reducing collectives are tested with: every valid pairing (the
    bitwise and logical ops on BIT_DTYPES, which stand for the other integers) at 1-4 ranks. At 8
    and more, each dtype and each op at least once: their handling does not change with the world
    size, which the smaller runs test in every pairing, while each call of 8 ranks on a CI
    machine's few cores costs many turns on them."""
    cases = [(d, op) for d in DTYPES for op in OPS if op_valid(op, d) and (op not in BIT_OPS or d in BIT_DTYPES)]
    if world_size < 8:
        return cases
    chosen: set[tuple[np.dtype, str]] = set()
    dtypes: set[np.dtype] = set()
    ops: set[str] = set()
    for needed in (2, 1):  # first pairs of a dtype and an op both not yet chosen, then the rest
        for dtype, op in cases:
            if (dtype not in dtypes) + (op not in ops) >= needed:
                chosen.add((dtype, op))
                dtypes.add(dtype)
                ops.add(op)
    return [case for case in cases if case in chosen]


def rank_input(seed: int, rank: int, shape, dtype, op: str = "sum") -> np.ndarray:
    """The array `rank` contributes to case `seed`: reproducible on every rank."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng([seed, rank, 12345])
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if op in ("land", "lor", "lxor"):  # zeros common enough that every outcome shows up
        return rng.integers(0, 3, shape).astype(dtype)
    if op == "prod":  # no zeros, small magnitudes: products of 8 ranks stay exact
        values = rng.choice(np.array([-2, -1, 1, 2]), shape) if dtype.kind != "u" else rng.integers(1, 3, shape)
    elif dtype.kind == "u":
        values = rng.integers(0, 100, shape)
    else:
        values = rng.integers(-50, 51, shape)
    if dtype.kind == "c":
        imag = rng.integers(-2, 3, shape) if op == "prod" else rng.integers(-50, 51, shape)
        return (values + 1j * imag).astype(dtype)
    return np.asarray(values).astype(dtype)


def all_inputs(seed: int, size: int, shape, dtype, op: str = "sum") -> list[np.ndarray]:
    """Every rank's input to case `seed`, as new arrays (a test may write into them)."""
    return [a.copy() for a in _made_inputs(seed, size, _hashable(shape), np.dtype(dtype), op)]


@functools.lru_cache(maxsize=16)
def _made_inputs(seed: int, size: int, shape, dtype: np.dtype, op: str) -> tuple[np.ndarray, ...]:
    """The inputs of a case, made once: the tests of a collective's algorithms run case after case
    (their `case` parameter varies slowest), and at 8 ranks making them cost as much as the calls."""
    made = tuple(rank_input(seed, k, shape, dtype, op) for k in range(size))
    for array in made:
        array.flags.writeable = False
    return made


def _hashable(shape):
    return tuple(shape) if isinstance(shape, list) else shape


@functools.lru_cache(maxsize=32)
def native_case(collective: str, seed: int, shape, dtype, op: str, root: int = 0) -> np.ndarray | None:
    """`native_reduction` of this rank's input to case `seed` (all_inputs), asked of MPI once per
    case and shared by the tests of a collective's algorithms. Every rank asks for the same cases
    in the same order, so all of them call MPI or none does."""
    world = MPI.COMM_WORLD
    x = _made_inputs(seed, world.Get_size(), _hashable(shape), np.dtype(dtype), op)[world.Get_rank()]
    result = native_reduction(collective, x, op, root)
    if result is not None:
        result.flags.writeable = False
    return result


def numpy_reduce(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """The reduction in rank order, in the arrays' dtype (integers wrap as in NumPy)."""
    result = functools.reduce(lambda a, b: UFUNCS[op](a, b), arrays[1:], arrays[0].copy())
    result = np.asarray(result, dtype=arrays[0].dtype)
    if op == "avg":
        result = np.true_divide(result, len(arrays)).astype(arrays[0].dtype)
    return result


def native_supported(dtype: np.dtype, op: str | None = None) -> bool:
    """Whether mpi4py's native collectives handle this dtype (and op) for an oracle."""
    # MPI has no float16 type, and defines only logical ops on booleans
    if dtype == np.float16 or (dtype == np.bool_ and op is not None and op not in NATIVE_BOOL_OPS):
        return False
    return op != "sum" or native_sum_wraps(np.dtype(dtype))


@functools.cache
def native_sum_wraps(dtype: np.dtype) -> bool:
    """Whether the MPI library's integer sum wraps around as C's and NumPy's do. Open MPI's op/avx
    component (the default on AVX2 machines) saturates 8- and 16-bit sums instead
    (open-mpi/ompi#8045, closed as won't fix): such a library is no oracle for those sums, and
    the tests keep NumPy's. MPI_Reduce_local asks the same op without a message."""
    if dtype.kind not in "iu":
        return True
    top = np.full(64, np.iinfo(dtype).max, dtype)  # 64: past any vector width, so the vector path runs
    total = np.ones(64, dtype)
    MPI.SUM.Reduce_local(top, total)
    return bool(np.array_equal(total, np.add(top, np.ones(64, dtype))))


def assert_same(got, want, what: str) -> None:
    """Exact equality of values, dtype and shape (NaNs in the same places count as equal)."""
    assert got is not None, f"{what}: got None"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    equal_nan = want.dtype.kind in "fc"
    assert np.array_equal(got, want, equal_nan=equal_nan), f"{what}: values differ\n got {got}\nwant {want}"


def native_reduction(collective: str, x: np.ndarray, op: str, root: int = 0) -> np.ndarray | None:
    """MPI's own result for this rank of allreduce, reduce or reduce_scatter over COMM_WORLD
    (reduce_scatter splits axis 0 as numpy.array_split does), or None where MPI has no oracle
    for this dtype and op, and on non-root ranks of a reduce."""
    if not native_supported(x.dtype, op):
        return None
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    x = np.ascontiguousarray(x)
    if collective == "reduce_scatter":
        row = x[:1].size if len(x) else int(np.prod(x.shape[1:]))
        counts = [len(part) * row for part in np.array_split(np.empty(x.shape[0]), size)]
        result = np.empty(counts[rank], x.dtype)
        world.Reduce_scatter(x, result, counts, native_op(op, x.dtype))
        result = result.reshape(-1, *x.shape[1:])
    else:
        result = np.empty_like(x)
        if collective == "allreduce":
            world.Allreduce(x, result, native_op(op, x.dtype))
        else:
            world.Reduce(x, result, native_op(op, x.dtype), root=root)
            if rank != root:
                return None
    if op == "avg":
        result = np.true_divide(result, size).astype(x.dtype)
    return result


def assert_barrier_waits_for_all(barrier, directory: str, rounds: int = 5) -> None:
    """No rank leaves `barrier()` before every rank has entered it: each rank leaves a file in the
    shared `directory` before entering; after leaving, every rank must see every file of that round."""
    world = MPI.COMM_WORLD
    for round_ in range(rounds):
        with open(os.path.join(directory, f"{round_}-{world.Get_rank()}"), "w") as marker:
            marker.write("entered")
        barrier()
        seen = {name for name in os.listdir(directory) if name.startswith(f"{round_}-")}
        assert len(seen) == world.Get_size(), (
            f"round {round_}: rank {world.Get_rank()} left the barrier having seen {sorted(seen)}")


def native_scan(x: np.ndarray, op: str, exclusive: bool) -> np.ndarray | None:
    """MPI's Scan or Exscan of `x` on COMM_WORLD (collective where MPI has the dtype and op: None
    where it has not, and on exscan's rank 0, where MPI leaves the result undefined)."""
    if not native_supported(x.dtype, op):
        return None
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    out = np.empty_like(x)
    (world.Exscan if exclusive else world.Scan)(x, out, native_op(op, x.dtype))
    if exclusive and rank == 0:
        return None
    return np.true_divide(out, rank if exclusive else rank + 1).astype(x.dtype) if op == "avg" else out
