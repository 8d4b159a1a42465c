"""SGD, with momentum (one state value per parameter: the thing ZeRO-1 shards) or plain.

The update is elementwise, so applying it to a shard gives exactly the values that applying it
to the whole vector would give: sharding the optimizer changes who computes, not what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SGD:
    """v = momentum * v + g;  p -= lr * v   (PyTorch's form; momentum 0 is plain SGD, no state).

    g is the mean gradient over the global batch: the update gets the *sum* of per-example
    gradients and divides by the batch size itself.
    """

    lr: float = 0.1
    momentum: float = 0.9

    @property
    def slots(self) -> int:
        """Optimizer state values kept per parameter."""
        return 1 if self.momentum else 0

    def update(self, xp: Any, param: Any, grad_sum: Any, state: list[Any], batch_size: float) -> None:
        """Update `param` in place. `grad_sum` is used as scratch (it is recomputed every step),
        so the update allocates nothing."""
        grad = grad_sum
        xp.true_divide(grad, batch_size, out=grad)
        if self.slots:
            velocity = state[0]
            xp.multiply(velocity, self.momentum, out=velocity)
            velocity += grad
            xp.multiply(velocity, self.lr, out=grad)
        else:
            xp.multiply(grad, self.lr, out=grad)
        param -= grad
