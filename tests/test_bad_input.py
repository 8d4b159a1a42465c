"""Bad arguments raise a clear ArgumentError on every rank before any message moves, and the
communicator stays usable: every case is followed by a good call."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpiring
from mpiring import ArgumentError, CollectiveMismatchError

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()

GOOD = np.arange(6, dtype=np.float64)
READ_ONLY = np.zeros(6)
READ_ONLY.flags.writeable = False

CASES = [
    ("allreduce", dict(x=np.array(["a", "b"])), "x", "unsupported dtype"),
    ("allreduce", dict(x=np.array([object(), 1], dtype=object)), "x", "unsupported dtype"),
    ("allreduce", dict(x=np.zeros(3, dtype=[("a", "i4"), ("b", "f4")])), "x", "unsupported dtype"),
    ("allreduce", dict(x=np.zeros(3, dtype=np.longdouble)), "x", "unsupported dtype"),
    ("allreduce", dict(x=np.zeros(3, dtype=">f8")), "x", "byte order"),
    ("allreduce", dict(x=np.arange(4), op="avg"), "op", "avg"),
    ("allreduce", dict(x=np.ones(4, bool), op="avg"), "op", "avg"),
    ("allreduce", dict(x=GOOD, op="mean"), "op", "unknown op"),
    ("allreduce", dict(x=GOOD, op=None), "op", "unknown op"),
    ("allreduce", dict(x=np.ones(3, np.complex64), op="max"), "op", "complex"),
    ("allreduce", dict(x=GOOD, out=np.zeros(5)), "out", "shape"),
    ("allreduce", dict(x=GOOD, out=np.zeros(6, np.float32)), "out", "dtype"),
    ("allreduce", dict(x=GOOD, out=READ_ONLY), "out", "read-only"),
    ("allreduce", dict(x=GOOD, out=[0.0] * 6), "out", "numpy array"),
    ("allreduce", dict(x=GOOD, algorithm="tree-of-life"), "algorithm", "unknown algorithm"),
    ("reduce", dict(x=GOOD, root=N), "root", "not a rank"),
    ("reduce", dict(x=GOOD, root=-1), "root", "not a rank"),
    ("reduce", dict(x=GOOD, root=1.0), "root", "integer"),
    ("reduce", dict(x=GOOD, root=True), "root", "integer"),
    ("broadcast", dict(x=GOOD, root="0"), "root", "integer"),
    ("broadcast", dict(x=GOOD, out=np.zeros((2, 3))), "out", "shape"),
    ("reduce_scatter", dict(x=np.float64(3.0)), "x", "0-d"),
    ("reduce_scatter", dict(x=GOOD, out=np.zeros(99)), "out", "shape"),
    ("allgather", dict(x=np.int32(1)), "x", "0-d"),
    ("gather", dict(x=np.int32(1)), "x", "0-d"),
    ("gather", dict(x=GOOD, root=N + 3), "root", "not a rank"),
    ("scatter", dict(x=GOOD, root=N), "root", "not a rank"),
    ("barrier", dict(algorithm="dissemination?"), "algorithm", "unknown algorithm"),
    ("allreduce", dict(x=GOOD, op="band"), "op", "integer or bool"),
    ("reduce_scatter", dict(x=np.ones(4, np.complex64), op="lxor"), "op", "integer or bool"),
    ("scan", dict(x=GOOD, op="bor"), "op", "integer or bool"),
    ("scan", dict(x=np.arange(4), op="avg"), "op", "avg"),
    ("scan", dict(x=GOOD, out=np.zeros(5)), "out", "shape"),
    ("exscan", dict(x=GOOD, op="mean"), "op", "unknown op"),
    ("alltoall", dict(x=np.float64(3.0)), "x", "0-d"),
    ("alltoall", dict(x=np.zeros((2 * N, 2)), out=np.zeros((2 * N, 3))), "out", "shape"),
    ("alltoallv", dict(x=GOOD, send_counts=None), "send_counts", "missing"),
    ("alltoallv", dict(x=GOOD, send_counts=[7] + [0] * (N - 1)), "send_counts", "add up to 7 rows"),
    ("alltoallv", dict(x=GOOD, send_counts=[6] * (N + 1)), "send_counts", f"{N} non-negative"),
    ("alltoallv", dict(x=GOOD, send_counts=[6] + [0] * (N - 1), recv_counts=[-1] * N), "recv_counts", "non-negative"),
    ("alltoallv", dict(x=GOOD, send_counts=[6] + [0] * (N - 1), recv_counts=[1] * N, out=np.zeros(N + 1)), "out",
     "shape"),
    *([("alltoall", dict(x=np.zeros((N + 1, 2))), "x", "not a multiple")] if N > 1 else []),
]


def _call(comm, collective, kwargs):
    return getattr(comm, collective)(**kwargs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[3]}")
def test_bad_argument_raises_then_communicator_still_works(comm, case):
    collective, kwargs, argument, words = case
    with pytest.raises(ArgumentError) as caught:
        _call(comm, collective, kwargs)
    message = str(caught.value)
    assert message.startswith(f"{collective}:") and f"'{argument}'" in message and words in message, message
    assert caught.value.collective == collective and caught.value.argument == argument
    np.testing.assert_array_equal(comm.allreduce(GOOD), GOOD * N)


def test_bad_scatter_input_on_the_root_reaches_every_rank(comm):
    """Only the root holds scatter's x: it tells the others, so no rank waits for data."""
    for bad, words in ((np.array(["s"] * 4), "unsupported dtype"), (np.float32(1), "0-d")):
        with pytest.raises(ArgumentError) as caught:
            comm.scatter(bad if RANK == 0 else None, root=0)
        text = str(caught.value)
        assert words in text if RANK == 0 else "rejected on the root" in text, text
    assert comm.scatter(np.arange(N) if RANK == 0 else None, root=0).tolist() == [RANK]


