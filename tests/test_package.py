"""Serial tests: segment arithmetic, the public surface, and the command line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import mpiring
from mpiring.algorithms import ALGORITHMS
from mpiring.algorithms.broadcast_ring import SEGMENT_BYTES, segment_count
from mpiring.ring import bounds_from_counts, split_bounds


@pytest.mark.parametrize("total", [0, 1, 2, 7, 8, 100, 1001])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 8, 13])
def test_split_bounds_cuts_like_array_split(total, parts):
    bounds = split_bounds(total, parts)
    pieces = np.array_split(np.arange(total), parts)
    assert len(bounds) == parts + 1
    assert [bounds[i + 1] - bounds[i] for i in range(parts)] == [len(p) for p in pieces]
    assert all(np.array_equal(np.arange(total)[bounds[i]:bounds[i + 1]], pieces[i]) for i in range(parts))


def test_bounds_from_counts():
    assert bounds_from_counts([2, 0, 3], scale=4) == [0, 8, 8, 20]


def test_broadcast_segments():
    assert segment_count(10 * SEGMENT_BYTES, 2) == 1  # two ranks: nothing to pipeline
    assert segment_count(SEGMENT_BYTES, 4) == 1
    assert segment_count(SEGMENT_BYTES + 1, 4) == 2


def test_public_surface():
    for name in ("broadcast", "reduce", "allreduce", "gather", "allgather", "scatter", "reduce_scatter",
                 "barrier"):
        assert callable(getattr(mpiring.Communicator, name)), name
        assert "ring" in ALGORITHMS[name]
    assert (mpiring.SUM, mpiring.PROD, mpiring.MIN, mpiring.MAX, mpiring.AVG) == ("sum", "prod", "min", "max", "avg")
    assert issubclass(mpiring.ArgumentError, ValueError)


def test_info_command():
    result = subprocess.run([sys.executable, "-m", "mpiring", "info"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"mpiring {mpiring.__version__}" in result.stdout
    assert "MPI library:" in result.stdout and "world size: 1" in result.stdout


def test_communicator_rejects_non_communicators():
    with pytest.raises(mpiring.ArgumentError, match="intracommunicator"):
        mpiring.Communicator(comm="COMM_WORLD")
