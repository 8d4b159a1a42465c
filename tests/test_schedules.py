"""Every algorithm's schedule, run for all ranks of a simulated world in one process (no MPI):
- what rank a sends rank b, message by message and size by size, is what b posts receives for,
  in the same order (calls share a tag, so a message left over would be taken by the next call);
- no receive is posted into memory that a pending receive or send still uses, or that holds
  data received but not yet reduced, copied or sent on.

Timing cannot break a schedule that passes these: it is what MPI may do at any speed.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from mpiring.algorithms import ALGORITHMS, broadcast_ring, reduce_scatter_ring_pipelined
from mpiring.backend import NUMPY
from mpiring.engine.partition import split_bounds
from mpiring.engine.ring import Ring
from mpiring.engine.scratch import Scratch
from mpiring.engine.transport import Step
from mpiring.topology import NodeMap, split_virtual

scan_chain = importlib.import_module("mpiring.algorithms.scan_ring")  # the package's scan_ring is the function
node_pipelined = importlib.import_module("mpiring.algorithms.allreduce_node_pipelined")
# the one-round algorithms, whose WINDOW a test narrows (the package's names are the functions)
WINDOWED = [importlib.import_module(f"mpiring.algorithms.{name}")
            for name in ("allgather_scattered", "alltoall_scattered", "reduce_scatter_scattered", "broadcast_linear",
                         "gather_linear", "scatter_linear")]


class SimulatedRing:
    """What an algorithm reads of a Ring besides `post`: its place in the ring, and scratch."""

    def __init__(self, rank: int, size: int, nodes: NodeMap | None = None) -> None:
        self.rank, self.size = rank, size
        self.nodes = nodes or NodeMap.single(size)  # what the node-aware algorithms read
        self.left, self.right = (rank - 1) % size, (rank + 1) % size
        self.ranks_sharing_cores: frozenset[int] = frozenset()  # (the chain scan sends one segment where all do)

    takes_turns = Ring.takes_turns

    def position(self, root: int) -> int:
        return (self.rank - root) % self.size

    def rank_at(self, position: int, root: int) -> int:
        return (root + position) % self.size

    def scratch(self, backend, count, dtype):
        return Scratch(np.empty(count, dtype))


class CheckingRing(SimulatedRing):
    """A rank's view of the ring that records posts and checks every receive buffer."""

    def __init__(self, rank: int, size: int, nodes: NodeMap | None = None) -> None:
        super().__init__(rank, size, nodes)
        self.sent: dict[int, list[int]] = {}  # destination -> sizes, in posting order
        self.received: dict[int, list[int]] = {}  # source -> sizes, in posting order
        self.pending: dict[int, tuple[list, list]] = {}  # id(step) -> (receive buffers, send buffers)
        self.unconsumed: list = []  # received, not yet reduced, copied or sent on

    def post(self, backend, tag, sends=(), receives=()):
        busy = [b for receives_, sends_ in self.pending.values() for b in receives_ + sends_] + self.unconsumed
        for buf, source in receives:
            clash = [b for b in busy if buf.size and b.size and np.shares_memory(buf, b)]
            assert not clash, f"rank {self.rank}: a receive from {source} lands on memory still in use"
            self.received.setdefault(source, []).append(buf.nbytes)
        for buf, dest in sends:
            self.sent.setdefault(dest, []).append(buf.nbytes)
        step = Step()
        self.pending[id(step)] = ([b for b, _ in receives], [b for b, _ in sends])
        return step

    def completed(self, step) -> None:
        receives, sends = self.pending.pop(id(step))
        self.consume(*sends)
        self.unconsumed.extend(receives)

    def consume(self, *buffers) -> None:
        self.unconsumed = [u for u in self.unconsumed if not any(
            u.size and b.size and np.shares_memory(u, b) for b in buffers)]


