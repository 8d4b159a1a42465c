"""Reduction operators: their names, which dtypes they accept, and how they combine arrays.

The bitwise ops (band, bor, bxor) take integer and bool arrays. The logical ops (land, lor,
lxor) take the same, treat nonzero as true, and write 0 or 1 in the input's own dtype (False or
True for bool), as MPI's MPI_LAND etc. do for C integers: the result of `land` on int32 arrays
is an int32 array of zeros and ones. As in MPI, an element that is never combined (a world of
one rank, or rank 0 of a scan) is the input unchanged, not normalised to 0/1. Floating and
complex arrays are refused for all six (MPI defines them only for integers and logicals).
"""

from __future__ import annotations

SUM = "sum"
PROD = "prod"
MIN = "min"
MAX = "max"
AVG = "avg"  # sum / world size, computed once by the rank that owns each chunk
BAND = "band"
BOR = "bor"
BXOR = "bxor"
LAND = "land"
LOR = "lor"
LXOR = "lxor"

OPS = (SUM, PROD, MIN, MAX, AVG, BAND, BOR, BXOR, LAND, LOR, LXOR)
BITWISE = (BAND, BOR, BXOR)
LOGICAL = (LAND, LOR, LXOR)

# The array-module ufunc that combines two partial results for each op (avg sums first). The
# logical ufuncs compute bools, which `out=` casts to the array's dtype (0 or 1).
UFUNC_NAMES = {
    SUM: "add", PROD: "multiply", MIN: "minimum", MAX: "maximum", AVG: "add",
    BAND: "bitwise_and", BOR: "bitwise_or", BXOR: "bitwise_xor",
    LAND: "logical_and", LOR: "logical_or", LXOR: "logical_xor",
}


def op_problem(op: object, dtype_kind: str) -> str | None:
    """Why `op` cannot reduce arrays of this dtype kind, or None when it can."""
    if not isinstance(op, str) or op not in OPS:
        return f"unknown op {op!r}; expected one of {', '.join(OPS)}"
    if op == AVG and dtype_kind in "biu":
        return "op 'avg' needs a floating or complex dtype (an integer mean would be truncated)"
    if op in (MIN, MAX) and dtype_kind == "c":
        return f"op {op!r} is not defined for complex dtypes (they have no order)"
    if (op in BITWISE or op in LOGICAL) and dtype_kind not in "biu":
        return f"op {op!r} needs an integer or bool dtype (MPI defines it for no other)"
    return None
