"""Reduction operators: their names, which dtypes they accept, and how they combine arrays."""

from __future__ import annotations

SUM = "sum"
PROD = "prod"
MIN = "min"
MAX = "max"
AVG = "avg"  # sum / world size, computed once by the rank that owns each chunk

OPS = (SUM, PROD, MIN, MAX, AVG)

# The array-module ufunc that combines two partial results for each op (avg sums first).
UFUNC_NAMES = {SUM: "add", PROD: "multiply", MIN: "minimum", MAX: "maximum", AVG: "add"}


def op_problem(op: object, dtype_kind: str) -> str | None:
    """Why `op` cannot reduce arrays of this dtype kind, or None when it can."""
    if not isinstance(op, str) or op not in OPS:
        return f"unknown op {op!r}; expected one of {', '.join(OPS)}"
    if op == AVG and dtype_kind in "biu":
        return "op 'avg' needs a floating or complex dtype (an integer mean would be truncated)"
    if op in (MIN, MAX) and dtype_kind == "c":
        return f"op {op!r} is not defined for complex dtypes (they have no order)"
    return None
