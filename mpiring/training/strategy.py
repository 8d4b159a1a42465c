"""What the four strategies share: the layer-by-layer training step, collectives that can be
started now and waited for later, and the optimizer applied to what a rank owns.

The step runs forward layer 0..L-1, then backward L-1..0, and asks the strategy four things:

    params(i)      layer i's full parameters, now (a view, or a just-in-time all-gather)
    grad(i)        where backward writes layer i's gradient sum (a view, or a fresh buffer)
    grad_done(i)   layer i's gradient is written: a bucket may be complete, reduce it
    finish(B)      all gradients are in: update what this rank owns (and gather it back)

Collectives go through `_start` / `_launch`: blocking today; with `overlap=True` they use the
communicator's nonblocking variants (iallreduce, ireduce_scatter, iallgather) and are waited
for only when their result is needed, so communication hides behind compute. `clock` (a
CommClock) measures both sides: the time spent inside collective calls, tests and waits (the
communication a step waited on, `comm_seconds`) and the time nonblocking collectives were in
flight while this rank computed (the communication hidden, `hidden_seconds`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy

from mpiring.training.arrays import to_host
from mpiring.training.errors import TrainingError
from mpiring.training.memory import MemoryTracker
from mpiring.training.model import Model, cross_entropy_sum
from mpiring.training.optimizer import SGD
from mpiring.training.sharding import Groups, Shards, make_buckets

DEFAULT_BUCKET_BYTES = 256 * 1024
_NONBLOCKING = ("iallreduce", "ireduce_scatter", "iallgather")

# read(row, lo, hi) -> the checkpoint's values [lo, hi) of row 0 (parameters) or 1.. (state).
Reader = Callable[[int, int, int], numpy.ndarray]


@dataclass
class Segment:
    """A run [lo, hi) of the flat vector that this rank updates, with its parameters, gradient
    sums and optimizer state (views into the strategy's arrays)."""

    lo: int
    hi: int
    param: Any
    grad: Any
    state: list[Any] = field(default_factory=list)


class Finished:
    """A collective that has already completed (what `_start` returns when not overlapping)."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def test(self) -> bool:
        return True

    def wait(self) -> Any:
        return self._result


class CommClock:
    """Exposed and hidden communication time of one rank.

    exposed: wall time inside collective calls, test() and wait() (the rank computes nothing).
    hidden:  wall time at least one nonblocking collective was in flight (started, not yet seen
             complete by test() or wait()) minus the exposed time that fell inside those spans:
             the time communication was outstanding while the rank computed.

    mpiring has no progress thread: a request's messages move inside its test() and wait() calls
    and in MPI's own progress, so `hidden` is time the collective *could* progress behind
    compute; the blocking run's exposed time is the yardstick for what overlap saved.
    """

    def __init__(self) -> None:
        self.exposed = 0.0
        self.in_flight = 0.0
        self._exposed_in_flight = 0.0
        self._active: set[int] = set()
        self._busy_since = 0.0

    @property
    def hidden(self) -> float:
        return max(self.in_flight - self._exposed_in_flight, 0.0)

    def call(self, run: Callable[[], Any]) -> Any:
        """run() inside a collective call, test or wait: timed as exposed."""
        busy = bool(self._active)
        began = time.perf_counter()
        try:
            return run()
        finally:
            spent = time.perf_counter() - began
            self.exposed += spent
            if busy:
                self._exposed_in_flight += spent

    def started(self, request: Any) -> None:
        if not self._active:
            self._busy_since = time.perf_counter()
        self._active.add(id(request))

    def finished(self, request: Any) -> None:
        if id(request) in self._active:
            self._active.discard(id(request))
            if not self._active:
                self.in_flight += time.perf_counter() - self._busy_since


class Strategy:
    """Base of DDP and ZeRO-1/2/3. Subclasses allocate their state in `setup` and fill `segments`."""

    name: ClassVar[str] = ""

    def __init__(self, model: Model, comm: Any, optimizer: SGD, *, seed: int = 0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, overlap: bool = False,
                 algorithm: str | None = None) -> None:
        missing = [name for name in _NONBLOCKING if not hasattr(comm, name)]
        if overlap and missing:
            raise TrainingError(f"overlap needs nonblocking collectives; the communicator lacks {', '.join(missing)}")
        self.model, self.comm, self.optimizer = model, comm, optimizer
        self.xp, self.dtype = model.xp, model.dtype
        self.seed, self.bucket_bytes, self.overlap = seed, bucket_bytes, overlap
        # None: mpiring's own choice; "ring" pins the algorithms the traffic theory describes.
        self.algorithm = algorithm
        self.memory = MemoryTracker()
        self.clock = CommClock()
        self.full: Any = None  # the full flat parameter vector, for strategies that keep one
        self.grads: Any = None  # the full flat gradient vector, for strategies that keep one
        self.segments: list[Segment] = []
        self._pending: list[tuple[Any, Any]] = []  # (request, buffer it must keep alive)
        self.setup()

    # ---- what each strategy decides ------------------------------------------------------
    def setup(self) -> None:
        raise NotImplementedError

    def params(self, i: int) -> Any:
        return self._layer(self.full, i)

    def grad(self, i: int) -> Any:
        return self._layer(self.grads, i)

    def grad_done(self, i: int) -> None:
        """Layer i's gradient sum has been written."""

    def finish(self, batch_size: float) -> None:
        raise NotImplementedError

    # ---- the step ------------------------------------------------------------------------
    def step(self, inputs: Any, targets: Any, batch_size: int, grad_scale: float = 1.0) -> float:
        """One training step on this rank's part of the global batch; returns the global mean loss.

        The update uses the mean gradient times `grad_scale` (the learning-rate schedule's factor:
        with momentum, scaling what enters the velocity ramps the step size smoothly)."""
        xp, layers = self.xp, self.model.layers
        h, caches = inputs, []
        # params(i) is never kept here: a just-in-time gathered layer is freed when it returns.
        for i, layer in enumerate(layers):
            h, cache = layer.forward(xp, self.params(i), h)
            caches.append(cache)
            self._progress()
        loss_sum, dh = cross_entropy_sum(xp, h, targets)
        for i in reversed(range(len(layers))):
            dh = layers[i].backward(xp, self.params(i), caches.pop(), dh, self.grad(i))
            self.grad_done(i)
            self._progress()
        loss = self._wait(self._start("allreduce", loss_sum.reshape(1)))
        self.finish(batch_size / grad_scale)
        return float(loss[0]) / batch_size

    # ---- building blocks -----------------------------------------------------------------
    def _layer(self, flat: Any, i: int, base: int = 0) -> Any:
        """Layer i's part of `flat`, a vector that starts at position `base` of the flat layout."""
        lo, hi = self.model.span(i)
        return flat[lo - base : hi - base]

    def _buckets(self) -> Groups:
        """Layers grouped into buckets of at most bucket_bytes, in backward order."""
        return Groups.build(self.model.offsets, make_buckets(self.model.layer_bytes, self.bucket_bytes))

    def _per_layer(self) -> Groups:
        return Groups.build(self.model.offsets, [(i, i) for i in reversed(range(len(self.model.layers)))])

    def _persistent(self, kind: str, length: int) -> Any:
        return self.memory.persistent(kind, self.xp, length, self.dtype)

    def _transient(self, length: int) -> Any:
        return self.memory.transient(self.xp, length, self.dtype)

    def _init_full_params(self) -> None:
        """Allocate and initialize the full flat parameter vector."""
        self.full = self._persistent("params", self.model.param_count)
        for i in range(len(self.model.layers)):
            self._layer(self.full, i)[...] = self.model.initial(i, self.seed)

    def _sharded_segments(self, shards: Shards, params: Any, grads: Any, *,
                          params_flat: bool, grads_flat: bool) -> None:
        """One segment per piece of `shards`, with optimizer state allocated for it.

        `params` and `grads` are either full flat vectors (`*_flat=True`: a piece is found at its
        flat position) or this rank's shard arrays (a piece is found at its local position).
        """
        state = [self._persistent("optimizer", shards.length) for _ in range(self.optimizer.slots)]
        for (lo, hi), (a, b) in zip(shards.pieces, shards.local, strict=True):
            param = params[lo:hi] if params_flat else params[a:b]
            grad = grads[lo:hi] if grads_flat else grads[a:b]
            self.segments.append(Segment(lo, hi, param, grad, [s[a:b] for s in state]))

    @property
    def comm_seconds(self) -> float:
        """Time inside collective calls, tests and waits so far: communication waited on."""
        return self.clock.exposed

    @property
    def hidden_seconds(self) -> float:
        """Time nonblocking collectives were in flight while this rank computed."""
        return self.clock.hidden

    def _start(self, collective: str, *args: Any, **kwargs: Any) -> Any:
        """Start a collective; returns something whose wait() gives its result."""
        if self.algorithm is not None:
            kwargs["algorithm"] = self.algorithm
        if not self.overlap:
            return Finished(self.clock.call(lambda: getattr(self.comm, collective)(*args, **kwargs)))
        request = self.clock.call(lambda: getattr(self.comm, "i" + collective)(*args, **kwargs))
        self.clock.started(request)
        return request

    def _wait(self, request: Any) -> Any:
        result = self.clock.call(request.wait)
        self.clock.finished(request)
        return result

    def _launch(self, collective: str, *args: Any, keep: Any = None, **kwargs: Any) -> None:
        """Start a collective whose result lands in out=; `_drain` waits for it. `keep` is a
        buffer it reads, held until then (only while overlapping: blocking ones are done)."""
        request = self._start(collective, *args, **kwargs)
        if self.overlap:
            self._pending.append((request, keep))

    def _in_flight(self) -> list[Any]:
        """Requests started and not yet waited for."""
        return [request for request, _ in self._pending]

    def _progress(self) -> None:
        """Between layers: let collectives in flight advance (mpiring's nonblocking collectives
        move only inside test() and wait(): there is no progress thread)."""
        for request in self._in_flight():
            if self.clock.call(request.test):
                self.clock.finished(request)

    def _drain(self) -> None:
        """Wait for every collective `_launch` started."""
        for request, _ in self._pending:
            self._wait(request)
        self._pending.clear()

    def _apply_optimizer(self, batch_size: float) -> None:
        for seg in self.segments:
            self.optimizer.update(self.xp, seg.param, seg.grad, seg.state, batch_size)

    def _gather_full_params(self, groups: Groups) -> None:
        """After a sharded update: all-gather every group's updated pieces into self.full."""
        for seg, (lo, hi) in zip(self.segments, groups.ranges, strict=True):
            piece = self._transient(seg.hi - seg.lo)  # a copy: allgather's input must not overlap out=
            piece[...] = seg.param
            self._launch("allgather", piece, out=self.full[lo:hi], keep=piece)
        self._drain()

    # ---- state outside the step ----------------------------------------------------------
    def checkpoint_pieces(self) -> list[tuple[int, int, list[Any]]]:
        """What this rank writes to a checkpoint: (lo, hi, [params, *state]) runs of the flat vector."""
        return [(seg.lo, seg.hi, [seg.param, *seg.state]) for seg in self.segments]

    def load_state(self, read: Reader) -> None:
        """Fill parameters and optimizer state from a checkpoint, whatever world size wrote it."""
        xp = self.xp
        if self.full is not None:
            self.full[...] = xp.asarray(read(0, 0, self.model.param_count))
        for seg in self.segments:
            if self.full is None:
                seg.param[...] = xp.asarray(read(0, seg.lo, seg.hi))
            for row, state in enumerate(seg.state, start=1):
                state[...] = xp.asarray(read(row, seg.lo, seg.hi))

    def full_parameters(self, root: int = 0) -> numpy.ndarray | None:
        """Collective: the whole flat parameter vector on `root` (a host copy), None elsewhere."""
        return to_host(self.full).copy() if self.comm.rank == root else None
