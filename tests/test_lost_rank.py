"""A rank lost for good, at 3, 4 and 8 ranks: every survivor's call ends with RankLostError naming
it, the survivors shrink, and a collective on the new communicator is right (NumPy's answer).

Each test launches its own job (tests/lost_rank_scenarios.py says what each stage does) with
the launch setting that keeps the survivors running, under a hard timeout: a hang fails the
test, it never holds up the suite. Several losses share one launch (8 ranks lose up to 5, one
per stage), so that many kill points cost few start-ups. Without survival, or without that
launch setting, a lost rank still ends the whole job at once: tested too. The torch.distributed
backend goes on too (tests/torch_lost_rank.py): the survivors' default group is made again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from run_world_sizes import mpi_environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = os.path.join(ROOT, "tests", "lost_rank_scenarios.py")
TIMEOUT = 60  # seconds a whole launch may take (each takes a few)


def launcher() -> tuple[list[str], dict[str, str]]:
    """mpiexec with the setting that keeps survivors running (docs/lost-rank.md), and its environment."""
    env = mpi_environment()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec") or "mpiexec"
    keep_going = ["--with-ft", "ulfm"] if "OMPI_ALLOW_RUN_AS_ROOT" in env else ["-disable-auto-cleanup"]
    return [mpiexec, *keep_going], env


# Each rank's program under a shell that outlives it and ignores the launcher's SIGUSR1
# (docs/lost-rank.md, "Launch settings"): a rank killed by a signal then reaches Hydra as an exit.
IN_A_SHELL = ["sh", "-c", 'trap "" USR1; "$@"; exit $?', "sh"]


def launch(ranks: int, stages: list[dict], tmp_path, keep_going: bool = True,
           in_a_shell: bool = False) -> tuple[subprocess.CompletedProcess, dict[int, dict]]:
    command, env = launcher()
    if not keep_going:
        command = command[:1]
    command += ["-n", str(ranks), *(IN_A_SHELL if in_a_shell else []), sys.executable, SCENARIOS,
                json.dumps(stages), str(tmp_path)]
    done = run_within(command, env, tmp_path)
    results = {result["world"]: result for result in reports(done.stdout)}
    return done, results


def run_within(command: list[str], env: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    """Run the job under TIMEOUT; on a hang, fail with what the ranks wrote so far (each survivor's
    stacks from the scenario's faulthandler dump among it), which subprocess.run would drop."""
    with open(tmp_path / "job.out", "w+") as out, open(tmp_path / "job.err", "w+") as err:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the launcher and every rank: none lingers into the next test
            process.wait()
            out.seek(0)
            err.seek(0)
            pytest.fail(f"the job did not end within {TIMEOUT} s (a survivor hung):\n{out.read()[-3000:]}\n"
                        f"{err.read()[-20000:]}")
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read())


def reports(output: str) -> list[dict]:
    """The ranks' "RESULT <json>" reports (the launcher may run two ranks' lines together)."""
    decoder, found, at = json.JSONDecoder(), [], output.find("RESULT ")
    while at >= 0:
        report, end = decoder.raw_decode(output, at + len("RESULT "))
        found.append(report)
        at = output.find("RESULT ", end)
    return found


def check(ranks: int, stages: list[dict], done: subprocess.CompletedProcess, results: dict[int, dict]) -> None:
    """Every rank that survived to the end saw, at every stage, the named error naming the lost
    rank, shrank to the right members in order, and summed right on the new communicator; no call
    returned wrong data."""
    members, expected = list(range(ranks)), []
    for stage in stages:
        gone = [] if stage["how"] == "revoke" else [stage["victim"]]
        if stage["how"] == "shrink":
            gone.append(stage["victim2"])
        lost_here = [members.index(stage["victim"])] if gone else []
        members = [w for w in members if w not in gone]
        expected.append((stage, lost_here, list(members), len(gone)))
    assert sorted(results) == members, (f"{sorted(results)} reported, the survivors are {members}:\n{done.stdout}\n"
                                        f"{done.stderr[-3000:]}")
    for number, (stage, lost_here, after, gone) in enumerate(expected):
        for world in members:
            seen = results[world]["stages"][number]
            assert seen["wrong"] == 0, seen
            if stage["how"] == "revoke":
                assert seen["error"] in ("CommunicatorRevokedError", "RankLostError") and seen["lost"] == [], seen
            else:
                assert seen["error"] == "RankLostError", seen
                assert seen["lost"] == lost_here, seen
            assert seen["members"] == after, seen
            assert seen["sum_ok"], seen
            assert seen["agreed_after"] == (1 if any(w % 2 for w in after) else 3), seen
            assert seen["failed_group"] == gone, seen


