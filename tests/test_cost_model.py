"""The cost model (mpiring.cost_model): its closed forms reduce to the textbook ones, agree with
the round rule applied message by message to the pattern mpiring sends, count the bytes a
node-aware all-reduce must cross, pick node_lanes where the network is slow, and its fabrics and
command line work. Serial; tests/test_cost_model_traffic.py checks the pattern against the real
traffic counters under MPI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from mpiring import cli, selection
from mpiring import cost_model as cm
from mpiring.cost_model.calibration import _fit

SLOW = cm.FABRICS["emulated-1g"]
FAST = cm.FABRICS["ib200"]
GRIDS = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (3, 1), (2, 3), (3, 2), (4, 2), (2, 4), (3, 4)]
COUNT = 720 * 16  # items: every chunk, share, segment and halving window here is whole


def test_one_node_ring_is_the_textbook_ring():
    for p in (2, 3, 4, 8):
        n = 8 * COUNT
        link = SLOW.intra
        want = 2 * (p - 1) * link.alpha + 2 * (p - 1) / p * n * link.beta + (p - 1) / p * n * SLOW.gamma
        assert cm.predict("allreduce", "ring", n, 1, p, SLOW) == pytest.approx(want, rel=1e-12)


def test_one_node_recursive_doubling_and_binomial_are_the_textbook_ones():
    n, link = 4096, FAST.intra
    assert cm.predict("allreduce", "recursive_doubling", n, 1, 8, FAST) == pytest.approx(
        3 * (link.alpha + n * link.beta + n * FAST.gamma))
    assert cm.predict("broadcast", "binomial", n, 1, 8, FAST) == pytest.approx(3 * (link.alpha + n * link.beta))
    assert cm.predict("reduce", "binomial", n, 1, 5, FAST) == pytest.approx(3 * (link.alpha + n * link.beta
                                                                                 + n * FAST.gamma))


def test_node_lanes_with_ring_lanes_is_the_multi_lane_sketch():
    """N nodes of k ranks, a large message (the lanes run the ring): the intra-node reduce-scatter
    and all-gather, plus a ring over N nodes of n/k bytes with k lanes sharing each link."""
    nodes, k, n = 16, 4, 64 << 20
    assert selection.flat_choice("allreduce", n // k, nodes) == "ring"
    a, e, g = SLOW.intra, SLOW.inter, SLOW.gamma
    want = (2 * (k - 1) * (a.alpha + n / k * a.beta) + (k - 1) / k * n * g
            + 2 * (nodes - 1) * (e.alpha + n / nodes * e.beta) + (nodes - 1) / nodes * n / k * g)
    assert cm.predict("allreduce", "node_lanes", n, nodes, k, SLOW) == pytest.approx(want, rel=1e-12)


def test_flat_scattered_at_two_by_two_sends_two_crossing_chunks_per_rank_per_half():
    n = 8 * COUNT
    half = SLOW.inter.alpha + 4 * (n / 4) * SLOW.inter.beta  # a node's 2 ranks x 2 crossing chunks
    assert cm.predict("allreduce", "scattered", n, 2, 2, SLOW) == pytest.approx(2 * half + 3 / 4 * n * SLOW.gamma)


@pytest.mark.parametrize("nodes,k", [(2, 2), (4, 2), (2, 4), (3, 2), (4, 4)])
@pytest.mark.parametrize("nbytes", [8 * COUNT, 64 << 20])
def test_node_lanes_crosses_the_least_an_allreduce_can(nodes, k, nbytes):
    """Where the lanes run a bandwidth-optimal all-reduce, each node's link carries 2(N-1)/N n;
    the flat ring (2(Nk-1)/(Nk) n) and the flat scattered all-reduce carry more."""
    lanes = cm.bytes_crossing("allreduce", "node_lanes", nbytes, nodes, k)
    choice = selection.flat_choice("allreduce", nbytes // k, nodes)
    if choice == "recursive_doubling":  # small shares: lg N whole shares per lane, latency first
        pytest.skip(f"{nbytes // k} B shares on {nodes} nodes run recursive doubling")
    if choice != "rabenseifner" or nodes & (nodes - 1) == 0:  # Rabenseifner folds 3 nodes
        assert lanes == pytest.approx(2 * (nodes - 1) * nbytes / nodes, rel=1e-6)  # up to chunk rounding
    assert lanes < cm.bytes_crossing("allreduce", "ring", nbytes, nodes, k)
    assert lanes < cm.bytes_crossing("allreduce", "scattered", nbytes, nodes, k)


@pytest.mark.parametrize("nodes,k", GRIDS, ids=lambda g: str(g))
@pytest.mark.parametrize("collective,algorithm", list(cm.FORMULAS), ids=lambda c: "-".join(c))
def test_closed_forms_are_the_round_rule_on_the_real_pattern(collective, algorithm, nodes, k):
    for fabric, nbytes in ((FAST, 8 * COUNT), (SLOW, 8 * COUNT), (SLOW, 8 * COUNT * 256), (FAST, 8 * 24)):
        want = cm.simulate(cm.pattern(collective, algorithm, nbytes, nodes, k), k, fabric)
        got = cm.predict(collective, algorithm, nbytes, nodes, k, fabric)
        # large broadcasts cut segments as numpy.array_split does; the closed form takes them equal
        assert got == pytest.approx(want, rel=1e-3 if nbytes > 1 << 20 else 1e-9, abs=1e-12), (fabric.name, nbytes)


def test_bytes_sent_of_the_flat_ring_is_the_ring_formula():
    n, p = 8 * COUNT, 6
    for rank in range(p):
        assert cm.bytes_sent("allreduce", "ring", n, 2, 3, rank) == (2 * (p - 1) * n // p, 2 * (p - 1))


def test_best_picks_node_lanes_for_large_messages_on_a_slow_network():
    for nbytes in (1 << 20, 8 << 20, 64 << 20):
        assert cm.best("allreduce", nbytes, 2, 2, SLOW)[0] == "node_lanes"
    algorithm, seconds = cm.best("allreduce", 8, 2, 2, SLOW)
    assert seconds == min(cm.predict("allreduce", a, 8, 2, 2, SLOW) for a in cm.algorithms("allreduce"))


def test_auto_is_what_selection_picks():
    assert cm.auto_choice("allreduce", 1 << 20, 2, 2) == "node_lanes"
    assert cm.auto_choice("broadcast", 8, 4, 2) == "node_leader"
    assert cm.auto_choice("allreduce", 8, 1, 4) == "recursive_doubling"  # one node: flat
    assert cm.auto_choice("allreduce", 1 << 20, 4, 1) == "ring"  # one rank per node: the rows across nodes
    assert cm.predict("allreduce", "auto", 1 << 20, 2, 2, SLOW) == cm.predict("allreduce", "node_lanes", 1 << 20, 2,
                                                                              2, SLOW)


def test_unknown_algorithms_are_refused():
    with pytest.raises(ValueError, match="known"):
        cm.predict("allreduce", "bruck", 8, 2, 2, SLOW)


def test_projection_sizes_run_fast_enough_at_1024_nodes():
    for collective in cm.COLLECTIVES:
        for algorithm in cm.algorithms(collective):
            assert math.isfinite(cm.predict(collective, algorithm, 1 << 20, 1024, 8, FAST))


def test_fabric_save_load_round_trip(tmp_path, monkeypatch):
    path = FAST.save(tmp_path / "deep" / "fabric.json")
    assert cm.Fabric.load(path) == FAST
    monkeypatch.setenv(cm.FABRIC_VARIABLE, str(path))
    assert cm.default_path() == path
    assert cm.load_fabric() == FAST
    assert cm.load_fabric("emulated-10g").inter.beta == pytest.approx(8e-10)


def test_the_fit_recovers_a_link():
    sizes = cm.CALIBRATION_SIZES
    link = _fit(sizes, [2e-6 + s * 1e-10 for s in sizes])
    assert link.alpha == pytest.approx(2e-6, rel=1e-6) and link.beta == pytest.approx(1e-10, rel=1e-6)


def test_the_fit_takes_the_sustained_rate_past_a_burst():
    """A shaped link passes what fits its token bucket at line rate: as measured on the emulated
    cluster's 1 Gbit/s links, 64 KiB in 37 us, 4 MiB in 33 ms. beta is the rate beyond the burst."""
    sizes = cm.CALIBRATION_SIZES
    burst, rate = 256_000, 125e6
    seconds = [10e-6 + s / 5e9 + max(s - burst, 0) / rate for s in sizes]
    assert _fit(sizes, seconds).beta == pytest.approx(1 / rate + 1 / 5e9, rel=0.01)


