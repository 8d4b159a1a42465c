#!/usr/bin/env python3
"""Run the whole test suite: the serial tests once, then the MPI tests at every world size.

    python tests/run_world_sizes.py                  # sizes 1 2 3 4 8 (and 5 for tests/test_dropin.py)
    python tests/run_world_sizes.py --slurm          # also the real-Slurm tests (apt-installs Slurm, as root)
    python tests/run_world_sizes.py --sizes 2 4 -- -k allreduce
    python tests/run_world_sizes.py --mpi4py-suite   # mpi4py's own collective tests on the drop-in, sizes 1-5
    python tests/run_world_sizes.py --cluster 2x2    # the MPI tests across an emulated 2-node cluster (root)

No run can hang: each MPI launch aborts on the first failing rank (tests/conftest.py, and
tests/mpi_pytest.py for any other pytest exit, under `python -m mpi4py`), pytest-timeout's
thread method stops a stuck test, MPIEXEC_TIMEOUT and an outer timeout stop a stuck launch.
Works with the MPICH and Open MPI wheels.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_SIZES = [1, 2, 3, 4, 8]
# World sizes run for a few test files only, after the default sizes of a whole-suite run (no
# --sizes, no pytest arguments): the mpi4py drop-in at 5 ranks too, as mpi4py tests its own.
EXTRA_SIZES = {5: ["test_dropin.py"]}
# What --cluster runs without pytest arguments: the collectives, and the node-aware tests there are.
CLUSTER_TESTS = ["test_collectives.py", "test_node*.py"]


def mpi_environment() -> dict[str, str]:
    """The environment an mpirun here needs: Open MPI as root, oversubscribed, without OFI."""
    # One BLAS thread per rank: ranks already fill the cores, and threaded BLAS oversubscribes them.
    env = dict(os.environ, PY_COLORS="0", PYTHONUNBUFFERED="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    probe = subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
        capture_output=True, text=True,
    )
    if probe.returncode != 0:
        sys.exit(f"mpi4py cannot start MPI here (install one: pip install mpich):\n{probe.stderr}")
    version = probe.stdout
    if "Open MPI" in version:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
        env.setdefault("OMPI_MCA_btl", "^ofi")
    return env


def counts(output: str) -> dict[str, int]:
    """The counts in pytest's closing summary line (passed, failed, skipped, error...)."""
    found: dict[str, int] = {}
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error|skipped|deselected)", line)]
    if lines:
        for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)", lines[-1]):
            found[word.rstrip("s") if word.startswith("error") else word] = int(number)
    return found


