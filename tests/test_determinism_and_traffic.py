"""All-reduce results are bitwise identical on every rank and follow one documented reduction
order (so they repeat run to run); the traffic counters match the ring's byte counts."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from mpi4py import MPI
from oracles import rank_input

from mpiring.algorithms import ALGORITHMS
from mpiring.collectives import LAYOUT_BYTES, layout_in_slots, layout_slot_bytes
from mpiring.engine.partition import split_bounds

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()


def _random_floats(rank: int, length: int, dtype) -> np.ndarray:
    return np.random.default_rng([99, rank]).standard_normal(length).astype(dtype)


def _ring_order_sum(arrays: list[np.ndarray]) -> np.ndarray:
    """The sum in the order the ring reduce-scatter documents: chunk c starts at rank c+1 and
    each next rank adds its own data to the partial it receives, ending at rank c."""
    n = len(arrays)
    bounds = split_bounds(arrays[0].size, n)
    result = np.empty_like(arrays[0])
    for c in range(n):
        lo, hi = bounds[c], bounds[c + 1]
        partial = arrays[(c + 1) % n][lo:hi].copy()
        for hop in range(2, n + 1):
            partial = arrays[(c + hop) % n][lo:hi] + partial
        result[lo:hi] = partial
    return result


@pytest.mark.parametrize("algorithm", list(ALGORITHMS["allreduce"]))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_allreduce_bitwise_identical_on_every_rank(comm, dtype, algorithm):
    for length in (1, N, 1000, 65_537):
        x = _random_floats(RANK, length, dtype)
        got = comm.allreduce(x, algorithm=algorithm)
        everyone = WORLD.allgather(got.tobytes())
        assert all(b == everyone[0] for b in everyone), f"ranks disagree bitwise at length {length}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_allreduce_follows_the_documented_order(comm, dtype):
    """Bitwise equal to the documented order, so a rerun at this world size gives the same bits."""
    for length in (7, 1000, 65_537):
        arrays = [_random_floats(k, length, dtype) for k in range(N)]
        got = comm.allreduce(arrays[RANK], algorithm="ring")
        assert got.tobytes() == _ring_order_sum(arrays).tobytes(), f"length {length}"
        again = comm.allreduce(arrays[RANK], algorithm="ring")
        assert again.tobytes() == got.tobytes()


def _sent_and_total(comm, call) -> tuple[int, int, int]:
    comm.traffic.reset()
    call()
    sent = comm.traffic.bytes_sent
    total = WORLD.allreduce(sent)
    received = WORLD.allreduce(comm.traffic.bytes_received)
    return sent, total, received


@pytest.mark.parametrize("length", [0, 1, N + 1, 1000, 100_003])
def test_traffic_matches_the_ring_formulas(comm, length):
    item = 8
    x = rank_input(length, RANK, length, np.float64)
    size = length * item
    slack = item * (N - 1)  # chunk rounding: each step's chunk is at most one element off n/p

    sent, total, received = _sent_and_total(comm, lambda: comm.allreduce(x, algorithm="ring"))
    assert abs(sent - 2 * (N - 1) / N * size) <= 2 * slack
    assert total == 2 * (N - 1) * size and received == total  # each chunk crosses n-1 links twice

    rows = x.reshape(-1, 1)
    sent, total, received = _sent_and_total(comm, lambda: comm.reduce_scatter(rows, algorithm="ring"))
    assert abs(sent - (N - 1) / N * size) <= slack
    assert total == (N - 1) * size and received == total

    # scattered: every chunk but its own straight to its owner, the same bytes in all
    sent, total, received = _sent_and_total(comm, lambda: comm.reduce_scatter(rows, algorithm="scattered"))
    assert sent == size - len(np.array_split(rows, N)[RANK]) * item
    assert total == (N - 1) * size and received == total

    # reduce, scattered: the reduce-scatter's bytes, then every chunk but the root's to the root
    chunks = [len(chunk) * item for chunk in np.array_split(x, N)]
    sent, total, received = _sent_and_total(comm, lambda: comm.reduce(x, root=0, algorithm="scattered"))
    assert sent == size - chunks[RANK] + (chunks[RANK] if RANK else 0)
    assert total == (N - 1) * size + size - chunks[0] and received == total

    # all-gather of `length` rows per rank; first the ranks trade one layout record each
    layout = (N - 1) * (layout_slot_bytes(comm._ring) if layout_in_slots(comm._ring) else LAYOUT_BYTES)
    for algorithm in ("ring", "scattered"):
        sent, total, received = _sent_and_total(comm, partial(comm.allgather, x, algorithm=algorithm))
        assert sent == (N - 1) * size + layout, algorithm
        assert total == N * sent and received == total, algorithm

    sent, total, _ = _sent_and_total(comm, lambda: comm.broadcast(x, root=0, algorithm="ring"))
    assert total == (N - 1) * size  # every link of the chain but the one back to the root
    assert sent == (size if RANK != N - 1 and N > 1 else 0)

    sent, total, _ = _sent_and_total(comm, lambda: comm.barrier(algorithm="ring"))
    assert total == 0 and comm.traffic.messages == (0 if N == 1 else (1 if RANK == N - 1 else 2))
