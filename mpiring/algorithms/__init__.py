"""Every algorithm, by collective and name: the one table `algorithm=` is looked up in.

One module per algorithm (MPICH's layout); each module's docstring gives its steps, a ring
diagram, the bytes each rank moves and its alpha-beta-gamma cost.
"""

from __future__ import annotations

from collections.abc import Callable

from mpiring.algorithms.allgather_ring import allgather_ring
from mpiring.algorithms.allreduce_ring import allreduce_ring
from mpiring.algorithms.barrier_ring import barrier_ring
from mpiring.algorithms.broadcast_ring import broadcast_ring
from mpiring.algorithms.gather_ring import gather_ring
from mpiring.algorithms.reduce_ring import reduce_ring
from mpiring.algorithms.reduce_scatter_ring import reduce_scatter_ring
from mpiring.algorithms.scatter_ring import scatter_ring

ALGORITHMS: dict[str, dict[str, Callable]] = {
    "broadcast": {"ring": broadcast_ring},
    "reduce": {"ring": reduce_ring},
    "allreduce": {"ring": allreduce_ring},
    "gather": {"ring": gather_ring},
    "allgather": {"ring": allgather_ring},
    "scatter": {"ring": scatter_ring},
    "reduce_scatter": {"ring": reduce_scatter_ring},
    "barrier": {"ring": barrier_ring},
}

DEFAULT_ALGORITHM = "auto"  # mpiring.selection picks by message and world size