def run(ranks: int, stages: list[dict], tmp_path, in_a_shell: bool = False) -> None:
    done, results = launch(ranks, stages, tmp_path, in_a_shell=in_a_shell)
    check(ranks, stages, done, results)


# ---- inside each collective (os._exit from a timer thread of the victim, mid-loop) ----

def test_lost_inside_blocking_collectives_8_ranks(tmp_path) -> None:
    run(8, [
        {"op": "allreduce", "how": "exit", "victim": 5, "size": 20000},
        {"op": "broadcast", "how": "exit", "victim": 7, "size": 20000},
        {"op": "allgather", "how": "exit", "victim": 1, "size": 5000},
        {"op": "reduce_scatter", "how": "exit", "victim": 4, "size": 3000},
        {"op": "alltoall", "how": "exit", "victim": 6, "size": 3000},
    ], tmp_path)


def test_lost_inside_gather_and_barrier_4_ranks(tmp_path) -> None:
    run(4, [
        {"op": "gather", "how": "exit", "victim": 3, "size": 64},
        {"op": "barrier", "how": "exit", "victim": 1},
    ], tmp_path)


# ---- between calls, in a nonblocking wait, in a persistent request ----

def test_lost_inside_allreduce_3_ranks(tmp_path) -> None:
    run(3, [{"op": "allreduce", "how": "exit", "victim": 1, "size": 1000}], tmp_path)


def test_between_calls_3_ranks(tmp_path) -> None:
    run(3, [{"op": "allreduce", "how": "between", "victim": 0, "size": 8, "calls": 5}], tmp_path)


def test_nonblocking_and_persistent_8_ranks(tmp_path) -> None:
    run(8, [
        {"op": "iallreduce", "how": "wait", "victim": 3, "size": 1000},
        {"op": "ibroadcast", "how": "exit", "victim": 7, "size": 1000},
        {"op": "iallgather", "how": "exit", "victim": 0, "size": 200},
        {"op": "allreduce_init", "how": "exit", "victim": 2, "size": 5000},
        {"op": "allreduce_init", "how": "between", "victim": 6, "size": 8, "calls": 4},
    ], tmp_path)


# ---- killed by a signal from outside ----

def test_sigkill_from_outside_4_ranks(tmp_path) -> None:
    """Another rank sends the victim SIGKILL inside an allreduce loop; each rank runs under the
    shell that makes a death by signal an exit to the launcher."""
    run(4, [{"op": "allreduce", "how": "sigkill", "victim": 2, "size": 1000}], tmp_path, in_a_shell=True)


# ---- during shrink, a second loss, a revoke ----

def test_lost_entering_agree_and_shrink_4_ranks(tmp_path) -> None:
    run(4, [{"op": "allreduce", "how": "shrink", "victim": 1, "victim2": 2, "point": "agree", "calls": 3}], tmp_path)


def test_lost_during_shrink_8_ranks(tmp_path) -> None:
    run(8, [
        {"op": "allreduce", "how": "shrink", "victim": 3, "victim2": 5, "point": "shrink", "calls": 2},
        {"op": "allreduce", "how": "shrink", "victim": 0, "victim2": 7, "point": "create", "calls": 2},
        {"op": "allreduce", "how": "shrink", "victim": 2, "victim2": 4, "point": "make", "calls": 2},
    ], tmp_path)


def test_revoke_then_a_loss_3_ranks(tmp_path) -> None:
    run(3, [
        {"op": "allreduce", "how": "revoke", "victim": 1, "size": 8},
        {"op": "allreduce", "how": "exit", "victim": 2, "size": 8},
    ], tmp_path)


# ---- the default: the launcher ends the job ----

def test_default_launch_ends_the_job_at_once(tmp_path) -> None:
    """Without the launch setting the lost rank ends every rank, survival or not: nobody
    reaches the end, and the job ends long before a survivor's guard would."""
    began = time.monotonic()
    done, results = launch(3, [{"op": "allreduce", "how": "between", "victim": 2, "size": 8, "calls": 3}],
                           tmp_path, keep_going=False)
    assert done.returncode != 0
    assert results == {}
    assert time.monotonic() - began < TIMEOUT  # (it ended on its own: launch fails the test on a hang)


