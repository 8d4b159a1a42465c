"""The cost model's message pattern is mpiring's: on virtual node maps in node order, every
algorithm of the collectives the model knows (and `auto`) hands MPI on each rank exactly the bytes
and messages mpiring.cost_model.bytes_sent counts; and `calibrate` fits a fabric and saves it."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
from mpi4py import MPI

import mpiring
from mpiring import cost_model

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
LENGTHS = sorted({1, N, 13, 40_001, (3 << 20) // 8 + 5})  # float64 items; the last cuts pipeline segments
ROOTS = sorted({0, N - 1})
SPECS = sorted({"", "2", str(N)})  # one node; 2 nodes (2 x 1 at 2 ranks, 2 x 2 at 4); one rank per node
CALLS = [(c, a) for c in cost_model.COLLECTIVES for a in [*cost_model.algorithms(c), "auto"]]


@pytest.fixture(params=SPECS, ids=lambda spec: f"nodes={spec or 'mpi'}")
def grid(request, monkeypatch):
    """A communicator on a node map of equal nodes in node order, and (nodes, ranks per node)."""
    monkeypatch.setenv("MPIRING_VIRTUAL_NODES", request.param)
    with mpiring.Communicator() as comm:
        nodes = comm._ring.nodes.nodes
        per_node = len(nodes[0])
        if any(node != tuple(range(i * per_node, (i + 1) * per_node)) for i, node in enumerate(nodes)):
            pytest.skip(f"the model takes equal nodes in node order, not {nodes}")
        yield comm, len(nodes), per_node


def _call(comm, collective: str, algorithm: str, length: int, root: int) -> int:
    """One call of `collective` on `length` float64 items (per rank; in all for gather and scatter,
    split as numpy.array_split cuts them and given as counts=, so no layout round runs first);
    returns the bytes the model takes."""
    x = np.full(length, RANK + 1.0)
    rows = [len(part) for part in np.array_split(np.empty(length), N)]
    if collective == "allreduce":
        comm.allreduce(x, algorithm=algorithm)
    elif collective == "broadcast":
        comm.broadcast(x, root=root, algorithm=algorithm)
    elif collective == "reduce":
        comm.reduce(x, root=root, algorithm=algorithm)
    elif collective == "gather":
        comm.gather(np.full(rows[RANK], RANK + 1.0), root=root, counts=rows,
                    out=np.empty(length) if RANK == root else None, algorithm=algorithm)
    elif collective == "scatter":
        comm.scatter(x if RANK == root else None, root=root, counts=rows, out=np.empty(rows[RANK]),
                     algorithm=algorithm)
    elif collective == "reduce_scatter":
        comm.reduce_scatter(x, algorithm=algorithm)
    else:
        getattr(comm, collective)(x, algorithm=algorithm)
    return x.nbytes


@pytest.mark.parametrize("collective,algorithm", CALLS, ids=lambda c: str(c))
def test_each_rank_sends_what_the_model_counts(grid, collective, algorithm):
    comm, nodes, per_node = grid
    for length in LENGTHS:
        for root in ROOTS if collective in ("broadcast", "reduce", "gather", "scatter") else [0]:
            comm.traffic.reset()
            nbytes = _call(comm, collective, algorithm, length, root)
            got = (comm.traffic.bytes_sent, comm.traffic.messages)
            want = cost_model.bytes_sent(collective, algorithm, nbytes, nodes, per_node, RANK, root=root,
                                         shared_cores=len(comm._ring.ranks_sharing_cores) == N)
            assert got == want, f"{collective} {algorithm} {length} items root {root} on {nodes} x {per_node}"


@pytest.mark.skipif(N < 2, reason="a ping-pong needs two ranks")
def test_calibrate_fits_and_saves_a_fabric(tmp_path):
    path = WORLD.bcast(str(tmp_path / "fabric.json"), root=0)
    with mpiring.Communicator() as comm:
        fabric = cost_model.calibrate(comm, out=path, sizes=(8, 4096, 65536, 1 << 20), repeats=4)
    for link in (fabric.intra, fabric.inter):
        assert 0 < link.alpha < 1 and math.isfinite(link.alpha)
        assert 0 < link.beta < 1e-3 and math.isfinite(link.beta)
    assert 0 < fabric.gamma < 1e-3
    assert WORLD.allgather(fabric) == [fabric] * N
    if RANK == 0:
        assert cost_model.Fabric.load(pathlib.Path(path)) == fabric
