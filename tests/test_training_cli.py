"""The training command (examples/train.py, mpiring-train, python -m mpiring.train) as a user runs
it, under mpirun at several world sizes: flags, errors that stop every rank without a hang,
reports, plots, Ctrl-C, and a resume at another world size."""

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
TRAIN = os.path.join(ROOT, "examples", "train.py")
# A model of a few hundred parameters, so each launch is mostly start-up.
TINY = ["--model", "mlp", "--context", "3", "--embed", "5", "--hidden", "7", "--layers", "2", "--batch-size", "10",
        "--log-every", "0", "--sample-chars", "20"]
GPT_TINY = ["--context", "4", "--embed", "6", "--heads", "2", "--hidden", "10", "--layers", "2", "--batch-size", "6",
            "--lr", "0.5", "--warmup", "2", "--log-every", "0", "--sample-chars", "20"]
TIMEOUT = 120


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return dict(mpi_environment(), PYTHONPATH=path, MPIEXEC_TIMEOUT=str(TIMEOUT))


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("The ring all-reduce sends every byte twice around the ring. " * 40)
    return str(path)


def launch(env: dict[str, str], ranks: int, *args: str, python: tuple[str, ...] = (TRAIN,)
           ) -> subprocess.CompletedProcess:
    """`mpiexec -n ranks python train.py args` (ranks 0: plain python, no launcher)."""
    command = [sys.executable, *python, *args]
    if ranks:
        command = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks), *command]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT + 30)


@pytest.mark.parametrize(("flags", "message"), [
    (["--strategy", "zero9"], "invalid choice: 'zero9'"),
    (["--steps", "-3"], "must be >= 0"),
    (["--dtype", "float16"], "invalid choice: 'float16'"),
    (["--resume"], "need --checkpoint-dir"),
    (["--checkpoint-dir", "ck", "--fresh"], "--fresh applies with --resume only"),
])
def test_bad_flags_get_argparse_messages(env, flags, message):
    done = launch(env, 0, *flags)
    assert done.returncode == 2
    assert message in done.stderr and "usage:" in done.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--heads", "5"], "the embedding width 48 must be a multiple of the 5 heads"),
    (["--model", "mlp", "--heads", "2"], "heads applies to the gpt model only"),
])
def test_impossible_model_shapes_stop_every_rank_with_one_message(env, flags, message):
    done = launch(env, 2, *flags)
    assert done.returncode == 1
    assert done.stderr.count(message) == 1, done.stderr


def test_bad_flags_under_mpirun_print_once_and_end(env):
    done = launch(env, 3, "--strategy", "zero9")
    assert done.returncode != 0
    assert done.stderr.count("invalid choice") == 1


@pytest.mark.parametrize(("data", "message"), [("/no/such/file.txt", "does not exist"), ("/", "is a directory")])
def test_unreadable_data_stops_every_rank_with_a_message(env, data, message):
    done = launch(env, 3, "--data", data, *TINY)
    assert done.returncode != 0
    assert done.stderr.count(message) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_gpu_without_a_usable_gpu_says_so(env):
    try:
        import cupy

        if cupy.is_available():
            pytest.skip("this machine has a GPU")
    except ImportError:
        pass
    done = launch(env, 2, "--device", "gpu", *TINY)
    assert done.returncode != 0
    assert "--device gpu" in done.stderr


def test_an_unexpected_error_on_one_rank_aborts_the_job(env):
    """A bug that raises on one rank only must not leave the others waiting in a collective."""
    crash = (
        "import os, runpy, sys; import mpiring.training as t\n"
        "def boom(*a, **k): raise ValueError('a bug on rank 1')\n"
        "if os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')) == '1': t.train = boom\n"
        f"sys.argv = [{TRAIN!r}] + sys.argv[1:]\n"
        f"runpy.run_path({TRAIN!r}, run_name='__main__')\n"
    )
    done = launch(env, 2, *TINY, python=("-c", crash))
    assert done.returncode != 0
    assert "ValueError: a bug on rank 1" in done.stderr


