"""algorithm="auto": the switch-point table, the MPIRING_ALGO override and MPIRING_DEBUG."""

from __future__ import annotations

import json

import pytest

from mpiring import ArgumentError
from mpiring.algorithms import ALGORITHMS
from mpiring.selection import SWITCH_POINTS, choose, read_environment
from mpiring.validation import check_algorithm


def test_every_switch_point_names_a_real_algorithm_and_ends_open():
    assert set(SWITCH_POINTS) == set(ALGORITHMS)
    for collective, rows in SWITCH_POINTS.items():
        assert rows[-1][:2] == (None, None), f"{collective}: the last row must cover every case"
        for _, _, name in rows:
            assert name in ALGORITHMS[collective], (collective, name)


def _rows_in_force(collective: str, world_size: int) -> list[tuple[int | None, str]]:
    return [(largest, name) for most, largest, name in SWITCH_POINTS[collective] if most is None or world_size <= most]


@pytest.mark.parametrize("collective", list(SWITCH_POINTS))
@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 9, 64])
def test_auto_takes_the_first_row_that_holds(collective, world_size):
    """An independent walk of the table: the rows in force at this world size, then by size."""
    rows = _rows_in_force(collective, world_size)
    bounds = [largest for largest, _ in rows]
    for nbytes in sorted({0, 1, 1 << 40, *(b for b in bounds if b), *(b + 1 for b in bounds if b)}):
        expected = next(name for largest, name in rows if largest is None or nbytes <= largest)
        assert choose(collective, "auto", nbytes, world_size) == expected, (collective, world_size, nbytes)


@pytest.mark.parametrize("collective", list(SWITCH_POINTS))
def test_every_row_is_chosen_somewhere(collective):
    """A row that earlier rows hide at every world size and size is a mistake in the table."""
    chosen = set()
    for world_size in range(1, 65):
        for most, largest, name in SWITCH_POINTS[collective]:
            if most is None or world_size <= most:
                for nbytes in (0, largest or 1 << 40):
                    if choose(collective, "auto", nbytes, world_size) == name:
                        chosen.add((most, largest, name))
    assert chosen == set(SWITCH_POINTS[collective])


def test_auto_picks_by_size_and_world_size():
    assert choose("allreduce", "auto", 8, 4) == "recursive_doubling"
    assert choose("allreduce", "auto", 1 << 30, 4) == "scattered"
    assert [choose("allreduce", "auto", 1 << 20, p) for p in (2, 8, 9)] == ["scattered", "scattered", "rabenseifner"]
    assert choose("allreduce", "auto", 1 << 30, 9) == "ring"
    assert choose("allreduce", "ring", 8, 4) == "ring"  # asked for: no switching
    assert [choose("allgather", "auto", 8 << 10, p) for p in (2, 4, 8, 9)] == ["ring", "scattered", "scattered", "ring"]
    assert choose("allgather", "auto", 8 << 20, 4) == "ring"
    assert [choose("reduce_scatter", "auto", 1 << 20, p) for p in (2, 8, 9)] == ["scattered", "scattered",
                                                                                "recursive_halving"]
    assert [choose("allgather", "auto", 8, p) for p in (2, 4, 9)] == ["ring", "bruck", "bruck"]
    assert choose("broadcast", "auto", 1 << 30, 8) == "linear"
    assert [choose("reduce", "auto", 1 << 20, p) for p in (2, 4, 8, 9)] == ["binomial", "scattered", "scattered",
                                                                          "binomial"]
    assert [choose("reduce", "auto", 256 << 10, p) for p in (2, 4, 8)] == ["binomial"] * 3
    assert [choose("reduce", "auto", (256 << 10) + 4, p) for p in (2, 4, 8)] == ["binomial", "scattered", "scattered"]
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
    _, bound, small = SWITCH_POINTS["reduce_scatter"][0]
    assert err == [f"mpiring: reduce_scatter ran {small} (auto: 100 B <= {bound} B, any number of ranks)",
                   "mpiring: reduce_scatter ran ring (asked for)"]


