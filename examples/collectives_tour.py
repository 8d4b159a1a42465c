"""A tour of every mpiring collective on small arrays, printed rank by rank.

    mpirun -n 4 python examples/collectives_tour.py
"""

from __future__ import annotations

import numpy as np

import mpiring

LINE = 96  # bytes per printed line: ranks send fixed-width lines so one gather collects them


def show(comm: mpiring.Communicator, title: str, value: object) -> None:
    """Print every rank's `value` in rank order, gathered to rank 0 with mpiring itself."""
    text = f"  rank {comm.rank}: {value}".encode()[:LINE].ljust(LINE)
    lines = comm.gather(np.frombuffer(text, np.uint8).reshape(1, LINE), root=0)
    if comm.rank == 0:
        print(title)
        for row in lines:
            print(row.tobytes().decode().rstrip())


def main() -> None:
    comm = mpiring.Communicator()
    r, n = comm.rank, comm.size
    x = np.arange(4) + 10 * r  # rank r holds [10r, 10r+1, 10r+2, 10r+3]
    show(comm, f"each rank's x (world size {n})", x)
    show(comm, "broadcast(x, root=0): everyone gets rank 0's x", comm.broadcast(x, root=0))
    show(comm, "reduce(x, 'sum', root=0): rank 0 gets the sum, others None", comm.reduce(x, "sum", root=0))
    show(comm, "allreduce(x, 'max'): everyone gets the elementwise max", comm.allreduce(x, "max"))
    show(comm, "allreduce(x * 1.0, 'avg'): the mean over ranks", comm.allreduce(x * 1.0, "avg"))
    show(comm, "gather(x[:r+1], root=0): uneven blocks joined at rank 0", comm.gather(x[: r + 1], root=0))
    show(comm, "allgather([r]): everyone gets every rank's number", comm.allgather(np.array([r])))
    data = np.arange(2 * n + 1) if r == 0 else None
    show(comm, f"scatter(arange({2 * n + 1}), root=0): array_split parts", comm.scatter(data, root=0))
    show(comm, "reduce_scatter(ones(2n+1) * r): part r of the sum", comm.reduce_scatter(np.ones(2 * n + 1) * r))
    show(comm, "alltoall(arange(n) + 10r): block j of rank i goes to rank j", comm.alltoall(np.arange(n) + 10 * r))
    counts = [j % 2 + 1 for j in range(n)]  # rank r sends 1 row to even ranks, 2 to odd ones
    mine = np.arange(sum(counts)) + 10 * r
    show(comm, f"alltoallv(x, send_counts={counts}): uneven blocks", comm.alltoallv(mine, counts))
    show(comm, "scan(x, 'sum'): the sum over ranks 0..r", comm.scan(x, "sum"))
    show(comm, "exscan(x, 'sum'): the sum over ranks 0..r-1 (rank 0: None)", comm.exscan(x, "sum"))
    comm.traffic.reset()
    comm.barrier()
    # auto runs the dissemination barrier: ceil(lg n) rounds, one message sent and one received in each
    show(comm, "barrier(): dissemination, ceil(lg n) rounds; messages handed to MPI", comm.traffic.messages)


if __name__ == "__main__":
    main()
