"""Fitting a fabric on the machines at hand: ping-pong inside a node and between nodes, and
numpy.add for gamma (`calibrate`)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

from mpiring.cost_model.fabric import Fabric, Link, default_path

CALIBRATION_SIZES = tuple(8 << (3 * i) for i in range(7)) + (4 << 20,)  # 8 B, 64 B, ..., 2 MiB, 4 MiB


def _fit(sizes: Sequence[int], seconds: Sequence[float]) -> Link:
    """alpha from the smallest message, beta from the slope between the two largest: the link's
    sustained rate. A least-squares line through every size would take its slope from the middle
    sizes too, which a shaped or switched link passes in a burst at a higher rate (a token bucket's
    burst, a switch's buffers), and underestimate what large collectives pay."""
    order = sorted(range(len(sizes)), key=sizes.__getitem__)
    small, second, large = order[0], order[-2], order[-1]
    slope = (seconds[large] - seconds[second]) / (sizes[large] - sizes[second])
    beta = float(slope) if slope > 0 else float(seconds[large]) / sizes[large]
    return Link(max(float(seconds[small]) - beta * sizes[small], 1e-9), beta)


def _ping_pong(comm: Any, pair: tuple[int, int], sizes: Sequence[int], repeats: int) -> list[float]:
    """Half the best round trip between the pair for each size (collective: the others wait)."""
    import numpy

    rank, (a, b) = comm.Get_rank(), pair
    times = []
    for size in sizes:
        buf = numpy.zeros(size, numpy.uint8)
        best_time = math.inf
        comm.Barrier()
        if rank in pair:
            other = b if rank == a else a
            for _ in range(max(2, repeats if size <= 1 << 16 else repeats // 4)):
                start = time.perf_counter()
                if rank == a:
                    comm.Send(buf, other, 7)
                    comm.Recv(buf, other, 7)
                else:
                    comm.Recv(buf, other, 7)
                    comm.Send(buf, other, 7)
                best_time = min(best_time, (time.perf_counter() - start) / 2)
        times.append(comm.bcast(best_time, root=a))
    return times


def _gamma(nbytes: int = 32 << 20, repeats: int = 5) -> float:
    """Seconds per byte reduced: numpy.add of two float64 arrays of `nbytes`, into the first."""
    import numpy

    a, b = numpy.ones(nbytes // 8), numpy.ones(nbytes // 8)
    best_time = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        numpy.add(a, b, out=a)
        best_time = min(best_time, time.perf_counter() - start)
    return best_time / nbytes


def calibrate(comm: Any = None, out: str | os.PathLike | None = None, sizes: Sequence[int] = CALIBRATION_SIZES,
              repeats: int = 20) -> Fabric:
    """Collective over an mpiring.Communicator or mpi4py intracommunicator (default COMM_WORLD):
    ping-pong between two ranks of one node and two of different nodes, fit alpha and beta per
    link class, time numpy.add for gamma. Every rank returns the fabric; rank 0 saves it to `out`
    (default: default_path()). One node: inter = intra; one rank per node: intra = inter."""
    from mpi4py import MPI

    from mpiring import topology

    if comm is None:
        comm = MPI.COMM_WORLD
    base = comm.mpi if hasattr(comm, "mpi") else comm
    if base.Get_size() < 2:
        raise ValueError("calibrate needs at least two ranks (a ping-pong)")
    mine = base.Dup()
    try:
        nodes = comm._ring.nodes if hasattr(comm, "_ring") else topology.discover(mine)[0]
        shared = next((node for node in nodes.nodes if len(node) > 1), None)
        intra_pair = (shared[0], shared[1]) if shared else None
        inter_pair = (nodes.leaders[0], nodes.leaders[1]) if len(nodes.nodes) > 1 else None
        intra = _fit(sizes, _ping_pong(mine, intra_pair, sizes, repeats)) if intra_pair else None
        inter = _fit(sizes, _ping_pong(mine, inter_pair, sizes, repeats)) if inter_pair else None
        gamma = mine.bcast(_gamma() if mine.Get_rank() == 0 else None, root=0)
    finally:
        mine.Free()
    fabric = Fabric(intra or inter, inter or intra, gamma, f"calibrated: {nodes.describe()}")
    if base.Get_rank() == 0:
        fabric.save(default_path() if out is None else out)
    return fabric
