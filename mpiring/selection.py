"""How algorithm="auto" picks an algorithm: switch points by collective, message size and
world size, kept in this one table. They come from `python -m mpiring.bench --algorithm all`
on the project's machine; docs/algorithms.md shows the measurements behind them.

Overrides, strongest first: `algorithm=` on the call; the MPIRING_ALGO environment variable
(one name for every collective that has it, or "allreduce=ring,broadcast=binomial");
then this table. MPIRING_DEBUG=1 prints, once per collective and choice, which algorithm ran
and why. Both variables are read when mpiring is imported and again whenever a Communicator is
created (not on every call: small collectives are paid in Python time).
"""

from __future__ import annotations

import sys

from mpiring import environment
from mpiring.topology import NodeMap

AUTO = "auto"

# collective -> [(most ranks, largest message in bytes, algorithm)]: the first row whose bounds
# both hold wins; None means "any". The message size is per rank for the reductions, scans,
# all-to-all and broadcast, the whole result for gather, all-gather and scatter.
# Rows bounded by ranks come from measurements at 2, 4 and 8 ranks with both MPI wheels
# (docs/algorithms.md); beyond 8 ranks they are unmeasured, so the open rows keep the
# algorithms whose cost models favour them there.
SWITCH_POINTS: dict[str, list[tuple[int | None, int | None, str]]] = {
    # the root posts every message at once (linear): on one node MPI copies a large message once,
    # at the receiver, so the copies run side by side instead of hop after hop; it won or tied at
    # every size at 4 and 8 ranks with both wheels. Beyond, a linear broadcast's root link would
    # carry n bytes p-1 times, and gather's and scatter's p-1 messages meet at the root.
    "broadcast": [(8, None, "linear"), (None, 4 << 20, "binomial"), (None, None, "ring")],
    # at 2 ranks the tree is one message of the input, received into the result (Open MPI's own
    # reduce); at 4 and 8 ranks, above 256 KiB, a reduce-scatter and a gather with every message
    # in flight at once (scattered) tie or beat it with both wheels (at 128-256 KiB the tree won
    # by up to 1.8x once buffers had 2 MiB pages), and the ring lost at every size
    "reduce": [(2, None, "binomial"), (None, 256 << 10, "binomial"), (8, None, "scattered"),
               (None, 1 << 20, "binomial"), (None, None, "ring")],
    # above 64 KiB at up to 8 ranks, both halves with every message in flight at once (scattered)
    # beat the ring and Rabenseifner at 4 and 8 ranks with both wheels, up to 2.3x at 1 MiB; at 2
    # ranks all three send the same two messages
    "allreduce": [(None, 64 << 10, "recursive_doubling"), (8, None, "scattered"), (None, 1 << 20, "rabenseifner"),
                  (None, None, "ring")],
    "gather": [(8, None, "linear"), (None, 1 << 20, "binomial"), (None, None, "ring")],
    # at 2 ranks one round either way, and the ring skips Bruck's final rotation. Bruck's lg p
    # rounds beat the ring's p-1 for small results at 4 and 8 ranks with both wheels. From 4 KiB
    # to 4 MiB every block in flight at once (scattered) beat both there with both wheels; above,
    # it won with MPICH and lost with Open MPI, so the ring keeps those
    "allgather": [(2, None, "ring"), (None, 4 << 10, "bruck"), (8, 4 << 20, "scattered"), (None, None, "ring")],
    # the root sends (p-1)/p of the array in either; the tree needs lg p rounds to the ring's p-1,
    # moves n/2 lg p bytes in all to its n (p-1)/2, and won at 4 and 8 ranks up to 32 MiB
    "scatter": [(8, None, "linear"), (None, None, "binomial")],
    # every input chunk straight to its owner, all at once (scattered), beat the ring and
    # recursive halving from 128 KiB up at 4 ranks with both wheels (and still did with 2 MiB
    # pages: 2 MiB 288 us against the ring's 1140); at 8 ranks it was within the runs' noise
    "reduce_scatter": [(None, 128 << 10, "recursive_halving"), (8, None, "scattered"),
                       (None, 1 << 20, "recursive_halving"), (None, None, "ring")],
    "barrier": [(None, None, "dissemination")],
    # every message in flight at once beat p-1 pairwise rounds at every size and world size;
    # Bruck's lg p rounds beat it only with MPICH at 8 ranks below 2 KiB, and lost by more with
    # Open MPI there (docs/algorithms.md)
    "alltoall": [(None, None, "scattered")],
    "alltoallv": [(None, None, "scattered")],
    # the chain won every size at 4 and 8 ranks, back-to-back (rank 0 returns at once and
    # consecutive calls pipeline down the chain) and isolated calls alike; beyond, an isolated
    # small call would wait p-1 hops against recursive doubling's lg p rounds
    "scan": [(8, None, "ring"), (None, 4 << 10, "recursive_doubling"), (None, None, "ring")],
    "exscan": [(8, None, "ring"), (None, 4 << 10, "recursive_doubling"), (None, None, "ring")],
}