def _write(tmp_path, data) -> str:
    path = tmp_path / "switch_points.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_a_switch_points_file_replaces_the_rows_it_names(monkeypatch, tmp_path):
    from mpiring import selection
    from mpiring.topology import NodeMap

    monkeypatch.setenv("MPIRING_SWITCH_POINTS", _write(tmp_path, {
        "switch_points": {"allreduce": [[4, 1024, "ring"], [None, None, "rabenseifner"]]},
        "node_switch_points": {"allreduce": [[65536, "flat"], [None, "node_leader"]]},
        "across_nodes_switch_points": {"allreduce": [[None, "ring_pipelined"]]},
    }))
    read_environment()
    assert [choose("allreduce", "auto", 8, p) for p in (2, 4, 8)] == ["ring", "ring", "rabenseifner"]
    assert choose("allreduce", "auto", 4096, 2) == "rabenseifner"
    assert choose("allreduce", "recursive_doubling", 8, 2) == "recursive_doubling"  # asked for: no switching
    assert choose("broadcast", "auto", 1 << 30, 8) == "linear"  # collectives it does not name keep their rows
    nodes = NodeMap(((0, 1), (2, 3)))
    assert choose("allreduce", "auto", 8, 4, nodes) == "ring"  # 8 B <= 64 KiB: flat, then the flat rows
    assert choose("allreduce", "auto", 1 << 20, 4, nodes) == "node_leader"
    a_rank_per_node = NodeMap(((0,), (1,), (2,), (3,)))
    assert choose("allreduce", "auto", 8, 4, a_rank_per_node) == selection.across_choice("allreduce", 8, 4) == (
        "ring_pipelined")  # and what the node-aware algorithms run across nodes
    assert selection.SWITCH_POINTS["allreduce"][0] == (None, 64 << 10, "recursive_doubling")  # the table stays
    monkeypatch.delenv("MPIRING_SWITCH_POINTS")
    read_environment()
    assert choose("allreduce", "auto", 8, 2) == "recursive_doubling"


@pytest.mark.parametrize("content, message", [
    ("{", "is not JSON"),
    ("[]", "must hold a JSON object"),
    ({"switch_point": {}}, r"unknown key\(s\) \['switch_point'\]"),
    ({"switch_points": {"allreduse": [[None, None, "ring"]]}}, "allreduse: unknown collective"),
    ({"switch_points": {"allreduce": []}}, "must be a non-empty list of rows"),
    ({"switch_points": {"allreduce": [[None, "ring"]]}}, r"allreduce\[0\]: a row is \[most ranks, largest bytes"),
    ({"switch_points": {"allreduce": [[None, "64K", "ring"]]}}, "largest bytes must be a whole number"),
    ({"switch_points": {"allreduce": [[-1, None, "ring"]]}}, "most ranks must be a whole number"),
    ({"switch_points": {"allreduce": [[None, 1024, "ring"]]}}, "the last row must be open"),
    ({"switch_points": {"allreduce": [[None, None, "fastest"]]}}, r"allreduce\[0\]: unknown algorithm 'fastest'"),
    ({"node_switch_points": {"broadcast": [[None, "node_lanes"]]}}, "unknown algorithm 'node_lanes' for broadcast"),
    ({"across_nodes_switch_points": {"allreduce": [[None, "node_lanes"]]}}, "'node_lanes' is node-aware"),
])
def test_a_bad_switch_points_file_says_what_is_wrong(monkeypatch, tmp_path, content, message):
    monkeypatch.setenv("MPIRING_SWITCH_POINTS", _write(tmp_path, content))
    with pytest.raises(ArgumentError, match=f"MPIRING_SWITCH_POINTS.*{message}"):
        read_environment()


def test_a_missing_switch_points_file_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("MPIRING_SWITCH_POINTS", str(tmp_path / "absent.json"))
    with pytest.raises(ArgumentError, match="MPIRING_SWITCH_POINTS.*cannot read .*absent.json"):
        read_environment()
