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

AUTO = "auto"

# collective -> [(largest message in bytes, algorithm)]; the first row whose bound holds wins.
# The message size is per rank for the reductions, scans, all-to-all and broadcast, the whole
# result for gather, all-gather and scatter. None means "any size".
SWITCH_POINTS: dict[str, list[tuple[int | None, str]]] = {
    "broadcast": [(4 << 20, "binomial"), (None, "ring")],
    "reduce": [(1 << 20, "binomial"), (None, "ring")],
    "allreduce": [(64 << 10, "recursive_doubling"), (1 << 20, "rabenseifner"), (None, "ring")],
    "gather": [(1 << 20, "binomial"), (None, "ring")],
    # since planned calls, Bruck's lg p rounds beat the ring's p-1 for small results at 4 and 8
    # ranks, with both MPI wheels (but see SMALL_WORLDS); the ring keeps larger ones (docs/algorithms.md)
    "allgather": [(4 << 10, "bruck"), (None, "ring")],
    # the root sends (p-1)/p of the array in either; the tree needs lg p rounds to the ring's p-1,
    # moves n/2 lg p bytes in all to its n (p-1)/2, and won at 4 and 8 ranks up to 32 MiB
    "scatter": [(None, "binomial")],
    "reduce_scatter": [(1 << 20, "recursive_halving"), (None, "ring")],
    "barrier": [(None, "dissemination")],
    # every message in flight at once beat p-1 pairwise rounds at every size and world size;
    # Bruck's lg p rounds beat it only with MPICH at 8 ranks below 2 KiB, and lost by more with
    # Open MPI there (docs/algorithms.md)
    "alltoall": [(None, "scattered")],
    "alltoallv": [(None, "scattered")],
    # recursive doubling's lg p rounds for an isolated small call in a large world (but see
    # SMALL_WORLDS); in back-to-back calls the chain pipelines across calls
    "scan": [(4 << 10, "recursive_doubling"), (None, "ring")],
    "exscan": [(4 << 10, "recursive_doubling"), (None, "ring")],
}

# collective -> (most ranks, algorithm): in a world this small, this algorithm at every size,
# before SWITCH_POINTS. The scans' chain won every size at 4 and 8 ranks, back-to-back (rank 0
# returns at once and consecutive calls pipeline down the chain) and isolated calls alike
# (docs/algorithms.md); its p-1 hops against recursive doubling's lg p rounds are unmeasured beyond.
SMALL_WORLDS: dict[str, tuple[int, str]] = {
    "allgather": (2, "ring"),  # one round either way: the ring skips Bruck's final rotation
    # the root posts every message at once: on one node MPI copies a large message once, at the
    # receiver, so the copies run side by side instead of hop after hop; it won or tied at every
    # size at 4 and 8 ranks with both wheels (docs/algorithms.md). Beyond 8 ranks it is unmeasured,
    # and a linear broadcast's root link carries n bytes p-1 times: the tables above keep those.
    "broadcast": (8, "linear"),
    "gather": (8, "linear"),
    "scatter": (8, "linear"),
    "scan": (8, "ring"),
    "exscan": (8, "ring"),
}

_announced: set[tuple[str, str]] = set()
_environment = {"algo": "", "debug": False}


def read_environment() -> None:
    """Take MPIRING_ALGO and MPIRING_DEBUG from the environment as it is now."""
    _environment["algo"] = environment.text("MPIRING_ALGO")
    _environment["debug"] = bool(environment.flag("MPIRING_DEBUG", "mpiring"))


def _switch(collective: str, nbytes: int, world_size: int) -> tuple[str, str]:
    most_ranks, algorithm = SMALL_WORLDS.get(collective, (0, ""))
    if world_size <= most_ranks:
        return algorithm, f"auto: {world_size} ranks <= {most_ranks}, any size"
    for bound, algorithm in SWITCH_POINTS[collective]:
        if bound is None:
            return algorithm, f"auto: the default for {nbytes} B at {world_size} ranks"
        if nbytes <= bound:
            return algorithm, f"auto: {nbytes} B <= {bound} B at {world_size} ranks"
    raise AssertionError(f"no switch point for {collective}")  # each table ends with a None row


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


def choose(collective: str, requested: str, nbytes: int, world_size: int) -> str:
    """The algorithm to run: `requested`, or for "auto" the first switch point that fits."""
    algorithm, reason = requested, "asked for"
    if requested == AUTO:
        algorithm, reason = _switch(collective, nbytes, world_size)
    if _environment["debug"] and (collective, algorithm) not in _announced:
        _announced.add((collective, algorithm))
        sys.stderr.write(f"mpiring: {collective} ran {algorithm} ({reason})\n")
    return algorithm


read_environment()
