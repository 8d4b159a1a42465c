"""Where each rank runs: its node (the ranks that share memory with it), its local index there,
the lanes that join ranks of equal local index across nodes, and the machine it shares cores on.

    node 0: ranks 0 1 2        leaders: 0 3         lane 0: 0 3
    node 1: ranks 3 4                               lane 1: 1 4
                                                    lane 2: 2      (node 1 has no third rank)

Nodes come from MPI (`Split_type(COMM_TYPE_SHARED)`), one node per shared-memory domain, in the
order of their lowest rank; a node's ranks are in ascending order, whatever order the launcher
placed them in. MPIRING_VIRTUAL_NODES splits every node into smaller ones (as MPICH's
MPIR_CVAR_NUM_CLIQUES does), so node-aware algorithms can be exercised on one machine:

    MPIRING_VIRTUAL_NODES=2              each node's ranks in 2 blocks (as numpy.array_split cuts)
    MPIRING_VIRTUAL_NODES=2:round-robin  local rank i on virtual node i mod 2
    MPIRING_VIRTUAL_NODES=3,1            blocks of 3 and 1 ranks (adding up to each node's ranks)

MPIRING_NODE_AWARE=0 makes the map one node of every rank: `auto` then runs the flat algorithms
everywhere (MPICH's MPIR_CVAR_ENABLE_SMP_COLLECTIVES=0), for comparisons.

The machine is not the node: emulated nodes (network namespaces, containers) share one kernel
and its cores, and a rank that spins on a core its neighbour needs slows both. Ranks compare the
kernel's boot id, the same in every namespace of one machine, to count who shares their cores.
Where the MPI library itself offers the core whenever a test finds nothing done (Open MPI's
`mpi_yield_when_idle`, which its launcher turns on for an oversubscribed node), a wait need not
offer it again between tests: it spins, and each test offers the core.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from functools import cache, cached_property

from mpi4py import MPI

from mpiring import environment
from mpiring.errors import ArgumentError
from mpiring.launch import local_ranks

VIRTUAL_NODES = "MPIRING_VIRTUAL_NODES"
NODE_AWARE = "MPIRING_NODE_AWARE"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class NodeMap:
    """The ranks of a communicator grouped by node: `nodes[i]` are node i's ranks, ascending."""

    nodes: tuple[tuple[int, ...], ...]
    _node_of: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_node_of", {r: i for i, node in enumerate(self.nodes) for r in node})

    @classmethod
    def single(cls, size: int) -> NodeMap:
        """Every rank on one node."""
        return cls((tuple(range(size)),))

    @property
    def size(self) -> int:
        return len(self._node_of)

    def node_of(self, rank: int) -> int:
        return self._node_of[rank]

    def node(self, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s node."""
        return self.nodes[self._node_of[rank]]

    def local_rank(self, rank: int) -> int:
        return self.node(rank).index(rank)

    @cached_property
    def leaders(self) -> tuple[int, ...]:
        """Each node's lowest rank."""
        return tuple(node[0] for node in self.nodes)

    def representatives(self, root: int) -> tuple[int, ...]:
        """One rank per node, in node order: the root on its own node, the leader elsewhere."""
        home = self._node_of[root]
        return tuple(root if i == home else node[0] for i, node in enumerate(self.nodes))

    def lane(self, local: int) -> tuple[int, ...]:
        """The ranks of local index `local`, one per node that has one, in node order."""
        return tuple(node[local] for node in self.nodes if local < len(node))

    @cached_property
    def lanes(self) -> int:
        """The ranks of the smallest node: lanes 0..lanes-1 reach every node."""
        return min(len(node) for node in self.nodes)

    @cached_property
    def most_per_node(self) -> int:
        return max(len(node) for node in self.nodes)

    @property
    def hierarchical(self) -> bool:
        """Whether node-aware algorithms differ from flat ones: several nodes, one of several ranks."""
        return 1 < len(self.nodes) < self.size

    def describe(self) -> str:
        sizes = sorted({len(node) for node in self.nodes})
        per_node = "/".join(str(s) for s in sizes)
        in_order = all(node == tuple(range(node[0], node[0] + len(node))) for node in self.nodes)
        return f"{len(self.nodes)} nodes x {per_node} ranks" + ("" if in_order else " (ranks not in node order)")


def split_virtual(nodes: tuple[tuple[int, ...], ...], spec: str) -> tuple[tuple[int, ...], ...]:
    """Every node cut into virtual nodes as MPIRING_VIRTUAL_NODES `spec` says (see the module)."""
    spec = spec.strip().lower()
    if not spec:
        return nodes
    parts: list[tuple[int, ...]] = []
    for node in nodes:
        for virtual in _split_one(node, spec):
            if virtual:
                parts.append(virtual)
    return tuple(sorted(parts))


def _split_one(node: tuple[int, ...], spec: str) -> list[tuple[int, ...]]:
    count, _, how = spec.partition(":")
    try:
        numbers = [int(n) for n in count.split(",")]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < 1 or how not in ("", "blocks", "round-robin"):
        raise ArgumentError("Communicator", VIRTUAL_NODES, "must be N, N:round-robin or block sizes such as 3,1 "
                            f"(positive integers), got {spec!r}")
    if len(numbers) > 1:  # block sizes
        if how or sum(numbers) != len(node):
            raise ArgumentError("Communicator", VIRTUAL_NODES, f"block sizes {spec!r} must add up to the "
                                f"{len(node)} ranks of each node")
        ends = [sum(numbers[: i + 1]) for i in range(len(numbers))]
        return [node[end - n : end] for n, end in zip(numbers, ends, strict=True)]
    n = numbers[0]
    if how == "round-robin":
        return [node[i::n] for i in range(n)]
    base, extra = divmod(len(node), n)
    starts = [i * base + min(i, extra) for i in range(n + 1)]
    return [node[starts[i] : starts[i + 1]] for i in range(n)]


def discover(comm: MPI.Intracomm) -> tuple[NodeMap, bool, bool, frozenset[int]]:
    """Collective over `comm`: its node map (MPIRING_VIRTUAL_NODES applied); whether every rank
    shares one real node (device buffers may then move by CUDA IPC); whether this rank's machine
    has a core for each of its ranks (so waits may spin without offering the core); and the ranks
    whose machine has fewer cores than ranks (they take turns on its cores; alike on every rank).

    A communicator of one rank never waits for a message: it asks nothing (and uses no context id).
    """
    if comm.Get_size() == 1:
        return NodeMap.single(1), True, False, frozenset()
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        node_key = MPI.Group.Translate_ranks(shared.Get_group(), [0], comm.Get_group())[0]
    finally:
        shared.Free()
    facts = comm.allgather((node_key, _machine(), _allowed_cpus(), local_ranks()))
    by_node: dict[int, list[int]] = {}
    by_machine: dict[str, list[int]] = {}
    for rank, (key, machine, _, _) in enumerate(facts):
        by_node.setdefault(key, []).append(rank)
        by_machine.setdefault(machine, []).append(rank)
    nodes = tuple(sorted(tuple(ranks) for ranks in by_node.values()))
    node_local = len(nodes) == 1
    crowded = frozenset(rank for ranks in by_machine.values() if not _a_core_each([facts[r] for r in ranks])
                        for rank in ranks)
    spins = comm.Get_rank() not in crowded or library_yields_when_idle()
    if environment.flag(NODE_AWARE, "Communicator") is False:
        return NodeMap.single(comm.Get_size()), node_local, spins, crowded
    return NodeMap(split_virtual(nodes, environment.text(VIRTUAL_NODES))), node_local, spins, crowded


def _a_core_each(neighbours: list[tuple]) -> bool:
    """Whether one machine's ranks (their discover facts) have a core each: as many cores among
    them as ranks in the communicator there, or as the launcher started there."""
    cores = set().union(*(cpus for _, _, cpus, _ in neighbours))
    return len(cores) >= max(len(neighbours), *(started for _, _, _, started in neighbours))


@cache
def library_yields_when_idle() -> bool:
    """Whether the MPI library offers the core itself in a test that finds nothing done: Open
    MPI's control variable `mpi_yield_when_idle`, read through the MPI tool interface (False
    where the library has no such variable or the interface cannot be reached). Other libraries'
    tool interfaces are left alone: starting and finishing one is not free of side effects."""
    if "Open MPI" not in MPI.Get_library_version():
        return False
    try:
        library = ctypes.CDLL(MPI.__file__)  # (dlsym searches the libraries mpi4py's module links)
        provided = ctypes.c_int()
        if library.MPI_T_init_thread(0, ctypes.byref(provided)) != 0:
            return False
    except (OSError, AttributeError):
        return False
    try:
        index, handle, count = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
        if library.MPI_T_cvar_get_index(b"mpi_yield_when_idle", ctypes.byref(index)) != 0:
            return False
        if library.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) != 0:
            return False
        value = (ctypes.c_char * 16)()  # a bool or an int: zeroed, so any nonzero byte means on
        read = library.MPI_T_cvar_read(handle, value)
        library.MPI_T_cvar_handle_free(ctypes.byref(handle))
        return read == 0 and any(value.raw)
    finally:
        library.MPI_T_finalize()


def _machine() -> str:
    """What tells this machine from others: the kernel's boot id (the host name where unreadable)."""
    try:
        with open(_BOOT_ID) as file:
            return file.read().strip()
    except OSError:
        return MPI.Get_processor_name()


def _allowed_cpus() -> frozenset[int]:
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))
