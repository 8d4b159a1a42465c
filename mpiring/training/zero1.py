"""ZeRO-1: the optimizer state is sharded; parameters and gradients stay whole on every rank.

    holds per rank    parameters P + gradients P + optimizer state K*P/N    = (2 + K/N) P values
    sends per rank    (N-1)/N P reduce-scatter + (N-1)/N P all-gather     = 2(N-1)/N P per step

A full backward into one gradient buffer; one reduce-scatter leaves each rank the summed
gradient of its shard (the numpy.array_split part of the flat vector); each rank updates its
shard of the parameters with its shard of the state; one all-gather brings every rank all the
updated parameters. Same bytes on the wire as DDP: a ring all-reduce *is* a reduce-scatter
followed by an all-gather, ZeRO-1 just does the update in between.
"""

from __future__ import annotations

from mpiring.training.sharding import Groups, Shards
from mpiring.training.strategy import Strategy


class Zero1(Strategy):
    """Whole parameters and gradients; optimizer state and the update sharded."""

    name = "zero1"

    def setup(self) -> None:
        self._init_full_params()
        self.grads = self._persistent("grads", self.model.param_count)
        self.groups = Groups.build(self.model.offsets, [(0, len(self.model.layers) - 1)])
        shards = Shards.of(self.groups.ranges, self.comm.rank, self.comm.size)
        self._sharded_segments(shards, self.full, self.grads, params_flat=True, grads_flat=True)

    def finish(self, batch_size: float) -> None:
        (mine,) = self.segments
        self._launch("reduce_scatter", self.grads, out=mine.grad)  # into this rank's part, in place
        self._drain()
        self._apply_optimizer(batch_size)
        self._gather_full_params(self.groups)