def run(command: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run a command, echoing its output as it comes; kill its whole process group on timeout."""
    print("$", " ".join(command), flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line)
        code = proc.wait()
    finally:
        timed_out = not timer.is_alive() and proc.returncode in (None, -signal.SIGKILL)
        timer.cancel()
    if timed_out:
        code = 124
        lines.append(f"[run_world_sizes] killed after {timeout:.0f} s\n")
    sys.stdout.write(lines[-1] if timed_out else "")
    print(f"[run_world_sizes] exit {code} after {time.monotonic() - started:.1f} s", flush=True)
    return code, "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", help=f"world sizes (default: {DEFAULT_SIZES}; with "
                        f"--mpi4py-suite, its own)")
    parser.add_argument("--test-timeout", type=int, default=300, help="seconds for one test (thread method)")
    parser.add_argument("--run-timeout", type=int, default=1500, help="seconds for one world size")
    parser.add_argument("--no-serial", action="store_true", help="skip the serial (non-MPI) tests")
    parser.add_argument("--slurm", action="store_true",
                        help="also start a real Slurm cluster here (installs Slurm and munge with apt-get "
                             "when missing: needs root)")
    parser.add_argument("--mpi4py-suite", action="store_true",
                        help="instead of this suite, run mpi4py's own collective test modules on mpiring's drop-in "
                             "(tests/run_mpi4py_suite.py: fetches mpi4py's source distribution once)")
    parser.add_argument("--cluster", metavar="NODESxRANKS", action="append", type=cluster_shape,
                        help="run the MPI tests (the pytest arguments, else tests/test_collectives.py and "
                             "tests/test_node*.py) across an emulated cluster of NODES nodes with RANKS ranks "
                             "each, links shaped at 1 Gbit/s (mpiring.cluster: needs root and iproute2); "
                             "repeatable; without --sizes, only these runs")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    if args.mpi4py_suite:
        if args.pytest_args or args.slurm:
            parser.error("--mpi4py-suite takes no pytest arguments and no --slurm")
        from run_mpi4py_suite import main as mpi4py_suite

        return mpi4py_suite([*(["--sizes", *map(str, args.sizes)] if args.sizes else []),
                             "--run-timeout", str(args.run_timeout)])
    if args.cluster and not args.sizes:
        return cluster_runs(args.cluster, args.pytest_args, [], args)
    args.sizes = args.sizes or DEFAULT_SIZES

    env = mpi_environment()
    mpiexec = shutil.which("mpiexec") or shutil.which("mpirun")
    if mpiexec is None:
        print("no mpiexec on PATH: install an MPI (pip install mpich) first", file=sys.stderr)
        return 2
    timeouts = [f"--timeout={args.test_timeout}", "--timeout-method=thread"]
    results: list[tuple[str, int, dict[str, int]]] = []

    if not args.no_serial:
        serial_env = dict(env, MPIRING_SLURM_TESTS="1") if args.slurm else env
        code, output = run([sys.executable, "-m", "pytest", "-q", "-m", "not mpi", *timeouts, *args.pytest_args],
                           serial_env, args.run_timeout)
        results.append(("serial", code, counts(output)))

    runs = [(size, args.pytest_args, "") for size in args.sizes]
    if args.sizes == DEFAULT_SIZES and not args.pytest_args:
        runs += [(size, [os.path.join(HERE, f) for f in files], " (" + " ".join(files) + ")")
                 for size, files in EXTRA_SIZES.items()]
    for index, (size, pytest_args, which) in enumerate(runs):
        if index:  # pytest-mpi's MPI information block: once is enough (tests/conftest.py)
            env = dict(env, MPIRING_MPI_INFO_SHOWN="1")
        command = [mpiexec, "-n", str(size), sys.executable, "-m", "mpi4py", os.path.join(HERE, "mpi_pytest.py"),
                   "--with-mpi", "-m", "mpi", "-q", *timeouts, *pytest_args]
        code, output = run(command, dict(env, MPIEXEC_TIMEOUT=str(args.run_timeout)), args.run_timeout + 30)
        results.append((f"world size {size}{which}", code, counts(output)))
    if args.cluster:
        return cluster_runs(args.cluster, args.pytest_args, results, args)
    return summary(results)


def cluster_shape(text: str) -> tuple[int, int]:
    """'2x2' -> (2 nodes, 2 ranks per node)."""
    match = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give NODESxRANKS, e.g. 2x2")
    return int(match[1]), int(match[2])


def cluster_runs(shapes: list[tuple[int, int]], pytest_args: list[str],
                 results: list[tuple[str, int, dict[str, int]]], args: argparse.Namespace) -> int:
    """The MPI tests across emulated clusters (mpiring.cluster), one per shape, then the summary.

    A cluster that cannot be made here (not root, no iproute2, no namespaces) is a skipped run with
    its reason, or a failed one where CI is set."""
    import glob

    from mpiring.cluster import EmulatedCluster, available

    if not pytest_args:
        pytest_args = sorted({path for pattern in CLUSTER_TESTS for path in glob.glob(os.path.join(HERE, pattern))})
    env = mpi_environment()
    timeouts = [f"--timeout={args.test_timeout}", "--timeout-method=thread"]
    ok, reason = available()
    for nodes, ranks in shapes:
        name = f"cluster {nodes}x{ranks}"
        if not ok:
            print(f"[run_world_sizes] {name}: cannot make an emulated cluster here: {reason}", flush=True)
            results.append((name, 1, {}) if os.environ.get("CI") else (name, 0, {"skipped": 1}))
            continue
        command = [sys.executable, "-m", "mpi4py", os.path.join(HERE, "mpi_pytest.py"), "--with-mpi", "-m", "mpi",
                   "-q", *timeouts, *pytest_args]
        started = time.monotonic()
        with EmulatedCluster(nodes=nodes, rate="1gbit") as cluster:
            print(f"[run_world_sizes] {name}: nodes {', '.join(cluster.topology.hosts().values())} "
                  f"on {cluster.topology.subnet}", flush=True)
            before = cluster.link_bytes()
            code, output = cluster.run(ranks, command, env=env, timeout=args.run_timeout, echo=True, cwd=ROOT)
            crossed = sum((after - before[node]).tx for node, after in cluster.link_bytes().items())
        print(f"[run_world_sizes] exit {code} after {time.monotonic() - started:.1f} s; "
              f"{crossed:,} bytes crossed the links", flush=True)
        results.append((name, code, counts(output)))
    return summary(results)


def summary(results: list[tuple[str, int, dict[str, int]]]) -> int:
    """Print the summary of every run; 1 if any failed."""
    print("\nmpiring test summary")
    failed_runs = passed = failed = skipped = 0
    for name, code, found in results:
        # exit 0 needs pytest's own summary too: MPICH's mpiexec can exit 0 after killing a hung job
        summarized = found.get("passed", 0) + found.get("skipped", 0) > 0
        ok = (code == 5 or (code == 0 and summarized)) and not found.get("failed") and not found.get("error")
        failed_runs += not ok
        passed += found.get("passed", 0)
        failed += found.get("failed", 0) + found.get("error", 0) + (0 if ok or found.get("failed") else 1)
        skipped += found.get("skipped", 0)
        shown = ", ".join(f"{v} {k}" for k, v in found.items()) or "no summary"
        print(f"  {name:<14} {'ok  ' if ok else 'FAIL'} {shown} (exit {code})")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())