def test_a_run_reports_plots_and_checkpoints(env, text, tmp_path):
    report, plot, checkpoints = tmp_path / "r.json", tmp_path / "r.png", tmp_path / "ck"
    args = ["--data", text, "--steps", "6", "--dtype", "float64", "--report", str(report),
            "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "4", "--log-every", "1"]
    try:
        import matplotlib  # noqa: F401

        args += ["--plot", str(plot)]
    except ImportError:
        plot = None
    done = launch(env, 2, *GPT_TINY, *args)  # the default model, gpt
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("step ") >= 6 and "sent/rank/step" in done.stdout and "sample" in done.stdout
    assert "comm waited" in done.stdout and "hidden" in done.stdout
    r = json.loads(report.read_text())
    for key in ("strategy", "world_size", "steps", "dtype", "losses", "final_loss", "param_count",
                "model_state_bytes_per_rank", "peak_bytes_per_rank", "bytes_sent_per_rank", "tokens_per_s",
                "compute_seconds", "comm_seconds", "hidden_seconds", "hidden_share", "tokens_per_step"):
        assert key in r
    assert (r["strategy"], r["world_size"], r["steps"], r["dtype"]) == ("zero3", 2, 6, "float64")
    assert (r["model"]["kind"], r["tokens_per_step"]) == ("gpt", 6 * 4)
    assert len(r["losses"]) == 6 and r["final_loss"] == r["losses"][-1] < r["losses"][0]
    assert sorted(os.listdir(checkpoints)) == ["step-00000004", "step-00000006"]  # every 4, and the end
    if plot:
        assert plot.stat().st_size > 1000


def test_resume_at_another_world_size_with_another_strategy(env, text, tmp_path):
    common = ["--data", text, "--dtype", "float64", *TINY]
    straight, resumed, checkpoints = tmp_path / "straight.json", tmp_path / "resumed.json", tmp_path / "ck"
    assert launch(env, 1, *common, "--steps", "8", "--strategy", "ddp", "--report", str(straight)).returncode == 0
    first = launch(env, 2, *common, "--steps", "4", "--strategy", "zero3", "--checkpoint-dir", str(checkpoints))
    assert first.returncode == 0, first.stderr
    second = launch(env, 3, *common, "--steps", "8", "--strategy", "zero1", "--checkpoint-dir", str(checkpoints),
                    "--resume", "--report", str(resumed))
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout and "step-00000004" in second.stdout
    a, b = json.loads(straight.read_text()), json.loads(resumed.read_text())
    assert b["resumed_from_step"] == 4 and b["steps_run"] == 4 and len(b["losses"]) == 8
    assert b["losses"] == pytest.approx(a["losses"], rel=1e-10)


def test_resume_with_no_steps_left_says_so(env, text, tmp_path):
    common = ["--data", text, *TINY, "--checkpoint-dir", str(tmp_path / "ck")]
    assert launch(env, 2, *common, "--steps", "3").returncode == 0
    again = launch(env, 2, *common, "--steps", "3", "--resume")
    assert again.returncode == 1
    assert again.stderr.count("the checkpoint is at step 3: --steps 3 leaves nothing to run") == 1, again.stderr


def test_module_and_console_script_run_the_same_command(env):
    done = launch(env, 0, "--help", python=("-m", "mpiring.train"))
    assert done.returncode == 0 and "--strategy" in done.stdout
    script = shutil.which("mpiring-train", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("mpiring is not installed here (pip install -e .): no mpiring-train script")
    done = subprocess.run([script, "--help"], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0 and "--strategy" in done.stdout


def test_ctrl_c_prints_one_line(env, text):
    """SIGINT to the job (what Ctrl-C sends): no traceback from any rank, at most one line (from rank
    0; none when rank 0 sat in a blocking MPI wait and the launcher ended it first), a failed exit."""
    command = [shutil.which("mpiexec") or "mpiexec", "-n", "2", sys.executable, TRAIN, "--data", text, *TINY,
               "--steps", "100000", "--log-every", "1"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline()  # the run has started (its first line)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert err.count("interrupted") <= 1 and "Traceback" not in err and "Abort(" not in err, err
