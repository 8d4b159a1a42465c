"""Every algorithm, by collective and name: the one table `algorithm=` is looked up in.

One module per algorithm (MPICH's layout); each module's docstring gives its steps, a diagram,
the bytes each rank moves and its alpha-beta-gamma cost. The rings are the bandwidth-optimal
choice for large messages; the trees, halving/doubling and Bruck are latency-optimal for small
ones. The node_* algorithms compose flat ones inside each node and across nodes
(mpiring.engine.ring.SubRing, mpiring.topology). mpiring.selection decides between them for
algorithm="auto". A ring module's `*_steps` generator is both its registered algorithm and the
building block other algorithms reuse.
"""

from __future__ import annotations

from collections.abc import Callable

from mpiring.algorithms.allgather_bruck import allgather_bruck
from mpiring.algorithms.allgather_node_leader import allgather_node_leader
from mpiring.algorithms.allgather_ring import allgather_steps
from mpiring.algorithms.allgather_scattered import allgather_scattered
from mpiring.algorithms.allreduce_node_lanes import allreduce_node_lanes
from mpiring.algorithms.allreduce_node_leader import allreduce_node_leader
from mpiring.algorithms.allreduce_node_pipelined import allreduce_node_pipelined
from mpiring.algorithms.allreduce_rabenseifner import allreduce_rabenseifner
from mpiring.algorithms.allreduce_recursive_doubling import allreduce_recursive_doubling
from mpiring.algorithms.allreduce_ring import allreduce_ring
from mpiring.algorithms.allreduce_ring_pipelined import allreduce_ring_pipelined
from mpiring.algorithms.allreduce_scattered import allreduce_scattered
from mpiring.algorithms.alltoall_bruck import alltoall_bruck
from mpiring.algorithms.alltoall_node_leader import alltoall_node_leader
from mpiring.algorithms.alltoall_pairwise import alltoall_pairwise
from mpiring.algorithms.alltoall_scattered import alltoall_scattered
from mpiring.algorithms.barrier_dissemination import barrier_dissemination
from mpiring.algorithms.barrier_node_leader import barrier_node_leader
from mpiring.algorithms.barrier_ring import barrier_ring
from mpiring.algorithms.broadcast_binomial import broadcast_binomial
from mpiring.algorithms.broadcast_linear import broadcast_linear
from mpiring.algorithms.broadcast_node_leader import broadcast_node_leader
from mpiring.algorithms.broadcast_ring import broadcast_steps
from mpiring.algorithms.gather_binomial import gather_binomial
from mpiring.algorithms.gather_linear import gather_linear
from mpiring.algorithms.gather_node_leader import gather_node_leader
from mpiring.algorithms.gather_ring import gather_steps
from mpiring.algorithms.reduce_binomial import reduce_binomial
from mpiring.algorithms.reduce_node_leader import reduce_node_leader
from mpiring.algorithms.reduce_ring import reduce_ring
from mpiring.algorithms.reduce_scatter_node_leader import reduce_scatter_node_leader
from mpiring.algorithms.reduce_scatter_recursive_halving import reduce_scatter_recursive_halving
from mpiring.algorithms.reduce_scatter_ring import reduce_scatter_steps
from mpiring.algorithms.reduce_scatter_ring_pipelined import pipelined_reduce_scatter_steps
from mpiring.algorithms.reduce_scatter_scattered import reduce_scatter_scattered
from mpiring.algorithms.reduce_scattered import reduce_scattered
from mpiring.algorithms.scan_node_leader import scan_node_leader
from mpiring.algorithms.scan_recursive_doubling import scan_recursive_doubling
from mpiring.algorithms.scan_ring import scan_ring
from mpiring.algorithms.scatter_binomial import scatter_binomial
from mpiring.algorithms.scatter_linear import scatter_linear
from mpiring.algorithms.scatter_node_leader import scatter_node_leader
from mpiring.algorithms.scatter_ring import scatter_steps

ALGORITHMS: dict[str, dict[str, Callable]] = {
    "broadcast": {"ring": broadcast_steps, "binomial": broadcast_binomial, "linear": broadcast_linear,
                  "node_leader": broadcast_node_leader},
    "reduce": {"ring": reduce_ring, "binomial": reduce_binomial, "scattered": reduce_scattered,
               "node_leader": reduce_node_leader},
    "allreduce": {
        "ring": allreduce_ring,
        "ring_pipelined": allreduce_ring_pipelined,
        "recursive_doubling": allreduce_recursive_doubling,
        "rabenseifner": allreduce_rabenseifner,
        "scattered": allreduce_scattered,
        "node_lanes": allreduce_node_lanes,
        "node_pipelined": allreduce_node_pipelined,
        "node_leader": allreduce_node_leader,
    },
    "gather": {"ring": gather_steps, "binomial": gather_binomial, "linear": gather_linear,
               "node_leader": gather_node_leader},
    "allgather": {"ring": allgather_steps, "bruck": allgather_bruck, "scattered": allgather_scattered,
                  "node_leader": allgather_node_leader},
    "scatter": {"ring": scatter_steps, "binomial": scatter_binomial, "linear": scatter_linear,
                "node_leader": scatter_node_leader},
    "reduce_scatter": {
        "ring": reduce_scatter_steps,
        "ring_pipelined": pipelined_reduce_scatter_steps,
        "recursive_halving": reduce_scatter_recursive_halving,
        "scattered": reduce_scatter_scattered,
        "node_leader": reduce_scatter_node_leader,
    },
    "barrier": {"ring": barrier_ring, "dissemination": barrier_dissemination, "node_leader": barrier_node_leader},
    "alltoall": {"pairwise": alltoall_pairwise, "scattered": alltoall_scattered, "bruck": alltoall_bruck,
                 "node_leader": alltoall_node_leader},
    # the ranks know only their own counts, not the blocks Bruck would forward for others
    "alltoallv": {"pairwise": alltoall_pairwise, "scattered": alltoall_scattered},
    # one function each for scan and exscan (the collective says which)
    "scan": {"ring": scan_ring, "recursive_doubling": scan_recursive_doubling, "node_leader": scan_node_leader},
    "exscan": {"ring": scan_ring, "recursive_doubling": scan_recursive_doubling, "node_leader": scan_node_leader},
}

# The algorithms that take their output as their input (out=x, MPI_IN_PLACE): each reads every
# element of the input before it writes there. Any other runs on a copy (collectives.Output).
IN_PLACE = {("alltoall", "pairwise"), ("alltoallv", "pairwise"), ("scan", "ring"), ("scan", "recursive_doubling"),
            ("exscan", "ring"), ("exscan", "recursive_doubling")}

DEFAULT_ALGORITHM = "auto"  # mpiring.selection picks by message and world size
