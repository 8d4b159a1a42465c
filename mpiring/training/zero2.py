"""ZeRO-2: gradients and optimizer state are sharded; parameters stay whole on every rank.

    holds per rank    parameters P + gradients P/N + optimizer state K*P/N  = (1 + (1+K)/N) P
                      plus one bucket's full gradient while backward fills it
    sends per rank    2(N-1)/N P per step (reduce-scatter per bucket, all-gather per bucket)

Backward writes each bucket's gradient into a fresh buffer. When the bucket is complete it is
reduce-scattered into this rank's gradient shard and the full buffer is dropped at once (with
overlap: as soon as its reduce-scatter has finished), so no rank ever holds all gradients.
After backward each rank updates its shards and the parameters are all-gathered bucket by
bucket. ZeRO-3 (zero3.py) builds on this, sharding the parameters too.
"""

from __future__ import annotations

from typing import Any

from mpiring.training.sharding import Shards
from mpiring.training.strategy import Strategy


class Zero2(Strategy):
    """Whole parameters; gradients reduce-scattered bucket by bucket during backward."""

    name = "zero2"

    def setup(self) -> None:
        self._init_full_params()
        self.groups = self._buckets()
        shards = Shards.of(self.groups.ranges, self.comm.rank, self.comm.size)
        self._shard_gradients(shards, self.full, params_flat=True)

    def _shard_gradients(self, shards: Shards, params: Any, *, params_flat: bool) -> None:
        """Gradient and optimizer-state shards for `self.groups`; full gradients are transient."""
        grads = self._persistent("grads", shards.length)
        self._sharded_segments(shards, params, grads, params_flat=params_flat, grads_flat=False)
        self._filling: dict[int, Any] = {}  # group -> its full gradient buffer, while backward fills it

    def grad(self, i: int) -> Any:
        g = self.groups.of_layer[i]
        lo, hi = self.groups.ranges[g]
        if g not in self._filling:
            self._filling[g] = self._transient(hi - lo)
        return self._layer(self._filling[g], i, base=lo)

    def grad_done(self, i: int) -> None:
        g = self.groups.completed_by(i)
        if g is not None:
            full = self._filling.pop(g)  # ours is the last reference: freed once reduced
            self._launch("reduce_scatter", full, out=self.segments[g].grad, keep=full)

    def finish(self, batch_size: float) -> None:
        self._drain()
        self._apply_optimizer(batch_size)
        self._gather_full_params(self.groups)
