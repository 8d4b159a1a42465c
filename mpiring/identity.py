"""A blocking call's identity, as its message tags carry it (mpiring.engine.tags).

Ranks that call different collectives, or the same one with different dtypes, ops, roots or
algorithms, then post receives no message of the other call can match: instead of mixing the
calls' data, each rank waits, and while it waits (mpiring.engine.waiting) it sees the foreign message and
raises `MessageMismatchError` naming both calls. Fields, from the lowest bit:

    layout round  1 bit   gather, all-gather and scatter that exchange a layout first
    root          3 bits  root mod 8 (rooted collectives); the algorithm's high bits otherwise
    algorithm     3 bits  1 + its place in mpiring.algorithms.ALGORITHMS[collective]; 0 until chosen
                          (its bits past the third in the root field, where the collective has no
                          root: up to 7 algorithms of a rooted collective, 63 of another)
    op            4 bits  1 + its place in mpiring.ops.OPS; 0 without one
    dtype         5 bits  1 + its place among the supported dtypes by name; 0 without data, or
                          with a layout round (which compares the ranks' dtypes and says so)
    collective    4 bits  its place in the catalogue (15: a notice, mpiring.engine.tags.NOTICE)

What the tag cannot tell apart is left to MPIRING_CHECK (docs/errors.md): shapes that move the
same bytes, roots 8 apart, and calls whose ranks exchange no message at all.
"""

from __future__ import annotations

from typing import Any

from mpiring.algorithms import ALGORITHMS
from mpiring.backend import SUPPORTED_DTYPES
from mpiring.catalogue import NAMES, REDUCING, ROOTED
from mpiring.engine.tags import NOTICE
from mpiring.ops import OPS

_ROOT_SHIFT, _ALGORITHM_SHIFT, _OP_SHIFT, _DTYPE_SHIFT, _COLLECTIVE_SHIFT = 1, 4, 7, 11, 16
_DTYPES = sorted(SUPPORTED_DTYPES, key=str)
_OTHER_DTYPE = 31  # a dtype outside the table
_CODE = {
    "collective": {name: i for i, name in enumerate(NAMES)},
    "op": {op: i + 1 for i, op in enumerate(OPS)},
    "algorithm": {(c, name): i + 1 for c, table in ALGORITHMS.items() for i, name in enumerate(table)},
    "dtype": {dtype: i + 1 for i, dtype in enumerate(_DTYPES)},  # keyed by dtype: str(dtype) costs us
}
assert NOTICE >> _COLLECTIVE_SHIFT == 15 and len(NAMES) < 15 and len(OPS) < 16 and len(_DTYPES) < _OTHER_DTYPE
assert all(len(algorithms) < (8 if collective in ROOTED else 64) for collective, algorithms in ALGORITHMS.items())


def of_call(collective: str, x: Any, op: Any, root: Any, layout_round: bool) -> int:
    """The identity of a blocking call before its algorithm is chosen (`x`, `op`, `root` as the
    call checked them; x None where this rank does not know the data's dtype)."""
    bits = _CODE["collective"][collective] << _COLLECTIVE_SHIFT | layout_round
    if x is not None and not layout_round:  # a layout round compares dtypes
        bits |= _CODE["dtype"].get(x.dtype, _OTHER_DTYPE) << _DTYPE_SHIFT
    if collective in REDUCING:
        bits |= _CODE["op"][op] << _OP_SHIFT
    if collective in ROOTED:
        bits |= (root % 8) << _ROOT_SHIFT
    return bits


def of_algorithm(collective: str, algorithm: str) -> int:
    """The identity bits the chosen algorithm adds."""
    code = _CODE["algorithm"][collective, algorithm]
    return (code & 7) << _ALGORITHM_SHIFT | (code >> 3) << _ROOT_SHIFT  # the high bits: no root there


def describe(identity: int, size: int) -> str:
    """A call identity in words, e.g. `allreduce (float32, op sum, algorithm ring)`; `size` is
    the world size (a root above 7 is only known mod 8)."""
    if identity >> _COLLECTIVE_SHIFT == NOTICE >> _COLLECTIVE_SHIFT:
        return "a notice that its blocking call raised there"
    index = identity >> _COLLECTIVE_SHIFT
    collective = NAMES[index] if index < len(NAMES) else "a collective this rank does not know"
    words = []
    dtype = identity >> _DTYPE_SHIFT & 31
    if dtype:
        words.append(str(_DTYPES[dtype - 1]) if dtype <= len(_DTYPES) else "another dtype")
    op = identity >> _OP_SHIFT & 15
    if op:
        words.append(f"op {OPS[op - 1]}" if op <= len(OPS) else "another op")
    if collective in ROOTED:
        words.append(f"root {identity >> _ROOT_SHIFT & 7}" + (" mod 8" if size > 8 else ""))
    algorithm = identity >> _ALGORITHM_SHIFT & 7
    if collective not in ROOTED:
        algorithm |= (identity >> _ROOT_SHIFT & 7) << 3
    names = list(ALGORITHMS.get(collective, ()))
    if algorithm:
        words.append(f"algorithm {names[algorithm - 1]}" if algorithm <= len(names) else "another algorithm")
    if identity & 1:
        words.append("layout round first")
    return f"{collective} ({', '.join(words)})" if words else collective