class CheckingBackend:
    """NumPy, telling the ring which received data each reduction or copy has used."""

    def __init__(self, ring: CheckingRing) -> None:
        self.ring = ring
        self.name, self.xp, self.staged = "checking", np, False

    def __getattr__(self, name):
        return getattr(NUMPY, name)

    def combine(self, op, a, b, out):
        self.check_in_flight(out, a, b)
        self.ring.consume(a, b)
        NUMPY.combine(op, a, b, out)

    def copy(self, dst, src):
        self.check_in_flight(dst, src)
        self.ring.consume(src)
        NUMPY.copy(dst, src)

    def check_in_flight(self, out, *inputs) -> None:
        """Work done while steps are in flight (a root's own copy) must not touch their receives
        (nothing has arrived yet), nor write what their sends are still reading."""
        for receives, sends in self.ring.pending.values():
            for buf in receives:
                assert not any(_overlap(buf, a) for a in (out, *inputs)), (
                    f"rank {self.ring.rank}: work touches a receive still in flight")
            for buf in sends:
                assert not _overlap(buf, out), f"rank {self.ring.rank}: work writes a send still in flight"


def _overlap(a, b) -> bool:
    return bool(a.size and b.size and np.shares_memory(a, b))


def _steps(collective, algorithm, ring, backend, length, root):
    p, r = ring.size, ring.rank
    bounds = split_bounds(length, p)
    run = ALGORITHMS[collective][algorithm]
    x = np.arange(length, dtype=np.float64) + r
    if collective == "broadcast":  # odd lengths: the root sends another array and copies it into x
        return run(ring, backend, 1, root, x, x.copy() if r == root and length % 2 else None)
    if collective == "reduce":
        return run(ring, backend, 1, root, x, np.empty(length) if r == root else None, "sum")
    if collective == "allreduce":
        return run(ring, backend, 1, x, np.empty(length), "sum")
    if collective == "reduce_scatter":
        return run(ring, backend, 1, x, bounds, "sum", np.empty(bounds[r + 1] - bounds[r]))
    if collective == "allgather":  # odd lengths: the own chunk comes from another array
        src = x[bounds[r]:bounds[r + 1]].copy() if length % 2 else None
        return run(ring, backend, 1, np.zeros(length), bounds, src)
    if collective == "gather":
        return run(ring, backend, 1, root, x[bounds[r]:bounds[r + 1]], np.empty(length) if r == root else None,
                   bounds)
    if collective == "scatter":
        return run(ring, backend, 1, root, x if r == root else None, np.empty(bounds[r + 1] - bounds[r]), bounds)
    if collective == "alltoall":
        block = length % 4
        even = [k * block for k in range(p + 1)]
        return run(ring, backend, 1, np.arange(p * block, dtype=np.float64), even, np.empty(p * block), even)
    if collective == "alltoallv":  # rank a sends rank b (a + 2b + length) % 4 elements, some none
        send = [0] + list(np.cumsum([(r + 2 * b + length) % 4 for b in range(p)]))
        receive = [0] + list(np.cumsum([(a + 2 * r + length) % 4 for a in range(p)]))
        return run(ring, backend, 1, np.arange(send[-1], dtype=np.float64), send, np.empty(receive[-1]), receive)
    if collective in ("scan", "exscan"):
        exclusive = collective == "exscan"
        return run(ring, backend, 1, x, None if exclusive and r == 0 else np.empty(length), "sum", exclusive)
    return run(ring, 1)  # barrier


CASES = [(c, a) for c, algorithms in ALGORITHMS.items() for a in algorithms]