# collective -> [(largest message in bytes, algorithm)] for ranks on several nodes, some of them
# with several ranks (NodeMap.hierarchical): the first row whose bound holds wins; FLAT hands the
# choice to SWITCH_POINTS. Collectives not named here run their flat algorithms on any nodes.
# Measured on the emulated cluster (docs/benchmarks-cluster.md): the single-leader all-reduce
# crosses the network in one exchange of the leaders and won to 4 KiB; from 32 KiB every lane
# driving the link at once won, and at 2 MiB-16 MiB beat the flat algorithms by 1.4-2.2x.
FLAT = "flat"
NODE_SWITCH_POINTS: dict[str, list[tuple[int | None, str]]] = {
    "allreduce": [(16 << 10, "node_leader"), (None, "node_lanes")],
    "broadcast": [(None, "node_leader")],
    "reduce": [(None, "node_leader")],
    "allgather": [(None, "node_leader")],
    "barrier": [(None, "node_leader")],
}

# collective -> [(largest message in bytes, algorithm)] for flat algorithms whose ranks all sit on
# different nodes: the lanes, leaders and representatives inside node-aware algorithms, and
# communicators of one rank per node. Every message there crosses the network, so the one-node
# choices that let a root send every copy itself (linear) or every rank send to every other at
# once (scattered) load one link several times over; measured on the emulated cluster at 4 nodes,
# the pipelined ring broadcast and the ring all-reduce kept to the link's rate from 256 KiB.
ACROSS_NODES_SWITCH_POINTS: dict[str, list[tuple[int | None, str]]] = {
    "broadcast": [(64 << 10, "binomial"), (None, "ring")],
    "allreduce": [(16 << 10, "recursive_doubling"), (None, "ring")],
    "allgather": [(64 << 10, "scattered"), (None, "ring")],
}

_announced: set[tuple[str, str]] = set()
_environment = {"algo": "", "debug": False}


def read_environment() -> None:
    """Take MPIRING_ALGO and MPIRING_DEBUG from the environment as it is now."""
    _environment["algo"] = environment.text("MPIRING_ALGO")
    _environment["debug"] = bool(environment.flag("MPIRING_DEBUG", "mpiring"))


def _switch(collective: str, nbytes: int, world_size: int, nodes: NodeMap | None = None) -> tuple[str, str]:
    if nodes is not None and len(nodes.nodes) > 1:
        table = NODE_SWITCH_POINTS if nodes.hierarchical else ACROSS_NODES_SWITCH_POINTS
        for largest, algorithm in table.get(collective, ()):
            if largest is None or nbytes <= largest:
                if algorithm != FLAT:
                    size = "any size" if largest is None else f"{nbytes} B <= {largest} B"
                    return algorithm, f"auto: {size}, {nodes.describe()}"
                break
    for most_ranks, largest, algorithm in SWITCH_POINTS[collective]:
        if (most_ranks is None or world_size <= most_ranks) and (largest is None or nbytes <= largest):
            ranks = "any number of ranks" if most_ranks is None else f"{world_size} ranks <= {most_ranks}"
            size = "any size" if largest is None else f"{nbytes} B <= {largest} B"
            return algorithm, f"auto: {size}, {ranks}"
    raise AssertionError(f"no switch point for {collective}")  # each table ends with an open row


def flat_choice(collective: str, nbytes: int, world_size: int) -> str:
    """The algorithm `auto` picks for ranks on one node: what node-aware algorithms run inside a node."""
    return _switch(collective, nbytes, world_size)[0]


def auto_choice(collective: str, nbytes: int, world_size: int, nodes: NodeMap | None = None) -> str:
    """What `auto` runs for this call, silently (the cost model predicts it)."""
    return _switch(collective, nbytes, world_size, nodes)[0]


def across_choice(collective: str, nbytes: int, world_size: int) -> str:
    """The flat algorithm `auto` picks for ranks each on a node of its own: what node-aware
    algorithms run across nodes (ACROSS_NODES_SWITCH_POINTS, else the one-node choice)."""
    for largest, algorithm in ACROSS_NODES_SWITCH_POINTS.get(collective, ()):
        if largest is None or nbytes <= largest:
            return algorithm
    return flat_choice(collective, nbytes, world_size)


def environment_choice(collective: str) -> str | None:
    """The algorithm MPIRING_ALGO names for this collective, if any."""
    text = _environment["algo"]
    if not text:
        return None
    if "=" not in text:
        return text
    for item in text.split(","):
        name, _, algorithm = item.partition("=")
        if name.strip() == collective:
            return algorithm.strip()
    return None


def choose(collective: str, requested: str, nbytes: int, world_size: int, nodes: NodeMap | None = None) -> str:
    """The algorithm to run: `requested`, or for "auto" the first switch point that fits (the
    node-aware ones first where `nodes` spread the ranks over several nodes)."""
    algorithm, reason = requested, "asked for"
    if requested == AUTO:
        algorithm, reason = _switch(collective, nbytes, world_size, nodes)
    if _environment["debug"] and (collective, algorithm) not in _announced:
        _announced.add((collective, algorithm))
        sys.stderr.write(f"mpiring: {collective} ran {algorithm} ({reason})\n")
    return algorithm


read_environment()
