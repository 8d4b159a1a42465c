"""Argument checks shared by the collectives. Each either returns the checked value or raises
`ArgumentError` naming the collective and the argument. They are local: every rank that gets
the same arguments raises the same error before any message moves.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy

from mpiring.algorithms import ALGORITHMS, DEFAULT_ALGORITHM
from mpiring.backend import NUMPY, SUPPORTED_DTYPES, NumpyBackend, is_bfloat16
from mpiring.errors import ArgumentError, ArgumentTypeError, Unconverted
from mpiring.ops import OPS, op_problem
from mpiring.selection import AUTO, environment_choice

_DTYPE_NAMES = ", ".join(sorted(d.name for d in SUPPORTED_DTYPES))


def check_array(collective: str, name: str, x: Any, backend: NumpyBackend, *, split: bool = False) -> Any:
    """`x` as an array of a supported dtype; with split=True it must have an axis 0 to split."""
    if type(x) is Unconverted:  # a foreign array that could not be shared (mpiring.interop)
        raise x.error
    if type(x) is not numpy.ndarray and isinstance(x, numpy.ma.MaskedArray):  # plain arrays skip the lookup
        raise ArgumentTypeError(collective, name, "masked arrays are not supported (the mask would be dropped "
                                "and masked values reduced): pass x.filled(value) or x.data")
    try:
        arr = backend.asarray(x)
    except Exception as error:  # array-likes that cannot become arrays (ragged lists, ...)
        raise ArgumentError(collective, name, f"cannot be made into an array: {error}") from error
    dtype = arr.dtype
    if not dtype.isnative:
        raise ArgumentTypeError(collective, name, f"dtype {dtype} is not in native byte order")
    if dtype not in SUPPORTED_DTYPES:
        if is_bfloat16(dtype):
            if backend is not NUMPY:
                raise ArgumentTypeError(collective, name, "bfloat16 is supported on the host only (ml_dtypes); "
                                        "CuPy has no bfloat16 arithmetic: pass float32 or a NumPy array")
            return arr
        raise ArgumentTypeError(collective, name, f"unsupported dtype {dtype}; supported: {_DTYPE_NAMES}, "
                                "bfloat16 (ml_dtypes)")
    if split and arr.ndim == 0:
        raise ArgumentError(collective, name, "is 0-d, but this collective splits or joins along axis 0")
    return arr


# The reductions that reduce bfloat16 in float32 (mpiring.collectives.in_float32).
WIDENING = ("reduce", "allreduce", "reduce_scatter", "scan", "exscan")


def check_op(collective: str, op: Any, dtype: Any) -> str:
    bfloat16 = is_bfloat16(dtype)
    if bfloat16 and collective not in WIDENING:
        raise ArgumentTypeError(collective, "x", "bfloat16 is not reduced by this collective yet (it would "
                                "round at every step); reduce in float32, or use allreduce")
    problem = op_problem(op, "f" if bfloat16 else dtype.kind)
    if problem:
        # an op the dtype has no meaning for is a type mistake; an unknown op a value mistake
        error = ArgumentTypeError if isinstance(op, str) and op in OPS else ArgumentError
        raise error(collective, "op", f"{problem} (dtype {dtype})")
    return op


def check_root(collective: str, root: Any, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, numbers.Integral):
        raise ArgumentError(collective, "root", f"must be an integer rank, got {root!r}")
    if not 0 <= root < size:
        raise ArgumentError(collective, "root", f"{root} is not a rank of this communicator (size {size})")
    return int(root)


def check_counts(collective: str, counts: Any, size: int, name: str = "counts") -> list[int] | None:
    """counts= (or the argument `name`) as a list of `size` non-negative row counts (None stays None)."""
    if counts is None:
        return None
    try:
        values = list(counts)
    except TypeError:
        raise ArgumentTypeError(collective, name, f"must be a sequence of row counts, got {counts!r}") from None
    if len(values) != size or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0
                                      for n in values):
        raise ArgumentError(collective, name, f"must give {size} non-negative integers (one per rank), "
                            f"got {counts!r}")
    return [int(n) for n in values]


def check_algorithm(collective: str, algorithm: Any) -> str:
    """The algorithm asked for: `algorithm=`, else MPIRING_ALGO, else the default ("auto")."""
    argument = "algorithm"
    if algorithm is None:
        algorithm = environment_choice(collective)
        argument = "MPIRING_ALGO"
    if algorithm is None:
        return DEFAULT_ALGORITHM
    if not isinstance(algorithm, str):
        raise ArgumentTypeError(collective, argument, f"must be a name (str), got {algorithm!r}")
    known = ALGORITHMS[collective]
    if argument == "MPIRING_ALGO" and algorithm not in known and any(algorithm in names for names in
                                                                     ALGORITHMS.values()):
        return DEFAULT_ALGORITHM  # e.g. MPIRING_ALGO=binomial: the collectives without one stay on auto
    if algorithm != AUTO and algorithm not in known:
        raise ArgumentError(
            collective, argument, f"unknown algorithm {algorithm!r}; expected auto or one of {', '.join(known)}"
        )
    return algorithm


def out_problem(out: Any, shape: tuple[int, ...], dtype: Any, backend: NumpyBackend) -> str | None:
    """Why `out` cannot receive a result of this shape and dtype, or None when it can."""
    if type(out) is Unconverted:
        return out.error.problem
    if not backend.is_array(out):
        return f"must be a {backend.name} array, got {type(out).__name__}"
    if not out.dtype.isnative:  # (a non-native dtype may even compare equal to a native one by name)
        return f"has dtype {out.dtype}, which is not in native byte order"
    if out.dtype != dtype:
        return f"has dtype {out.dtype}, expected {dtype}"
    if tuple(out.shape) != tuple(shape):
        return f"has shape {tuple(out.shape)}, expected {tuple(shape)}"
    if not getattr(out.flags, "writeable", True):  # CuPy arrays have no read-only flag
        return "is read-only"
    return None


def check_out(collective: str, out: Any, shape: tuple[int, ...], dtype: Any, backend: NumpyBackend) -> Any:
    if out is None:
        return None
    problem = out_problem(out, shape, dtype, backend)
    if problem:
        raise ArgumentError(collective, "out", problem)
    return out


def check_timeout(collective: str, timeout: Any) -> float | None:
    """Seconds to wait, or None for no limit (`math.inf`); `timeout=None` never reaches here:
    the caller first replaces it with its default."""
    if type(timeout) is float and 0 < timeout < math.inf:  # the common case, without the ABC checks
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ArgumentTypeError(collective, "timeout",
                                f"must be a number of seconds, math.inf or None, got {timeout!r}")
    if timeout == math.inf:
        return None
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ArgumentError(collective, "timeout", f"must be a positive number of seconds, math.inf (no limit) or "
                            f"None, got {timeout!r}")
    return float(timeout)