def test_bad_gather_out_on_the_root_reaches_every_rank(comm):
    wrong_rows = np.zeros((N + 5, 2)) if RANK == 0 else None
    with pytest.raises(ArgumentError, match="rows"):
        comm.gather(np.zeros((1, 2)), root=0, out=wrong_rows)
    wrong_dtype = np.zeros((N, 2), np.int8) if RANK == 0 else None
    with pytest.raises(ArgumentError, match="'out'"):
        comm.gather(np.zeros((1, 2)), root=0, out=wrong_dtype)
    assert comm.allgather(np.array([RANK])).tolist() == list(range(N))


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
def test_allgather_with_mismatched_dtypes_raises_on_every_rank(comm):
    x = np.zeros((1, 2), np.float32 if RANK == 0 else np.float64)
    with pytest.raises(CollectiveMismatchError, match="dtype or row shape"):
        comm.allgather(x)
    y = np.zeros((1, 2 if RANK == 0 else 3))
    with pytest.raises(CollectiveMismatchError):
        comm.gather(y, root=N - 1)
    assert comm.allgather(np.array([RANK])).tolist() == list(range(N))


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
@pytest.mark.parametrize("last_length", [8, 12], ids=["shorter", "longer"])
def test_mismatched_lengths_raise_instead_of_wrong_data(comm, last_length):
    """The last rank of the broadcast chain passes a different length than the rest: whether
    it receives fewer bytes than it expects or more, it raises instead of returning wrong data.

    (A mismatch earlier in the chain also stops the ranks after it; timeouts that name them
    belong to the reliability work.)
    """
    last = N - 1
    x = np.zeros(last_length if RANK == last else 10)
    raised = 0
    fresh = mpiring.Communicator()  # the raising rank's communicator breaks (docs/errors.md)
    try:
        fresh.broadcast(x, root=0)
    except mpiring.CommunicationError as error:
        raised = 1
        assert "different shapes" in str(error), str(error)
    assert WORLD.allgather(raised) == [0] * (N - 1) + [1]
