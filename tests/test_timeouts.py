"""Timeouts: a rank that skips a collective makes the others raise `mpiring.CollectiveTimeout`
within timeout + 2 s, naming the collective, the algorithm, the step and the peer each was
waiting for; waiting polls with a growing pause, so no wrong answer and no silent hang.

Every fault runs on a fresh communicator: a timed-out one keeps messages in flight for ever
and is never used again (nor freed, which would need the skipping rank to match them).
"""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest
from faults import attempt, describe, everyone
from mpi4py import MPI

import mpiring
from mpiring.algorithms import ALGORITHMS

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
T = 0.25  # seconds: short, since every rank but one sits out the whole of it
BOUND = T + 2.0  # a timed-out rank must raise within 2 s of its timeout

needs_two = pytest.mark.skipif(N < 2, reason="needs a rank to skip and one to wait")


def _start(comm: mpiring.Communicator, collective: str, blocking: bool, root: int, **kwargs):
    """Call `collective` with a small message (sent eagerly) in its blocking or nonblocking form."""
    x = np.arange(2 * N, dtype=np.float64)
    arguments = {
        "broadcast": dict(x=x, root=root), "reduce": dict(x=x, root=root), "allreduce": dict(x=x),
        "gather": dict(x=x, root=root), "allgather": dict(x=x),
        "scatter": dict(x=x if RANK == root else None, root=root), "reduce_scatter": dict(x=x), "barrier": {},
        "alltoall": dict(x=x), "alltoallv": dict(x=x, send_counts=[2] * N), "scan": dict(x=x), "exscan": dict(x=x),
    }[collective]
    if blocking:
        return getattr(comm, collective)(**arguments, **kwargs)
    return getattr(comm, "i" + collective)(**arguments, **kwargs).wait()


# Every algorithm blocking; "auto" through the nonblocking form (wait()) for a reduction, a
# collective that first exchanges its layout, and the barrier (wait() shares complete() with them all).
NONBLOCKING = ("allreduce", "gather", "barrier")
CASES = [(c, a, True) for c in ALGORITHMS for a in ALGORITHMS[c]] + [(c, "auto", False) for c in NONBLOCKING]


def _fault(collective: str) -> tuple[int, int, set[int]]:
    """(rank that skips, root, ranks that must time out) for a skipped `collective`.

    Small messages are sent eagerly, so a rank that needs nothing from the missing one may
    correctly finish: in a reduce, the leaves of a tree only send. Broadcast and scatter flow
    out of the root, so the root skips them; in a reduce the root needs everyone, so a
    non-root skips and the root must notice; a scan needs only lower ranks, so rank 0 skips.
    The other collectives need every rank everywhere.
    """
    if collective in ("broadcast", "scatter"):
        return N - 1, N - 1, set(range(N - 1))
    if collective == "reduce":
        return N - 1, 0, {0}
    if collective in ("scan", "exscan"):  # every rank's prefix but rank 0's holds rank 0's data
        return 0, 0, set(range(1, N))
    skipper = N // 2
    return skipper, 0, set(range(N)) - {skipper}


@needs_two
@pytest.mark.parametrize(("collective", "algorithm", "blocking"), CASES,
                         ids=[f"{c}-{a}-{'blocking' if b else 'nonblocking'}" for c, a, b in CASES])
def test_a_skipped_collective_times_out_naming_what_and_whom(collective, algorithm, blocking):
    comm = mpiring.Communicator()
    skipper, root, must_raise = _fault(collective)
    mine = None
    if RANK != skipper:
        mine = attempt(lambda: _start(comm, collective, blocking, root, algorithm=algorithm, timeout=T))
    outcomes = everyone(mine)
    report = describe(outcomes)
    raised = [o for o in outcomes if o is not None and o.error]
    assert {o.rank for o in raised} >= must_raise, report
    for o in outcomes:
        if o is not None and not o.error:  # finished without the skipper: only by sending to it
            assert o.rank not in must_raise and o.rank != root, report
    for o in raised:
        assert o.error == "CollectiveTimeout", report
        assert o.seconds <= BOUND, report
        assert o.attributes["collective"] == collective, report
        # gather, all-gather and scatter first agree on a layout, before "auto" chooses
        assert o.attributes["algorithm"] in (algorithm, *ALGORITHMS[collective]), report
        assert o.attributes["waiting_on"], report
        assert all(peer.startswith(("receive from rank ", "send to rank ")) for peer in o.attributes["waiting_on"])
        head = f"{collective} ({o.attributes['algorithm']}) timed out after {T:g} s in step "
        assert o.message.startswith(head), report
    # Each rank names the peer it waits for; the chain of waits ends at the rank that skipped.
    named = {int(peer.rsplit(" ", 1)[1]) for o in raised for peer in o.attributes["waiting_on"]}
    assert skipper in named, report
    assert named <= set(range(N)), report


@needs_two
def test_the_skipped_ranks_neighbour_names_it():
    """In the ring all-reduce the skipper's right neighbour receives from it in step 0."""
    comm = mpiring.Communicator(timeout=T)
    skipper = 0
    mine = None if RANK == skipper else attempt(lambda: comm.allreduce(np.ones(4)))
    outcomes = everyone(mine)
    right = outcomes[(skipper + 1) % N]
    assert right.error == "CollectiveTimeout" and right.attributes["step"] == 0, describe(outcomes)
    assert right.attributes["waiting_on"] == [f"receive from rank {skipper}"], describe(outcomes)
    assert f"still waiting to receive from rank {skipper}" in right.message


