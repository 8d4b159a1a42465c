"""tests/run_mpi4py_suite.py's judgement, without MPI jobs: which exceptions count as refusals
by name (each documented refusal, worded as mpiring raises it, and nothing else), and how the
ranks' outcomes of a case make one."""

from __future__ import annotations

import numpy as np
import pytest
from exporters import DeviceOnly, LegacyDLPack
from mpi4py import MPI
from run_mpi4py_suite import REFUSALS, _agree, _refusal

from mpiring.buffer_specs import bytes_vector, op_name, simple
from mpiring.errors import ArgumentError

# one call per documented refusal, as the drop-in parses it
REFUSED = {
    "device buffers": lambda: simple("Bcast", "buf", DeviceOnly()),
    "DLPack buffers without a datatype": lambda: simple("Bcast", "buf", LegacyDLPack(np.zeros(2))),
    "MPI.BOTTOM": lambda: bytes_vector("Alltoallw", "sendbuf", [MPI.BOTTOM, ([1], [0]), [MPI.INT]], 1),
    "long double reductions": lambda: simple("Allreduce", "recvbuf", [np.zeros(2, np.longdouble), MPI.LONG_DOUBLE]),
    "derived datatypes that are not one strided view": lambda: simple(
        "Bcast", "buf", [np.zeros(8), 1, MPI.DOUBLE.Create_vector(2, 2, 3)]),
    "pair types": lambda: simple("Bcast", "buf", [np.zeros(2, np.int32), MPI.TWOINT]),
    "MAXLOC, MINLOC, REPLACE and user-defined ops": lambda: op_name("Allreduce", MPI.MAXLOC),
}


def test_every_documented_refusal_has_a_call():
    assert set(REFUSED) == set(REFUSALS)


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_each_refusal_as_mpiring_words_it_counts_as_that_refusal(feature):
    with pytest.raises(ArgumentError) as raised:
        REFUSED[feature]()
    assert _refusal(raised.value) == f"not supported ({feature}): {raised.value.problem}"


@pytest.mark.parametrize("call", [
    lambda: simple("Bcast", "buf", [np.zeros(4), 5, MPI.DOUBLE]),  # a count past the buffer
    lambda: simple("Bcast", "buf", object()),  # not a buffer
])
def test_an_argument_error_for_a_valid_feature_is_no_refusal(call):
    with pytest.raises(ArgumentError) as raised:
        call()
    assert _refusal(raised.value) is None


def test_other_exceptions():
    assert _refusal(NotImplementedError("mpi-alltoallw")) == "NotImplementedError: mpi-alltoallw"
    assert _refusal(ValueError("is not supported (a derived datatype")) is None
    assert _refusal(AttributeError("'Communicator' object has no attribute 'Alltoallw'")) is None


class _Ranks:
    """A stand-in for COMM_WORLD whose allgather returns every rank's given outcomes."""

    def __init__(self, *per_rank):
        self.per_rank = list(per_rank)

    def allgather(self, _mine):
        return self.per_rank


def test_ranks_agree_on_each_case():
    passed, skipped, failed = ("t", "passed", ""), ("t", "skipped", "refused"), ("t", "failed", "boom")
    assert _agree(_Ranks([passed], [passed]), [passed]) == [("t", "passed", "")]
    assert _agree(_Ranks([skipped], [skipped]), [skipped]) == [("t", "skipped", "refused")]
    assert _agree(_Ranks([passed], [failed]), [passed]) == [("t", "failed", "rank 1: boom")]
    verdict = _agree(_Ranks([skipped], [passed]), [skipped])[0]
    assert verdict[1] == "failed" and "skipped on ranks [0] only" in verdict[2]
    timeout = ("t", "failed", "mpiring.errors.CollectiveTimeout: allreduce timed out")
    assert _agree(_Ranks([timeout], [failed]), [timeout]) == [("t", "failed", "rank 1: boom")]  # the cause
    # a case one rank did not run fails
    assert _agree(_Ranks([passed, passed], [passed]), [passed, passed])[1][1] == "failed"
