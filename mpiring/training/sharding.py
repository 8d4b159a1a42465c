"""How the flat parameter vector is cut: layers, buckets of layers, and each rank's shard.

The model's parameters are one flat vector, layer after layer. Strategies work on *groups*:
contiguous runs of whole layers (one group per DDP/ZeRO-2 bucket, per layer for ZeRO-3, the
whole model for ZeRO-1). A sharded group is cut into `size` pieces exactly as
numpy.array_split cuts it, which is also how mpiring's reduce_scatter hands out its parts and
how its allgather puts them back, so uneven sizes work at any world size:

    group of 10 values, 4 ranks:   [0 1 2 | 3 4 5 | 6 7 | 8 9]
                                     rank0   rank1   r2    r3
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mpiring.engine.partition import split_bounds  # the same cut as the collectives use


def make_buckets(layer_bytes: Sequence[int], cap_bytes: int) -> list[tuple[int, int]]:
    """Group layers into buckets of at most `cap_bytes`, in the order backward produces them.

    Returns (first, last) layer indices, last layer's bucket first, as DDP fills its buckets.
    A layer larger than the cap gets a bucket of its own; a cap of 0 gives one layer per bucket.
    """
    buckets: list[tuple[int, int]] = []
    last, filled = len(layer_bytes) - 1, 0
    for i in reversed(range(len(layer_bytes))):
        if i < last and filled + layer_bytes[i] > cap_bytes:
            buckets.append((i + 1, last))
            last, filled = i, 0
        filled += layer_bytes[i]
    if layer_bytes:
        buckets.append((0, last))
    return buckets


@dataclass(frozen=True)
class Groups:
    """Groups of whole layers over the flat vector, listed in backward order.

    `ranges[g]` is group g's [lo, hi) in the flat vector, `layers[g]` its (first, last) layers,
    `of_layer[i]` the group holding layer i.
    """

    layers: tuple[tuple[int, int], ...]
    ranges: tuple[tuple[int, int], ...]
    of_layer: tuple[int, ...]

    @classmethod
    def build(cls, offsets: Sequence[int], layer_groups: Sequence[tuple[int, int]]) -> Groups:
        of_layer = [0] * (len(offsets) - 1)
        for g, (first, last) in enumerate(layer_groups):
            for i in range(first, last + 1):
                of_layer[i] = g
        ranges = tuple((offsets[first], offsets[last + 1]) for first, last in layer_groups)
        return cls(tuple(layer_groups), ranges, tuple(of_layer))

    def completed_by(self, layer: int) -> int | None:
        """The group whose gradient is complete once backward has reached `layer`, if any.

        Backward runs from the last layer down, so a group is complete at its first layer.
        """
        g = self.of_layer[layer]
        return g if self.layers[g][0] == layer else None


@dataclass(frozen=True)
class Shards:
    """This rank's piece of every group, and where the pieces sit in its local shard arrays.

    `pieces[g]` is the piece's [lo, hi) in the flat vector; `local[g]` the same piece's [lo, hi)
    in the rank's local arrays, which hold its pieces one after another (`length` in all).
    """

    pieces: tuple[tuple[int, int], ...]
    local: tuple[tuple[int, int], ...]
    length: int

    @classmethod
    def of(cls, ranges: Sequence[tuple[int, int]], rank: int, size: int) -> Shards:
        pieces, local, at = [], [], 0
        for lo, hi in ranges:
            bounds = split_bounds(hi - lo, size)
            pieces.append((lo + bounds[rank], lo + bounds[rank + 1]))
            local.append((at, at + bounds[rank + 1] - bounds[rank]))
            at = local[-1][1]
        return cls(tuple(pieces), tuple(local), at)
