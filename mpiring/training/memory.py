"""Measuring the model state a rank holds: the bytes of the arrays it actually keeps alive.

A strategy allocates every parameter, gradient and optimizer-state buffer through a
MemoryTracker. The tracker counts an array's bytes when it is made and takes them off when
the array is really freed (a weakref finalizer: it fires only when nothing, not even a view,
refers to the array any more). So the numbers are what the process holds, not what a formula
says it should: a strategy that forgot to drop a gathered layer would show it.

Persistent state is counted by kind (params, grads, optimizer); transient buffers (gathered
parameters, full gradient buckets) are counted as they come and go, with their peak. Activations
and the collectives' own scratch are not counted: they do not depend on the strategy.
"""

from __future__ import annotations

import weakref
from typing import Any

KINDS = ("params", "grads", "optimizer")


class MemoryTracker:
    """Live bytes per kind of buffer, and the peak of the total since the last reset."""

    def __init__(self) -> None:
        self.live: dict[str, int] = {kind: 0 for kind in (*KINDS, "transient")}
        self.peak = 0
        self.peak_transient = 0
        self.exact = True  # False if some buffer's release could not be observed

    def persistent(self, kind: str, xp: Any, length: int, dtype: Any) -> Any:
        """A zeroed 1-D array of model state that lives across steps (`kind` in KINDS)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return self._track(kind, xp.zeros(length, dtype=dtype))

    def transient(self, xp: Any, length: int, dtype: Any) -> Any:
        """An uninitialized 1-D buffer for use within a step; dropped when its last reference goes."""
        return self._track("transient", xp.empty(length, dtype=dtype))

    def _track(self, kind: str, array: Any) -> Any:
        self.live[kind] += array.nbytes
        try:
            weakref.finalize(array, self._freed, kind, array.nbytes)
        except TypeError:  # an array type without weak references: its bytes stay counted
            self.exact = False
        total = self.total
        self.peak = max(self.peak, total)
        self.peak_transient = max(self.peak_transient, self.live["transient"])
        return array

    def _freed(self, kind: str, nbytes: int) -> None:
        self.live[kind] -= nbytes

    @property
    def total(self) -> int:
        return sum(self.live.values())

    @property
    def model_state(self) -> int:
        """Bytes of persistent model state held now: parameters, gradients, optimizer state."""
        return sum(self.live[kind] for kind in KINDS)

    def reset_peak(self) -> None:
        self.peak = self.total
        self.peak_transient = self.live["transient"]

    def snapshot(self) -> dict[str, int]:
        """The live bytes per kind, the model state, and the peaks, as plain numbers."""
        return {**{kind: self.live[kind] for kind in KINDS}, "model_state": self.model_state,
                "peak": self.peak, "peak_transient": self.peak_transient}
