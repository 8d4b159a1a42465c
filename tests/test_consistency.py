"""MPIRING_CHECK: every collective first compares a fingerprint of its call across the ranks
and raises CollectiveMismatchError on every rank, naming the ranks and the fields that differ.

Each field is made to differ on one rank (the last), at every world size from 2; the
communicator stays usable after each mismatch, and calls that are legitimately different per
rank (gather's row counts, scatter's None on non-roots) pass the check.
"""

from __future__ import annotations

import numpy as np
import pytest
from faults import attempt, describe, everyone
from mpi4py import MPI

import mpiring
from mpiring.algorithms import ALGORITHMS
from mpiring.consistency import CHECK_TAG, RECORD, CallMismatchError, wanted
from mpiring.engine.ring import Ring

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
ODD = N - 1  # the rank that calls differently
needs_two = pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")


@pytest.fixture(scope="module")
def checked():
    """A communicator with checks on (a mismatch leaves it usable, so one serves the module)."""
    comm = mpiring.Communicator(check=True, timeout=60)
    yield comm
    comm.free()


def _odd(mine, theirs):
    return theirs if RANK == ODD else mine


X = np.arange(6.0)
# (field, call every rank makes, words the message must hold)
FIELD_CASES = [
    ("collective", lambda c: c.allreduce(X) if RANK != ODD else c.barrier(), ["collective", "allreduce", "barrier"]),
    ("op", lambda c: c.allreduce(X, op=_odd("sum", "max")), ["op 'sum'", "'max'"]),
    ("dtype", lambda c: c.allreduce(X.astype(_odd(np.float64, np.float32))), ["dtype float64", "float32"]),
    ("dtype", lambda c: c.broadcast(X.astype(_odd(np.int64, np.uint64))), ["dtype int64", "uint64"]),
    ("shape", lambda c: c.allreduce(np.zeros(_odd(6, 7))), ["shape (6,)", "(7,)"]),
    ("shape", lambda c: c.reduce_scatter(np.zeros(_odd((2 * N, 2), (2, 2 * N)))), ["shape", f"({2 * N}, 2)"]),
    ("shape", lambda c: c.broadcast(np.zeros(_odd((2, 3), (3, 2)))), ["shape (2, 3)", "(3, 2)"]),
    ("row shape", lambda c: c.allgather(np.zeros((1, _odd(3, 4)))), ["row shape (3,)", "(4,)"]),
    ("row shape", lambda c: c.gather(np.zeros((2, _odd(3, 5))), root=0), ["row shape (3,)", "(5,)"]),
    ("root", lambda c: c.reduce(X, root=_odd(0, 1)), ["root 0", "1"]),
    ("root", lambda c: c.broadcast(X, root=_odd(0, 1)), ["root 0"]),
    ("root", lambda c: c.scatter(X if RANK in (0, 1) else None, root=_odd(0, 1)), ["root 0"]),
    ("root", lambda c: c.gather(X, root=_odd(0, 1)), ["root 0"]),
    ("algorithm", lambda c: c.allreduce(X, algorithm=_odd("auto", "ring")), ["algorithm 'auto'", "'ring'"]),
    ("algorithm", lambda c: c.barrier(algorithm=_odd("ring", "auto")), ["algorithm 'ring'", "'auto'"]),
]


@needs_two
@pytest.mark.parametrize(("field", "call", "words"), FIELD_CASES,
                         ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(FIELD_CASES)])
def test_each_field_that_differs_is_named_on_every_rank(checked, field, call, words):
    outcomes = everyone(attempt(lambda: call(checked)))
    report = describe(outcomes)
    for o in outcomes:
        assert o.error == "CallMismatchError", report
        assert o.attributes["fields"] == [field], report
        assert o.attributes["ranks"] == [ODD], report  # at 2 ranks the group holding rank 0 is the reference
        assert "MPIRING_CHECK" in o.message and all(w in o.message for w in words), report
        assert f"on rank {ODD}" in o.message, report
    assert len({o.message.split(": ", 1)[1] for o in outcomes}) == 1, report  # the same diagnosis everywhere
    # Nothing is left in flight: the communicator goes on working.
    np.testing.assert_array_equal(checked.allreduce(np.ones(2)), np.full(2, float(N)))


@needs_two
def test_several_fields_and_ranks_at_once(checked):
    """Every rank a different length, the last also another dtype: both fields, all groups."""
    x = np.zeros(3 + RANK, dtype=np.float32 if RANK == ODD else np.float64)
    outcomes = everyone(attempt(lambda: checked.allreduce(x)))
    for o in outcomes:
        assert o.error == "CallMismatchError" and o.attributes["fields"] == ["dtype", "shape"], describe(outcomes)
        groups = o.attributes["groups"]
        assert groups["shape"] == {f"({3 + k},)": [k] for k in range(N)}
        assert groups["dtype"]["float32"] == [ODD]
    checked.barrier()


@needs_two
def test_a_sequence_number_out_of_step_is_named(checked):
    """Ranks that made different numbers of calls on a communicator (here: forced) are caught."""
    checker = checked._engine.check
    checker.seq += 5 if RANK == ODD else 0
    try:
        outcomes = everyone(attempt(lambda: checked.barrier()))
    finally:
        checker.seq -= 5 if RANK == ODD else 0
    for o in outcomes:
        assert o.error == "CallMismatchError" and o.attributes["fields"] == ["seq"], describe(outcomes)
        assert "call #" in o.message and f"on rank {ODD}" in o.message
    checked.barrier()


