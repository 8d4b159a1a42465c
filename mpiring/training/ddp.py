"""DDP: every rank holds everything; gradients are summed by bucketed ring all-reduce.

    holds per rank    parameters P + gradients P + optimizer state K*P      = (2+K) P values
    sends per rank    2(N-1)/N P values per step (ring all-reduce of every bucket)

Backward fills one gradient buffer from the last layer down. As soon as a bucket (consecutive
layers, up to bucket_bytes) is complete it is all-reduced in place, like PyTorch DDP's buckets:
with overlap, one bucket's reduction runs while backward computes the next. Then every rank
applies the same update to the same full vectors.
"""

from __future__ import annotations

from typing import Any

from mpiring.training.sharding import Shards
from mpiring.training.strategy import Segment, Strategy


class DDP(Strategy):
    """Replicated parameters, gradients and optimizer state; bucketed all-reduce of gradients."""

    name = "ddp"

    def setup(self) -> None:
        count = self.model.param_count
        self._init_full_params()
        self.grads = self._persistent("grads", count)
        state = [self._persistent("optimizer", count) for _ in range(self.optimizer.slots)]
        self.segments = [Segment(0, count, self.full, self.grads, state)]
        self.buckets = self._buckets()

    def grad_done(self, i: int) -> None:
        bucket = self.buckets.completed_by(i)
        if bucket is not None:
            lo, hi = self.buckets.ranges[bucket]
            self._launch("allreduce", self.grads[lo:hi], out=self.grads[lo:hi])

    def finish(self, batch_size: float) -> None:
        self._drain()
        self._apply_optimizer(batch_size)

    def checkpoint_pieces(self) -> list[tuple[int, int, list[Any]]]:
        # Every rank holds everything, so each writes only its array_split part: the files
        # are as sharded as ZeRO's, and any world size can read them back.
        (lo, hi), = Shards.of([(0, self.model.param_count)], self.comm.rank, self.comm.size).pieces
        return [(lo, hi, [self.full[lo:hi], *(state[lo:hi] for state in self.segments[0].state)])]
