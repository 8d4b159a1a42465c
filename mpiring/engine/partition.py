"""Split arithmetic: where each rank's chunk, block or segment of a flat buffer begins and ends.

Every algorithm, the collectives, the training demo's shards and the benchmark cut buffers with
these functions, so a chunk means the same elements everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_bounds(total: int, parts: int) -> list[int]:
    """Offsets of `parts` contiguous pieces of `total` items, as numpy.array_split cuts them.

    The first total % parts pieces get one extra item; pieces may be empty. Piece i spans
    [bounds[i], bounds[i+1]).
    """
    base, extra = divmod(total, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def bounds_from_counts(counts: Sequence[int], scale: int = 1) -> list[int]:
    """Offsets of consecutive pieces of the given sizes, each multiplied by `scale`."""
    bounds = [0]
    for count in counts:
        bounds.append(bounds[-1] + int(count) * scale)
    return bounds


def row_bounds(rows: int, parts: int, counts: Sequence[int] | None) -> list[int]:
    """Offsets of each rank's rows of a split collective (scatter, reduce-scatter): `counts`
    when the caller gave them, else as numpy.array_split cuts `rows` into `parts`."""
    return split_bounds(rows, parts) if counts is None else bounds_from_counts(counts)