@pytest.mark.parametrize("ranks", [3])
def test_survival_off_loses_nothing_and_shrink_is_a_copy(ranks: int, tmp_path) -> None:
    """Survival off: the communicator has no watcher; agree is an allreduce and shrink a copy."""
    script = tmp_path / "off.py"
    script.write_text(
        "import numpy as np, mpiring\n"
        "comm = mpiring.Communicator()\n"
        "assert not comm.survives and comm.lost() == [] and not comm.is_revoked()\n"
        "new = comm.shrink()\n"
        "total = new.allreduce(np.ones(3))\n"
        "assert new.size == comm.size and (total == comm.size).all()\n"
        "assert comm.agree(2 + comm.rank % 2) == (2 if comm.size > 1 else 2 + comm.rank % 2)\n"
        "assert comm.Agree(1) == 1 and comm.Get_failed().Get_size() == 0 and comm.Ack_failed() == 0\n"
        "try:\n"
        "    comm.revoke()\n"
        "except mpiring.ArgumentError:\n"
        "    print('REFUSED', flush=True)\n")
    command, env = launcher()
    done = run_within([command[0], "-n", str(ranks), sys.executable, str(script)], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("REFUSED") == ranks


# ---- the training run goes on ----

def test_training_goes_on_after_two_losses(tmp_path) -> None:
    """4 ranks lose world rank 2 after step 6 and rank 0 after step 10: the run ends at step 12 on
    2 ranks, and its losses from each checkpoint it went on from equal (to 1e-10, float64) those
    of a fresh run resumed from a copy of that checkpoint on as many ranks."""
    script = os.path.join(ROOT, "tests", "elastic_training.py")
    command, env = launcher()
    elastic = run_within([*command, "-n", "4", sys.executable, script, "elastic", str(tmp_path)], env, tmp_path)
    found = reports(elastic.stdout)
    assert len(found) == 1, elastic.stdout + elastic.stderr[-3000:]
    run = found[0]
    assert run["size"] == 2 and len(run["losses"]) == 12, run
    assert [(r["ranks"], r["step"]) for r in run["recoveries"]] == [(3, 4), (2, 8)], run
    reference = run_within([command[0], "-n", "3", sys.executable, script, "reference", str(tmp_path)], env, tmp_path)
    found = reports(reference.stdout)
    assert len(found) == 1, reference.stdout + reference.stderr[-3000:]
    fresh = found[0]
    assert len(fresh["4"]) == 8 and len(fresh["8"]) == 12
    for start, end in ((4, 8), (8, 12)):
        for step in range(start, end):
            assert abs(run["losses"][step] - fresh[str(start)][step]) <= 1e-10, (step, run["losses"], fresh)
    assert run["losses"][:4] == fresh["4"][:4]  # the steps before the first checkpoint, as saved


# ---- torch.distributed goes on ----

@pytest.mark.parametrize("ranks,victim", [(3, 1), (4, 0)])  # rank 0 served torch's key-value store
def test_torch_default_group_goes_on(ranks: int, victim: int, tmp_path) -> None:
    """A rank leaves inside dist.all_reduce on the "mpiring" backend: every survivor's call raises
    RankLostError naming it, mpiring.torch.shrink_process_group() makes the default group on the
    N-1 survivors (renumbered in order), and its all_reduce, broadcast, all_gather and a new
    group's all_reduce equal NumPy's on regenerated inputs; no call returned wrong data."""
    pytest.importorskip("torch", reason="torch is not installed (pip install 'mpiring[torch]')")
    command, env = launcher()
    env["MPIRING_SURVIVE"] = "1"
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # mpiring.torch fills them from MPI
        env.pop(name, None)
    script = os.path.join(ROOT, "tests", "torch_lost_rank.py")
    done = run_within([*command, "-n", str(ranks), sys.executable, script, str(victim), str(tmp_path)], env, tmp_path)
    results = {result["world"]: result for result in reports(done.stdout)}
    members = [w for w in range(ranks) if w != victim]
    assert sorted(results) == members, f"{done.stdout}\n{done.stderr[-3000:]}"
    for world, seen in results.items():
        assert seen["wrong"] == 0 and seen["calls"] > 0, seen
        assert seen["error"] == "RankLostError" and seen["lost"] == [victim], seen
        assert (seen["rank"], seen["size"]) == (members.index(world), ranks - 1) and seen["default"], seen
        checks = ["all_reduce", "broadcast_0", f"broadcast_{ranks - 2}", "all_gather"]
        checks += ["new_group"] if seen["rank"] < 2 else []
        assert seen["checks"] == dict.fromkeys(checks, True), seen
