"""How algorithm="auto" picks an algorithm: switch points by collective, message size and
world size, kept in this one table. They come from `python -m mpiring.bench --algorithm all`
on the project's machine; docs/algorithms.md shows the measurements behind them.

Overrides, strongest first: `algorithm=` on the call; the MPIRING_ALGO environment variable
(one name for every collective that has it, or "allreduce=ring,broadcast=binomial");
then these tables, where MPIRING_SWITCH_POINTS names a JSON file whose tables replace the
rows of the collectives it names (docs/tuning.md):

    {"switch_points": {"allreduce": [[null, 65536, "recursive_doubling"], [null, null, "ring"]]},
     "node_switch_points": {"allreduce": [[null, "flat"]]}}

MPIRING_DEBUG=1 prints, once per collective and choice, which algorithm ran and why. These
variables are read when mpiring is imported and again whenever a Communicator is created (not
on every call: small collectives are paid in Python time).
"""

from __future__ import annotations

import importlib
import json
import sys

from mpiring import environment
from mpiring.errors import ArgumentError
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
    # on buffers of 2 MiB pages), and the ring lost at every size
    "reduce": [(2, None, "binomial"), (None, 256 << 10, "binomial"), (8, None, "scattered"),
               (None, 1 << 20, "binomial"), (None, None, "ring")],
    # above 64 KiB at up to 8 ranks, both halves with every message in flight at once (scattered)
    # beat the ring and Rabenseifner at 4 and 8 ranks with both wheels; at 2
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
    # recursive halving from 128 KiB up at 4 ranks with both wheels (on 2 MiB pages too); at 8
    # ranks it was within the runs' noise (the figures: docs/measurements.md)
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
# driving the link at once won, and at 2 MiB-16 MiB beat the flat algorithms.
FLAT = "flat"
NODE_SWITCH_POINTS: dict[str, list[tuple[int | None, str]]] = {
    "allreduce": [(16 << 10, "node_leader"), (None, "node_lanes")],
    "broadcast": [(None, "node_leader")],
    "reduce": [(None, "node_leader")],
    "allgather": [(None, "node_leader")],
    "barrier": [(None, "node_leader")],
    # each node's data summed in the node before it crosses: at 2 x 2 ranks and 1 Gbit/s it beat
    # the flat choice from 64 KiB to 8 MiB per rank and tied at 16 B (the figures:
    # docs/measurements.md#node-aware-gather-scatter-reduce-scatter-and-scan)
    "reduce_scatter": [(None, "node_leader")],
    # one message across to each other node's leader, which scatters it inside: to 64 KiB the
    # root's p-k separate crossings cost more than the second hop, at 2 x 2 and 4 x 2 ranks over
    # 1 and 10 Gbit/s; above, the two tied (docs/measurements.md#node-aware-gather-scatter-reduce-scatter-and-scan)
    "scatter": [(64 << 10, "node_leader"), (None, FLAT)],
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

SWITCH_POINTS_VARIABLE = "MPIRING_SWITCH_POINTS"
# The tables in force: SWITCH_POINTS and NODE_SWITCH_POINTS with the rows MPIRING_SWITCH_POINTS
# replaces. The file is read by read_environment; its algorithm names are checked once
# mpiring.algorithms has loaded (at import, this module loads before it), else at the first choice.
_tables: dict = {"file": "", "flat": SWITCH_POINTS, "node": NODE_SWITCH_POINTS, "across": ACROSS_NODES_SWITCH_POINTS,
                 "checked": True}


def read_environment() -> None:
    """Take MPIRING_ALGO, MPIRING_DEBUG and MPIRING_SWITCH_POINTS from the environment as it is now."""
    _environment["algo"] = environment.text("MPIRING_ALGO")
    _environment["debug"] = bool(environment.flag("MPIRING_DEBUG", "mpiring"))
    path = environment.text(SWITCH_POINTS_VARIABLE)
    if not path:
        _tables.update(file="", flat=SWITCH_POINTS, node=NODE_SWITCH_POINTS, across=ACROSS_NODES_SWITCH_POINTS,
                       checked=True)
        return
    flat, node, across = load_switch_points(path)
    _tables.update(file=path, flat={**SWITCH_POINTS, **flat}, node={**NODE_SWITCH_POINTS, **node},
                   across={**ACROSS_NODES_SWITCH_POINTS, **across}, checked=False)
    algorithms = sys.modules.get("mpiring.algorithms")
    if getattr(algorithms, "ALGORITHMS", None) is not None:
        _check_names()


def switch_points() -> tuple[dict, dict, dict]:
    """The tables `auto` follows now: (flat, node-aware, across nodes), MPIRING_SWITCH_POINTS's
    rows in place."""
    if not _tables["checked"]:
        _check_names()
    return _tables["flat"], _tables["node"], _tables["across"]


def _refuse(problem: str) -> ArgumentError:
    return ArgumentError("mpiring", SWITCH_POINTS_VARIABLE, problem)


def _bound(value: object, where: str, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _refuse(f"{where}: {what} must be a whole number >= 0 or null, got {value!r}")
    return value


def load_switch_points(path: str) -> tuple[dict, dict, dict]:
    """The tables of a MPIRING_SWITCH_POINTS file, their shape checked (ArgumentError naming the
    variable, the file and the row): {"switch_points": {collective: [[most ranks, largest bytes,
    algorithm], ...]}, "node_switch_points": {collective: [[largest bytes, algorithm], ...]},
    "across_nodes_switch_points": {likewise}}.
    Either part may be left out. A flat table must end with a row open in every bound; where no
    row of a node-aware table holds, the flat table chooses, as for "flat"."""
    try:
        with open(path) as file:
            data = json.load(file)
    except OSError as error:
        raise _refuse(f"cannot read {path!r}: {error.strerror or error}") from None
    except ValueError as error:
        raise _refuse(f"{path!r} is not JSON: {error}") from None
    parts = ("switch_points", "node_switch_points", "across_nodes_switch_points")
    if not isinstance(data, dict):
        raise _refuse(f"{path!r} must hold a JSON object with any of {', '.join(parts)}")
    unknown = sorted(set(data) - set(parts))
    if unknown:
        raise _refuse(f"{path!r}: unknown key(s) {unknown}; expected any of {', '.join(parts)}")
    tables: list[dict] = []
    for part, known, width in (("switch_points", SWITCH_POINTS, 3), ("node_switch_points", SWITCH_POINTS, 2),
                               ("across_nodes_switch_points", SWITCH_POINTS, 2)):
        table = data.get(part, {})
        if not isinstance(table, dict):
            raise _refuse(f"{path!r}: \"{part}\" must map collective names to lists of rows")
        parsed: dict = {}
        for collective, rows in table.items():
            where = f"{path!r}, {part}.{collective}"
            if collective not in known:
                raise _refuse(f"{where}: unknown collective; expected one of {', '.join(known)}")
            if not isinstance(rows, list) or not rows:
                raise _refuse(f"{where}: must be a non-empty list of rows")
            parsed[collective] = []
            for index, row in enumerate(rows):
                shape = "[most ranks, largest bytes, algorithm]" if width == 3 else "[largest bytes, algorithm]"
                if not isinstance(row, list) or len(row) != width or not isinstance(row[-1], str):
                    raise _refuse(f"{where}[{index}]: a row is {shape}, got {row!r}")
                if width == 3:
                    parsed[collective].append((_bound(row[0], f"{where}[{index}]", "most ranks"),
                                               _bound(row[1], f"{where}[{index}]", "largest bytes"), row[2]))
                else:
                    parsed[collective].append((_bound(row[0], f"{where}[{index}]", "largest bytes"), row[1]))
            if width == 3 and any(bound is not None for bound in parsed[collective][-1][:-1]):
                raise _refuse(f"{where}: the last row must be open (null bounds), so that every case has an algorithm")
        tables.append(parsed)
    return tables[0], tables[1], tables[2]


def _check_names() -> None:
    """Every algorithm a MPIRING_SWITCH_POINTS row names exists for its collective."""
    # mpiring.algorithms imports this module: look its table up where the import left it (it
    # has loaded by the time anything chooses) rather than import it back.
    ALGORITHMS = importlib.import_module("mpiring.algorithms").ALGORITHMS  # noqa: N806

    parts = (("switch_points", _tables["flat"], ()), ("node_switch_points", _tables["node"], (FLAT,)),
             ("across_nodes_switch_points", _tables["across"], ()))
    for part, table, extra in parts:
        for collective, rows in table.items():
            for index, row in enumerate(rows):
                name = row[-1]
                if part == "across_nodes_switch_points" and name.startswith("node_"):
                    raise _refuse(f"{_tables['file']!r}, {part}.{collective}[{index}]: {name!r} is node-aware; "
                                  "the rows across nodes name flat algorithms")
                if name not in ALGORITHMS[collective] and name not in extra:
                    known = ", ".join([*ALGORITHMS[collective], *extra])
                    raise _refuse(f"{_tables['file']!r}, {part}.{collective}[{index}]: unknown algorithm {name!r} "
                                  f"for {collective}; expected one of {known}")
    _tables["checked"] = True


def _switch(collective: str, nbytes: int, world_size: int, nodes: NodeMap | None = None) -> tuple[str, str]:
    flat_table, node_table, across_table = switch_points()
    if nodes is not None and len(nodes.nodes) > 1:
        table = node_table if nodes.hierarchical else across_table
        for largest, algorithm in table.get(collective, ()):
            if largest is None or nbytes <= largest:
                if algorithm != FLAT:
                    size = "any size" if largest is None else f"{nbytes} B <= {largest} B"
                    return algorithm, f"auto: {size}, {nodes.describe()}"
                break
    for most_ranks, largest, algorithm in flat_table[collective]:
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
    for largest, algorithm in switch_points()[2].get(collective, ()):
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