@pytest.mark.skipif(N < 3, reason="needs a rank to skip and two to wait")
@pytest.mark.parametrize("blocking", [True, False])
def test_the_first_timeout_ends_its_peers_waits_with_the_same_error(blocking):
    """Rank 0 times out long before the others would: its notice ends their waits in that call
    with CollectiveTimeout, not a mismatch and not their own 30 s."""
    comm = mpiring.Communicator(timeout=T if RANK == 0 else 30.0)
    mine = None
    if RANK != N - 1:
        mine = attempt(lambda: _start(comm, "allreduce", blocking, 0, algorithm="ring"))
    outcomes = everyone(mine)
    assert outcomes[0].error == "CollectiveTimeout" and outcomes[0].attributes["notice_from"] is None, \
        describe(outcomes)
    assert "left it" not in outcomes[0].message, describe(outcomes)
    for o in outcomes[1:N - 1]:
        assert o.error == "CollectiveTimeout" and o.seconds <= BOUND, describe(outcomes)
        assert o.message.startswith(f"allreduce (ring) timed out after {T:g} s in step "), describe(outcomes)
        # rank 0's notice, or that of a rank it ended the wait of (each leaves one too)
        assert re.search(rf"rank {o.attributes['notice_from']} timed out in this call and left it", o.message), \
            describe(outcomes)
        assert o.attributes["notice_from"] in range(N - 1), describe(outcomes)  # a rank that timed out
        assert o.attributes["waiting_on"], describe(outcomes)


@needs_two
def test_mpiring_timeout_sets_the_default_and_a_call_overrides_it(monkeypatch):
    monkeypatch.setenv("MPIRING_TIMEOUT", "0.3")
    comm = mpiring.Communicator()
    assert comm.timeout == 0.3
    mine = None if RANK == 0 else attempt(lambda: comm.barrier())
    outcomes = everyone(mine)
    for o in outcomes[1:]:
        assert o.error == "CollectiveTimeout" and "after 0.3 s" in o.message, describe(outcomes)
        assert o.seconds <= 0.3 + 2.0, describe(outcomes)

    monkeypatch.setenv("MPIRING_TIMEOUT", "600")
    comm = mpiring.Communicator()
    mine = None if RANK == 0 else attempt(lambda: comm.allreduce(np.ones(3), timeout=0.25))
    outcomes = everyone(mine)
    for o in outcomes[1:]:
        assert o.error == "CollectiveTimeout" and "after 0.25 s" in o.message, describe(outcomes)
        assert o.seconds <= 0.25 + 2.0, describe(outcomes)


def test_a_late_rank_within_the_timeout_is_no_fault():
    """A rank arriving late, but inside the timeout, gets the right answer everywhere."""
    comm = mpiring.Communicator(timeout=30)
    if RANK == 0:
        time.sleep(0.3)
    x = np.full(5, RANK + 1.0)
    np.testing.assert_array_equal(comm.allreduce(x), np.full(5, N * (N + 1) / 2))
    request = comm.ibroadcast(np.full(3, float(RANK)), root=N - 1)
    np.testing.assert_array_equal(request.wait(), np.full(3, N - 1.0))
    comm.free()


@needs_two
def test_test_only_looks_and_wait_is_what_raises():
    """test() never times out: it keeps returning False past the deadline; wait() then raises,
    and `result` raises that timeout again (docs/reliability.md)."""
    comm = mpiring.Communicator(timeout=T)
    mine = None
    if RANK != 0:
        request = comm.iallreduce(np.ones(4))
        polls = []
        deadline = time.monotonic() + T + 0.1
        while time.monotonic() < deadline:
            polls.append(request.test())
            time.sleep(0.02)
        mine = attempt(request.wait)
        mine.value = (any(polls), attempt(lambda: request.result).error)
    outcomes = everyone(mine)
    for o in outcomes[1:]:
        assert o.error == "CollectiveTimeout" and o.seconds <= BOUND, describe(outcomes)
        assert o.value == (False, "CollectiveTimeout"), describe(outcomes)  # result: the request's error


def test_a_bad_timeout_is_refused_before_any_message_moves(comm, monkeypatch):
    for bad in (0, -1, float("nan"), "5", True):
        with pytest.raises(mpiring.ArgumentError, match="'timeout'"):
            comm.allreduce(np.ones(2), timeout=bad)
    with pytest.raises(mpiring.ArgumentError, match="'timeout'"):
        mpiring.Communicator(timeout=-2)
    monkeypatch.setenv("MPIRING_TIMEOUT", "soon")
    with pytest.raises(mpiring.ArgumentError, match="MPIRING_TIMEOUT"):
        mpiring.Communicator()
    np.testing.assert_array_equal(comm.allreduce(np.ones(2)), np.full(2, float(N)))


def test_ten_minutes_by_default_and_no_limit_when_asked(monkeypatch):
    """No job hangs for ever by default: torch.distributed's 10 minutes, unless turned off."""
    monkeypatch.delenv("MPIRING_TIMEOUT", raising=False)
    with mpiring.Communicator() as comm:
        assert comm.timeout == 600.0
    with mpiring.Communicator(timeout=math.inf) as comm:
        assert comm.timeout is None
        np.testing.assert_array_equal(comm.allreduce(np.ones(2)), np.full(2, float(N)))
    for text in ("none", "inf", "off"):
        monkeypatch.setenv("MPIRING_TIMEOUT", text)
        with mpiring.Communicator() as comm:
            assert comm.timeout is None