@pytest.mark.parametrize("collective, algorithm", CASES, ids=[f"{c}-{a}" for c, a in CASES])
def test_schedules_match_and_never_overwrite_live_data(monkeypatch, collective, algorithm):
    monkeypatch.setattr(reduce_scatter_ring_pipelined, "SEGMENT_BYTES", 16)  # two float64 per segment
    monkeypatch.setattr(broadcast_ring, "SEGMENT_BYTES", 16)
    monkeypatch.setattr(scan_chain, "SEGMENT_BYTES", 16)
    monkeypatch.setattr(node_pipelined, "PIECE_BYTES", 4)  # a few float64 per segment
    for module in WINDOWED:
        monkeypatch.setattr(module, "WINDOW", 2)  # several steps from 3 or 4 ranks on
    # node-aware algorithms on node maps of blocks, round-robin (ranks not in node order) and uneven nodes
    specs = ["", "2", "2:round-robin", "3"] if algorithm.startswith("node_") else [""]
    # ranks that take turns on shared cores as well, where the algorithm asks (the chain scan)
    sharing = [False, True] if collective in ("scan", "exscan") else [False]
    for p, spec, shared in ((p, spec, shared) for p in (1, 2, 3, 4, 5, 7, 8) for spec in specs for shared in sharing):
        nodes = NodeMap(split_virtual((tuple(range(p)),), spec))
        for length in sorted({0, 1, p - 1, p + 1, 3 * p + 2, 37}):
            root = length % p
            rings = [CheckingRing(r, p, nodes) for r in range(p)]
            for ring in rings:
                ring.ranks_sharing_cores = frozenset(range(p) if shared else ())
            for ring in rings:
                for step in _steps(collective, algorithm, ring, CheckingBackend(ring), length, root):
                    ring.completed(step)
                assert not ring.pending, f"rank {ring.rank}: steps posted and never waited for"
            for a in range(p):
                for b in range(p):
                    assert rings[a].sent.get(b, []) == rings[b].received.get(a, []), (
                        f"{collective} {algorithm} p={p} nodes={spec} shared={shared} length={length}: rank {a} sends "
                        f"rank {b} {rings[a].sent.get(b, [])} bytes, which posts receives for "
                        f"{rings[b].received.get(a, [])}")


class RendezvousRing(SimulatedRing):
    """A rank's view of a simulated world in which a message moves only once both its send and
    its receive are posted (MPI's rendezvous protocol, the strictest it may choose)."""

    def __init__(self, rank: int, size: int, nodes: NodeMap, world: dict) -> None:
        super().__init__(rank, size, nodes)
        self.world = world
        self.needs: dict[int, list[tuple[str, int, int, int]]] = {}  # id(step) -> what it waits for

    def post(self, backend, tag, sends=(), receives=()):
        step, needs = Step(), []
        for _, dest in sends:  # the i-th message from a to b meets b's i-th receive from a
            count = self.world["sends"].get((self.rank, dest), 0)
            self.world["sends"][self.rank, dest] = count + 1
            needs.append(("receives", self.rank, dest, count))
        for _, source in receives:
            count = self.world["receives"].get((source, self.rank), 0)
            self.world["receives"][source, self.rank] = count + 1
            needs.append(("sends", source, self.rank, count))
        self.needs[id(step)] = needs
        return step

    def complete(self, step) -> bool:
        return all(self.world[kind].get((a, b), 0) > i for kind, a, b, i in self.needs[id(step)])


NODE_ALLREDUCE = [a for a in ALGORITHMS["allreduce"] if a.startswith("node_")]


@pytest.mark.parametrize("algorithm", NODE_ALLREDUCE)
def test_node_aware_allreduce_cannot_deadlock_under_rendezvous(monkeypatch, algorithm):
    """Every rank waits for each step it yields; a step completes once all its messages' peers
    have posted their halves. Stepping whichever rank can, every rank must finish, for node maps
    of even, uneven and interleaved nodes and several pipeline segments."""
    monkeypatch.setattr(node_pipelined, "PIECE_BYTES", 4)  # a few float64 per segment
    monkeypatch.setattr(reduce_scatter_ring_pipelined, "SEGMENT_BYTES", 16)
    for p, spec in ((p, spec) for p in (1, 2, 3, 4, 5, 7, 8) for spec in ("", "2", "2:round-robin", "3", "1")):
        nodes = NodeMap(split_virtual((tuple(range(p)),), spec))
        for length in sorted({0, 1, p + 1, 37, 100}):
            world: dict = {"sends": {}, "receives": {}}
            rings = [RendezvousRing(r, p, nodes, world) for r in range(p)]
            runs = [ALGORITHMS["allreduce"][algorithm](ring, NUMPY, 1, np.arange(length, dtype=np.float64),
                                                       np.empty(length), "sum") for ring in rings]
            waiting = {r: next(runs[r], None) for r in range(p)}
            while any(step is not None for step in waiting.values()):
                ready = [r for r, step in waiting.items() if step is not None and rings[r].complete(step)]
                assert ready, f"{algorithm} p={p} nodes={spec} length={length}: every rank waits, none can move"
                for r in ready:
                    waiting[r] = next(runs[r], None)
