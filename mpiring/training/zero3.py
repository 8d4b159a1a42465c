"""ZeRO-3: parameters, gradients and optimizer state are all sharded, layer by layer.

    holds per rank    (2+K) P/N values, plus one layer's full parameters and gradient in flight
    sends per rank    3(N-1)/N P per step: all-gather for forward, all-gather again for
                      backward, reduce-scatter of the gradient

Each layer's parameters are all-gathered just before the layer runs and dropped right after
(forward and again backward); its gradient is reduce-scattered into this rank's shard exactly
as in ZeRO-2 (which this builds on), with one group per layer. The update touches only shards,
so nothing is gathered after it. With overlap, the next layer's all-gather is started before
the current layer computes (prefetch), at the cost of one more layer in flight.
"""

from __future__ import annotations

from typing import Any

import numpy

from mpiring.training.arrays import to_host
from mpiring.training.sharding import Shards
from mpiring.training.zero2 import Zero2


class Zero3(Zero2):
    """Every layer gathered just in time; only shards persist."""

    name = "zero3"

    def setup(self) -> None:
        self.groups = self._per_layer()
        shards = Shards.of(self.groups.ranges, self.comm.rank, self.comm.size)
        self.shard = self._persistent("params", shards.length)
        for g, (layer, _) in enumerate(self.groups.layers):
            (lo, hi), (a, b), start = shards.pieces[g], shards.local[g], self.model.offsets[layer]
            self.shard[a:b] = self.model.initial(layer, self.seed)[lo - start : hi - start]
        self._shard_gradients(shards, self.shard, params_flat=False)
        layers = list(range(len(self.model.layers)))
        self._order = layers + layers[::-1]  # the order step() asks for parameters
        self._asked = 0
        self._prefetched: dict[int, Any] = {}

    def _gather(self, i: int) -> Any:
        full = self._transient(self.model.layers[i].size)
        return self._start("allgather", self.segments[self.groups.of_layer[i]].param, out=full)

    def params(self, i: int) -> Any:
        request = self._prefetched.pop(i) if i in self._prefetched else self._gather(i)
        self._asked += 1
        if self.overlap and self._asked < len(self._order):
            upcoming = self._order[self._asked]
            self._prefetched[upcoming] = self._gather(upcoming)
        return self._wait(request)  # the step drops it after use: freed at once

    def _in_flight(self) -> list[Any]:
        return super()._in_flight() + list(self._prefetched.values())

    def finish(self, batch_size: float) -> None:
        self._drain()
        self._apply_optimizer(batch_size)
        self._asked = 0

    def full_parameters(self, root: int = 0) -> numpy.ndarray | None:
        # Layer by layer to the root only, so no rank but the root ever holds the whole model.
        parts = [self.comm.gather(seg.param, root=root) for seg in reversed(self.segments)]
        return numpy.concatenate([to_host(p) for p in parts]) if self.comm.rank == root else None
