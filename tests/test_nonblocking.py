"""Nonblocking collectives: the same oracle as the blocking ones, several in flight at once and
completed in any order, and progress made only by test()/wait()."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI
from oracles import all_inputs, assert_same, numpy_reduce, rank_input

import mpiring
from mpiring.algorithms import ALGORITHMS

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()


def _start_all(comm, seed):
    """Start one of every nonblocking collective; return (request, expected result) pairs."""
    x = all_inputs(seed, N, (2 * N + 3, 2), np.float64)
    total = numpy_reduce("sum", x)
    root = seed % N
    blocks = [rank_input(seed, k, (k % 3, 2), np.int32) for k in range(N)]
    started = [
        (comm.iallreduce(x[RANK]), total),
        (comm.ireduce_scatter(x[RANK], op="max"), np.array_split(numpy_reduce("max", x), N)[RANK]),
        (comm.iallgather(blocks[RANK]), np.concatenate(blocks)),
        (comm.ibroadcast(x[root] if RANK == root else np.zeros_like(x[0]), root=root), x[root]),
        (comm.ireduce(x[RANK], op="avg", root=root), numpy_reduce("avg", x) if RANK == root else None),
        (comm.igather(blocks[RANK], root=root), np.concatenate(blocks) if RANK == root else None),
        (comm.iscatter(x[root] if RANK == root else None, root=root), np.array_split(x[root], N)[RANK]),
        (comm.ibarrier(), None),
    ]
    return started


def _check(request, expected, what):
    got = request.wait()
    if expected is None:
        assert got is None, what
    else:
        assert_same(got, expected, what)


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
def test_many_in_flight_completed_in_any_order(comm, order):
    started = _start_all(comm, seed=len(order)) + _start_all(comm, seed=7)
    indices = list(range(len(started)))
    if order == "reverse":
        indices.reverse()
    elif order == "shuffled":
        np.random.default_rng(5).shuffle(indices)  # the same order on every rank
    for i in indices:
        _check(*started[i], f"request {i} ({order})")


@pytest.mark.skipif(N < 2, reason="needs ranks that wait in different orders")
def test_waiting_in_different_orders_on_different_ranks(comm):
    """Rank 0 waits for its requests last to first, the others first to last (as MPI allows).
    A wait() advances every collective in flight, so neither side is left waiting for a step the
    other has not posted (multi-step rings, large enough to leave the eager range)."""
    arrays = [all_inputs(s, N, 50_000, np.float64) for s in range(3)]
    requests = [comm.iallreduce(a[RANK], algorithm="ring", timeout=60) for a in arrays]
    order = [2, 1, 0] if RANK == 0 else [0, 1, 2]
    for i in order:
        assert_same(requests[i].wait(), numpy_reduce("sum", arrays[i]), f"request {i}")
    blocking = comm.allgather(np.array([RANK]))  # a blocking call with nothing in flight
    assert_same(blocking, np.arange(N), "allgather after")


def test_test_polls_to_completion(comm):
    started = _start_all(comm, seed=3)
    deadline = time.monotonic() + 60
    pending = list(started)
    while pending and time.monotonic() < deadline:
        pending = [(req, want) for req, want in pending if not req.test()]
    assert not pending, "test() never completed every request"
    for req, want in started:
        if want is not None:
            assert_same(req.result, want, "result after test()")


def test_result_before_completion_is_an_error(comm):
    request = comm.iallreduce(np.ones(4))
    if N > 1:
        # nothing has moved the collective past its first step yet on this rank
        with pytest.raises(RuntimeError, match="in flight"):
            _ = request.result
    assert_same(request.wait(), np.full(4, float(N)), "allreduce after wait")


@pytest.mark.parametrize("algorithm", list(ALGORITHMS["allreduce"]))
def test_iallreduce_every_algorithm_overlapping(comm, algorithm):
    arrays = [all_inputs(s, N, 1000 + s, np.float32) for s in range(4)]
    requests = [comm.iallreduce(a[RANK], algorithm=algorithm) for a in arrays]
    for a, request in zip(reversed(arrays), reversed(requests), strict=True):
        assert_same(request.wait(), numpy_reduce("sum", a), algorithm)


def test_blocking_call_while_nonblocking_in_flight(comm):
    x = all_inputs(21, N, 5000, np.int64)
    pending = comm.iallreduce(x[RANK])
    assert_same(comm.allgather(np.array([RANK])), np.arange(N), "blocking allgather in between")
    assert_same(pending.wait(), numpy_reduce("sum", x), "iallreduce finished afterwards")


@pytest.mark.skipif(N < 2, reason="a timeout needs a rank that does not come")
def test_timeout_names_the_missing_rank():
    """The last rank skips an allreduce: the others raise within the timeout (+ 2 s), naming
    the collective, the algorithm and the peer they wait for."""
    comm = mpiring.Communicator()  # a fresh one: a timed-out communicator is not reused
    missing = N - 1
    if RANK != missing:
        started = time.monotonic()
        with pytest.raises(mpiring.CollectiveTimeout) as caught:
            comm.allreduce(np.ones(8), algorithm="ring", timeout=1.0)
        elapsed = time.monotonic() - started
        assert elapsed < 1.0 + 2.0, elapsed
        text = str(caught.value)
        assert "allreduce (ring) timed out after 1 s" in text, text
        assert caught.value.collective == "allreduce" and caught.value.algorithm == "ring"
        if RANK == (missing + 1) % N:  # the missing rank's right neighbour waits on it directly
            assert f"receive from rank {missing}" in text, text
    WORLD.Barrier()



def test_requests_tested_once_and_dropped_are_bounded_and_finish(monkeypatch):
    """A program that starts nonblocking collectives, tests each once and drops it: those in
    flight never hold more than MPIRING_INFLIGHT_BYTES (a new call first waits for the oldest),
    later calls finish them, and then nothing keeps them (or their buffers) alive."""
    import gc
    import weakref

    bound = 1 << 20
    monkeypatch.setenv("MPIRING_INFLIGHT_BYTES", str(bound))
    comm = mpiring.Communicator()
    x = all_inputs(31, N, 16 * 1024, np.float32)  # 64 KiB per call: holds 128 KiB
    kept, dropped = [], []
    for k in range(40):
        request = comm.iallreduce(x[RANK] + k)
        request.test()
        assert sum(r.holds for r in comm._ring.in_flight) <= bound
        (kept if k % 8 == 0 else dropped).append(request if k % 8 == 0 else weakref.ref(request))
        del request
    for k, request in zip(range(0, 40, 8), kept, strict=True):
        assert_same(request.wait(), numpy_reduce("sum", [a + k for a in x]), f"iallreduce {k}")
    for _ in range(1000):  # blocking calls advance what is left in flight
        if not comm.allreduce(np.array([len(comm._ring.in_flight)])).item():
            break
        comm.barrier()
    assert not comm._ring.in_flight
    gc.collect()
    assert all(ref() is None for ref in dropped)
    comm.free()