def test_the_predict_command_prints_a_table():
    result = subprocess.run([sys.executable, "-m", "mpiring.cost_model", "predict", "-c", "allreduce", "--nodes", "2",
                             "--per-node", "2", "--fabric", "emulated-1g", "-b", "8", "-e", "64M"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("| size | recursive_doubling |") and lines[1].endswith("| best | auto |")
    assert lines[-1].startswith("| 64M |") and lines[-1].endswith("| node_lanes | node_lanes |")


def test_mpiring_model_runs_the_cost_model(capsys, tmp_path):
    assert cli.main(["model", "project", "-c", "broadcast", "--fabric", "ib200", "--nodes", "16", "32",
                     "--sizes", "8", "1M"]) == 0
    out = capsys.readouterr().out
    assert "| 16 |" in out and "| 32 |" in out
    assert cli.main(["model", "predict", "--fabric", str(FAST.save(tmp_path / "f.json")), "-e", "64"]) == 0
    assert "| 64 |" in capsys.readouterr().out


def test_switch_points_from_the_model_are_a_file_auto_takes(tmp_path, monkeypatch):
    """`switch-points` writes the model's winners as a MPIRING_SWITCH_POINTS file: a node-aware table
    on nodes of several ranks, a table of flat algorithms across nodes of one rank, both accepted."""
    from mpiring.topology import NodeMap

    path = tmp_path / "points.json"
    cm.main(["switch-points", "--fabric", "emulated-1g", "--nodes", "2", "--per-node", "2", "--out", str(path)])
    tables = json.loads(path.read_text())["node_switch_points"]
    assert tables["allreduce"][-1] == [None, cm.best("allreduce", 256 << 20, 2, 2, cm.FABRICS["emulated-1g"])[0]]
    monkeypatch.setenv("MPIRING_SWITCH_POINTS", str(path))
    selection.read_environment()
    try:
        nodes = NodeMap(((0, 1), (2, 3)))
        for size in (8, 1 << 20, 64 << 20):
            assert selection.auto_choice("allreduce", size, 4, nodes) == cm.best("allreduce", size, 2, 2,
                                                                                 cm.FABRICS["emulated-1g"])[0]
    finally:
        monkeypatch.delenv("MPIRING_SWITCH_POINTS")
        selection.read_environment()
    across = cm.switch_points(4, 1, cm.FABRICS["emulated-1g"], [8, 1 << 20])["across_nodes_switch_points"]
    assert all(not name.startswith("node_") for rows in across.values() for _, name in rows)
