"""algorithm="auto": the switch-point table, the MPIRING_ALGO override and MPIRING_DEBUG."""

from __future__ import annotations

import pytest

from mpiring import ArgumentError
from mpiring.algorithms import ALGORITHMS
from mpiring.selection import SMALL_WORLDS, SWITCH_POINTS, choose, read_environment
from mpiring.validation import check_algorithm


def test_every_switch_point_names_a_real_algorithm_and_ends_open():
    assert set(SWITCH_POINTS) == set(ALGORITHMS)
    for collective, rows in SWITCH_POINTS.items():
        assert rows[-1][0] is None, f"{collective}: the last row must cover every size"
        bounds = [bound for bound, _ in rows[:-1]]
        assert bounds == sorted(bounds), collective
        for _, name in rows:
            assert name in ALGORITHMS[collective], (collective, name)


def test_auto_picks_by_size():
    small, large = SWITCH_POINTS["allreduce"][0]
    assert choose("allreduce", "auto", small, 4) == large
    assert choose("allreduce", "auto", 1 << 30, 4) == "ring"
    assert choose("allreduce", "ring", 8, 4) == "ring"  # asked for: no switching


def test_small_worlds_come_first():
    for collective, (most_ranks, algorithm) in SMALL_WORLDS.items():
        assert algorithm in ALGORITHMS[collective]
        assert choose(collective, "auto", 8, most_ranks) == algorithm
        assert choose(collective, "auto", 8, most_ranks + 1) == SWITCH_POINTS[collective][0][1]
    assert choose("scan", "auto", 8, 16) == "recursive_doubling"
    assert choose("scan", "auto", 1 << 20, 16) == "ring"


@pytest.fixture(autouse=True)
def _fresh_environment():
    yield
    read_environment()  # undo what a test set, once monkeypatch has restored the variables


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("MPIRING_ALGO", "ring")
    read_environment()
    assert check_algorithm("broadcast", None) == "ring"
    assert check_algorithm("broadcast", "binomial") == "binomial"  # the call's argument wins
    monkeypatch.setenv("MPIRING_ALGO", "allreduce=rabenseifner, broadcast=binomial")
    read_environment()
    assert check_algorithm("allreduce", None) == "rabenseifner"
    assert check_algorithm("broadcast", None) == "binomial"
    assert check_algorithm("gather", None) == "auto"
    monkeypatch.setenv("MPIRING_ALGO", "allreduce=fastest")
    read_environment()
    with pytest.raises(ArgumentError, match="MPIRING_ALGO.*unknown algorithm 'fastest'"):
        check_algorithm("allreduce", None)


def test_debug_says_what_ran_and_why(monkeypatch, capsys):
    monkeypatch.setenv("MPIRING_DEBUG", "1")
    read_environment()
    monkeypatch.setattr("mpiring.selection._announced", set())
    choose("reduce_scatter", "auto", 100, 8)
    choose("reduce_scatter", "auto", 100, 8)  # said once only
    choose("reduce_scatter", "ring", 100, 8)
    err = capsys.readouterr().err.splitlines()
    bound, small = SWITCH_POINTS["reduce_scatter"][0]
    assert err == [f"mpiring: reduce_scatter ran {small} (auto: 100 B <= {bound} B at 8 ranks)",
                   "mpiring: reduce_scatter ran ring (asked for)"]
