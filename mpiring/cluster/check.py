"""A check of an emulated cluster (or any cluster), run as an MPI job on every rank:

    mpiring cluster run --ranks-per-node 2 -- python -m mpiring.cluster.check [--bytes 8388608]

It checks that MPI sees the nodes (`Split_type(COMM_TYPE_SHARED)` gives one communicator per
node, host names differ between nodes and agree within one), that mpiring's collectives give what
mpi4py's own give, and times one large allreduce. Rank 0 prints one JSON line (prefixed
`mpiring.cluster.check: `) and every rank exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import Any

PREFIX = "mpiring.cluster.check: "


def _collectives(comm: Any, world: Any) -> dict[str, bool]:
    """Each collective of mpiring against mpi4py's native one, on float64 (exact sums of integers)."""
    import numpy as np
    from mpi4py import MPI

    rank, size = world.Get_rank(), world.Get_size()
    rows = 3 * size
    x = np.arange(rows * 5, dtype=np.float64).reshape(rows, 5) + 100.0 * rank
    results: dict[str, bool] = {}

    expected = np.empty_like(x)
    world.Allreduce(x, expected, op=MPI.SUM)
    results["allreduce"] = bool(np.array_equal(comm.allreduce(x), expected))

    root_x = x if rank == 1 % size else np.zeros_like(x)
    expected = root_x.copy()
    world.Bcast(expected, root=1 % size)
    results["broadcast"] = bool(np.array_equal(comm.broadcast(root_x.copy(), root=1 % size), expected))

    expected = np.empty((size * rows, 5))
    world.Allgather(x, expected)
    results["allgather"] = bool(np.array_equal(np.asarray(comm.allgather(x)).reshape(expected.shape), expected))

    expected = np.empty_like(x) if rank == 0 else None
    world.Reduce(x, expected, op=MPI.SUM, root=0)
    got = comm.reduce(x, root=0)
    results["reduce"] = bool(np.array_equal(got, expected)) if rank == 0 else got is None

    expected = np.empty((rows // size, 5))
    world.Reduce_scatter_block(x, expected, op=MPI.SUM)
    results["reduce_scatter"] = bool(np.array_equal(comm.reduce_scatter(x), expected))

    expected = np.empty_like(x)
    world.Alltoall(x, expected)
    results["alltoall"] = bool(np.array_equal(comm.alltoall(x), expected))

    expected = np.empty((size * rows, 5)) if rank == 0 else None
    world.Gather(x, expected, root=0)
    got = comm.gather(x, root=0)
    results["gather"] = bool(np.array_equal(np.asarray(got).reshape(expected.shape), expected)) if rank == 0 \
        else got is None
    comm.barrier()
    results["barrier"] = True
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpiring.cluster.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=8 * 1024 * 1024, help="size of the timed allreduce")
    args = parser.parse_args(argv)

    import numpy as np
    from mpi4py import MPI

    import mpiring

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    host = socket.gethostname()
    with open("/proc/sys/kernel/random/boot_id") as file:
        machine = file.read().strip()
    facts = world.gather({"rank": rank, "host": host, "local_rank": local.Get_rank(),
                          "local_size": local.Get_size(), "machine": machine}, root=0)
    comm = mpiring.Communicator()
    checks = _collectives(comm, world)
    big = np.ones(max(1, args.bytes // 4), dtype=np.float32)
    comm.allreduce(big[:1024])  # warm: plans, connections
    comm.barrier()
    started = time.perf_counter()
    total = comm.allreduce(big)
    seconds = world.allreduce(time.perf_counter() - started, op=MPI.MAX)
    checks["large_allreduce"] = bool(np.all(total == world.Get_size()))
    every = world.gather(checks, root=0)
    ok = True
    if rank == 0:
        assert facts is not None and every is not None
        merged = {name: all(c[name] for c in every) for name in every[0]}
        hosts_of_node: dict[str, set[int]] = {}
        for fact in facts:
            hosts_of_node.setdefault(fact["host"], set()).add(fact["rank"])
        report = {
            "world_size": world.Get_size(), "hosts": [f["host"] for f in facts],
            "local_sizes": [f["local_size"] for f in facts], "local_ranks": [f["local_rank"] for f in facts],
            "one_machine": len({f["machine"] for f in facts}) == 1, "checks": merged,
            "allreduce_bytes": int(big.nbytes), "allreduce_seconds": seconds,
        }
        # Split_type's nodes must be the host names' nodes.
        merged["nodes_match_hosts"] = all(f["local_size"] == len(hosts_of_node[f["host"]]) for f in facts)
        ok = all(merged.values())
        print(PREFIX + json.dumps(report), flush=True)
    ok = world.bcast(ok, root=0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