@needs_two
def test_a_nonblocking_call_is_checked_when_it_is_issued(checked):
    outcomes = everyone(attempt(lambda: checked.iallreduce(np.zeros(_odd(4, 5))).wait()))
    assert all(o.error == "CallMismatchError" for o in outcomes), describe(outcomes)
    requests = [checked.iallgather(np.full((RANK, 2), RANK)), checked.ibroadcast(np.arange(3.0) * RANK, root=N - 1)]
    assert requests[1].wait().tolist() == [0.0, N - 1.0, 2 * (N - 1.0)]
    assert requests[0].wait()[:, 0].tolist() == [k for k in range(N) for _ in range(k)]


def test_legitimate_per_rank_differences_pass_and_results_are_right(checked):
    """Row counts differ in gather/all-gather; non-roots pass None to scatter; out= is local."""
    rows = np.full((RANK % 3, 2), RANK, dtype=np.int32)
    everything = np.concatenate([np.full((k % 3, 2), k, dtype=np.int32) for k in range(N)])
    np.testing.assert_array_equal(checked.allgather(rows), everything)
    got = checked.gather(rows, root=N - 1)
    if RANK == N - 1:
        np.testing.assert_array_equal(got, everything)
    part = checked.scatter(np.arange(2 * N) if RANK == 0 else None, root=0)
    assert part.tolist() == [2 * RANK, 2 * RANK + 1]
    out = np.empty(4)
    assert checked.allreduce(np.ones(4), out=out) is out and out.tolist() == [N] * 4
    for algorithm in ALGORITHMS["allreduce"]:
        np.testing.assert_array_equal(checked.allreduce(np.ones(3), algorithm=algorithm), np.full(3, float(N)))


def test_checks_cost_nothing_in_the_traffic_counts(checked):
    """The check's messages are not the collective's: traffic counts only the collective's."""
    plain = mpiring.Communicator(check=False)
    for comm in (plain, checked):
        comm.traffic.reset()
        comm.allreduce(np.ones(64), algorithm="ring")
    assert (checked.traffic.bytes_sent, checked.traffic.messages) == (plain.traffic.bytes_sent, plain.traffic.messages)
    plain.free()


def test_the_environment_switches_checks_on_and_ranks_agree(monkeypatch):
    """MPIRING_CHECK on one rank only turns checks on for all (none waits for another's record)."""
    monkeypatch.setenv("MPIRING_CHECK", "1" if RANK == ODD else "0")
    comm = mpiring.Communicator()
    assert comm._engine.check is not None
    outcomes = everyone(attempt(lambda: comm.allreduce(np.zeros(_odd(2, 3)))))
    if N > 1:
        assert all(o.error == "CallMismatchError" for o in outcomes), describe(outcomes)
    monkeypatch.setenv("MPIRING_CHECK", "off")
    quiet = mpiring.Communicator()
    assert quiet._engine.check is None
    comm.free()
    quiet.free()


def test_bad_mpiring_check_values_are_refused(monkeypatch):
    for good, value in (("1", True), ("true", True), ("ON", True), ("0", False), ("", False), ("no", False)):
        monkeypatch.setenv("MPIRING_CHECK", good)
        assert wanted(None) is value
    monkeypatch.setenv("MPIRING_CHECK", "maybe")
    with pytest.raises(mpiring.ArgumentError, match="MPIRING_CHECK"):
        mpiring.Communicator()  # raised before any message moves, on every rank
    assert wanted(True) is True and wanted(False) is False  # check= wins over the environment


def test_the_record_and_tag_fit_the_mpi_guarantees():
    assert RECORD.itemsize % 8 == 0

    class SmallestTagBound:  # an MPI that grants only the standard's minimum MPI_TAG_UB
        def Get_rank(self):  # noqa: N802 (mpi4py's names)
            return 0

        def Get_size(self):  # noqa: N802
            return 1

        def Get_attr(self, key):  # noqa: N802
            return 32767

    ring = Ring(SmallestTagBound())
    ack = ring.tags.ack_offset
    tags = [ring.next_tag() for _ in range(3 * ack)]  # wrapping around several times
    assert CHECK_TAG not in tags and min(tags) == 1 and max(tags) + ack <= 32767
    ring.failures = 5
    blocking = {ring.blocking_tag(identity) for identity in range(0, 1 << 20, 4095)}  # too little room: 1 bit kept
    persistent = {ring.persistent_tag(identity) for identity in range(3 * ack)}
    assert len(blocking) == 2 and max(blocking) + ack <= 32767
    assert not blocking & set(tags) and not blocking & persistent and not persistent & set(tags)
    assert ring.tags.identity_bits == 1 and Ring(MPI.COMM_SELF).tags.identity_bits == 20

    class NoTagBound(SmallestTagBound):  # Open MPI's split communicators carry no MPI_TAG_UB
        def Get_attr(self, key):  # noqa: N802
            return None

    assert Ring(NoTagBound()).tags.identity_bits == 20  # COMM_WORLD's bound holds for every communicator
    assert Ring(MPI.COMM_SELF).tags.ack_offset >= ack
    assert issubclass(CallMismatchError, mpiring.CollectiveMismatchError)


@needs_two
def test_a_missing_rank_is_named_by_every_other_rank_when_checking():
    """The check's exchange is one step with every rank, so a timeout names the missing rank
    itself, on every rank (without checks only its neighbours in the algorithm can)."""
    comm = mpiring.Communicator(check=True, timeout=0.25)
    mine = None if RANK == ODD else attempt(lambda: comm.allreduce(np.ones(2)))
    outcomes = everyone(mine)
    for o in outcomes[:ODD]:
        assert o.error == "CollectiveTimeout" and o.attributes["waiting_on"] == [f"receive from rank {ODD}"], \
            describe(outcomes)
        assert o.message.startswith("allreduce (consistency check before auto) timed out after 0.25 s in step 0")
        assert o.seconds <= 0.25 + 2.0
