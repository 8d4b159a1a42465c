"""An emulated cluster on one Linux machine: N "nodes" as network namespaces joined by shaped links.

    mpiring cluster up --nodes 2 --rate 1gbit          # as root; python -m mpiring.cluster works too
    mpiring cluster run --ranks-per-node 2 -- python -m mpiring.cluster.check
    mpiring cluster status                             # each link's TX/RX byte counters
    mpiring cluster down

Each node is a network namespace with its own loopback, one interface (eth0) with an address on a
private /24, and its own host name (a UTS namespace made at launch). A veth pair plugs each node
into one bridge in the root namespace, which holds the subnet's .254 so that the launcher
(mpiexec or mpirun, run in the root namespace) reaches the daemons it starts on the nodes. Nodes
have no default route: their traffic stays between the namespaces and the bridge.

    root namespace:   mpiexec ──(control)──┐
                                           │ 10.77.0.254
                               ┌───────── bridge <prefix>-br ─────────┐
                          <prefix>-v0   (tbf: rate into node0)   <prefix>-v1
                               │                                      │
                 ┌──── netns <prefix>-node0 ───┐      ┌──── netns <prefix>-node1 ───┐
                 │ eth0 10.77.0.1, tbf (out)   │      │ eth0 10.77.0.2, tbf (out)   │
                 │ hostname node0, ranks 0..K-1│      │ hostname node1, ranks K..2K-1│
                 └─────────────────────────────┘      └─────────────────────────────┘

Every link is shaped both ways with a token bucket (`tc qdisc tbf`): the node's eth0 limits what
the node sends, the bridge-side veth what it receives, like a full-duplex switch port at `rate`.

Two traps, both handled by `run` (see docs/cluster.md): namespaces do not separate shared memory,
so MPI would pass messages between "nodes" through it unless told to use TCP between nodes
(MPICH: UCX_TLS=tcp,self; Open MPI: the tcp, self and sm BTLs with TCP kept to the subnet); and
every node shares the machine's cores, so BLAS runs one thread per rank (mpiring itself finds that
the nodes share one machine, by its boot id, and does not busy-poll). Check the byte counters
(`status`, `link_bytes()`) to see that data crossed the links.

Needs root, iproute2 (`ip`, `tc`) and util-linux (`unshare`). The core of mpiring does not import
this package.
"""

from __future__ import annotations

from mpiring.cluster.network import (
    ClusterError,
    LinkCounters,
    NodeStatus,
    Topology,
    available,
)
from mpiring.cluster.runner import EmulatedCluster, detect_mpi

__all__ = [
    "ClusterError",
    "EmulatedCluster",
    "LinkCounters",
    "NodeStatus",
    "Topology",
    "available",
    "detect_mpi",
]
