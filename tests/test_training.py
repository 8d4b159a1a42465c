"""The training demo under MPI, at every world size: each strategy computes what one process
computes, holds the memory and sends the bytes ZeRO says, and checkpoints that resume exactly,
survive a crash mid-save and load at another world size.

Run: python tests/run_world_sizes.py --no-serial --sizes 1 2 3 4 8 -- tests/test_training.py
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from typing import Any

import numpy
import pytest
from mpi4py import MPI

import mpiring
from mpiring import collectives
from mpiring.training import STRATEGIES, TrainConfig, TrainingError, build, default_text, train
from mpiring.training import checkpoint as checkpoint_module
from mpiring.training.data import CharData
from mpiring.training.report import expected_ratio, summarize, traffic_factor

pytestmark = pytest.mark.mpi

TEXT = default_text()[:20000]
# A model of ~1,300 parameters whose layers split unevenly over 3 and 8 ranks; a batch of 10
# splits unevenly too (at 8 ranks: 2 2 1 1 1 1 1 1). Small buckets give ddp and zero2 several.
TINY = TrainConfig(model="mlp", context=3, embed=5, hidden=7, layers=2, batch_size=10, lr=0.2, momentum=0.9,
                   bucket_bytes=600, log_every=0, sample_chars=0, dtype="float64")
# A GPT of ~3,000 parameters: two blocks of two heads; a batch of 6 sequences of 4 characters
# leaves ranks empty at 8 (1 1 1 1 1 1 0 0). Its schedule warms up over 2 steps and decays by
# step 5, so the tests cross every part of it.
GPT_TINY = replace(TINY, model="gpt", context=4, embed=6, heads=2, hidden=10, batch_size=6, lr=0.5,
                   warmup=2, decay_steps=5, bucket_bytes=2000)
MODELS = {"mlp": TINY, "gpt": GPT_TINY}
_references: dict[Any, tuple[list[float], numpy.ndarray]] = {}


@pytest.fixture(scope="module")
def alone() -> mpiring.Communicator:
    """A world of one on every rank: the single process that every strategy must agree with."""
    return mpiring.Communicator(MPI.COMM_SELF)


@pytest.fixture
def shared_dir(comm):
    """A fresh directory that every rank sees (made by rank 0)."""
    path = comm.mpi.bcast(tempfile.mkdtemp(prefix="mpiring-train-") if comm.rank == 0 else None, root=0)
    yield path
    comm.mpi.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def reference(config: TrainConfig, alone: mpiring.Communicator) -> tuple[list[float], numpy.ndarray]:
    """Losses and final parameters of `config` trained by one process (ddp on a world of one)."""
    key = (config.model, config.dtype, config.steps, config.momentum)
    if key not in _references:
        result = train(replace(config, strategy="ddp", checkpoint_dir=None, resume=False), alone, TEXT)
        _references[key] = (result.losses, result.strategy.full_parameters())
    return _references[key]


def relative(a: Any, b: Any) -> float:
    a, b = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
    return float(numpy.linalg.norm(a - b) / numpy.linalg.norm(b))


def assert_same_run(result, losses: list[float], params: numpy.ndarray, tolerance: float) -> None:
    assert len(result.losses) == len(losses)
    worst = max(abs(a - b) / abs(b) for a, b in zip(result.losses, losses, strict=True))
    assert worst <= tolerance, f"losses differ by {worst:.3g} relative"
    mine = result.strategy.full_parameters(root=0)
    if result.strategy.comm.rank == 0:
        assert relative(mine, params) <= tolerance


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(("dtype", "steps", "tolerance"), [("float64", 6, 1e-10), ("float32", 20, 1e-5)])
def test_every_strategy_matches_one_process(comm, alone, model, strategy, dtype, steps, tolerance):
    config = replace(MODELS[model], strategy=strategy, dtype=dtype, steps=steps)
    result = train(config, comm, TEXT)
    assert_same_run(result, *reference(config, alone), tolerance)
    assert result.losses[-1] < result.losses[0]


def test_a_progress_bar_fills_the_steps_between_logged_lines(comm):
    lines, bars = [], []
    config = replace(TINY, steps=7, log_every=3)
    result = train(config, comm, TEXT, log=lines.append, progress=lambda *step: bars.append(step))
    logged = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in logged] == ["3/7", "6/7", "7/7"]
    assert [(step, steps) for step, steps, _ in bars] == [(1, 7), (2, 7), (4, 7), (5, 7)]
    assert [loss for _, _, loss in bars] == [result.losses[k - 1] for k in (1, 2, 4, 5)]


def test_plain_sgd_matches_one_process(comm, alone):
    config = replace(TINY, strategy="zero3", momentum=0.0, steps=4)
    result = train(config, comm, TEXT)
    assert result.memory["optimizer"] == 0
    assert_same_run(result, *reference(config, alone), 1e-10)


class _Deferred:
    """A 'nonblocking' collective that runs when waited for."""

    def __init__(self, run) -> None:
        self._run, self._result, self._done = run, None, False

    def test(self) -> bool:
        return self._done

    def wait(self) -> Any:
        if not self._done:
            self._result, self._done = self._run(), True
        return self._result


class _Nonblocking:
    """The communicator plus iallreduce, ireduce_scatter, iallgather... deferred to wait():
    drives the strategies' overlap code path (prefetch, pending reductions) without real overlap."""

    def __init__(self, comm) -> None:
        self._comm = comm

    def __getattr__(self, name: str) -> Any:
        if name.startswith("i") and hasattr(self._comm, name[1:]):
            blocking = getattr(self._comm, name[1:])
            return lambda *args, **kwargs: _Deferred(lambda: blocking(*args, **kwargs))
        return getattr(self._comm, name)


NONBLOCKING = ("iallreduce", "ireduce_scatter", "iallgather")


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("requests", ["deferred", "mpiring"])
def test_overlap_path_gives_the_same_bits(comm, model, strategy, requests):
    if requests == "mpiring" and not all(hasattr(comm, name) for name in NONBLOCKING):
        pytest.skip("this mpiring has no nonblocking collectives")
    config = replace(MODELS[model], strategy=strategy, steps=3)
    blocking = train(config, comm, TEXT)
    overlapped = train(replace(config, overlap=True), _Nonblocking(comm) if requests == "deferred" else comm, TEXT)
    assert overlapped.losses == blocking.losses
    a, b = blocking.strategy.full_parameters(), overlapped.strategy.full_parameters()
    if comm.rank == 0:
        assert numpy.array_equal(a, b)
    # The clock's account: blocking collectives are all waited on; nothing is hidden.
    assert blocking.hidden_seconds == 0.0 and blocking.comm_seconds > 0.0
    assert overlapped.hidden_seconds >= 0.0


class _BlockingOnly:
    """The communicator without its nonblocking collectives."""

    def __init__(self, comm) -> None:
        self._comm = comm

    def __getattr__(self, name: str) -> Any:
        if name in NONBLOCKING:
            raise AttributeError(name)
        return getattr(self._comm, name)


def test_overlap_needs_nonblocking_collectives(comm):
    with pytest.raises(TrainingError, match="lacks iallreduce, ireduce_scatter, iallgather"):
        train(replace(TINY, overlap=True, steps=1), _BlockingOnly(comm), TEXT)


def _one_step(config: TrainConfig, comm) -> Any:
    """A strategy after one step (so every transient buffer has come and gone once)."""
    data = CharData(TEXT, config.context)
    strategy = build(config, comm, data)
    strategy.memory.reset_peak()
    per_example = strategy.model.config.predictions_per_example
    inputs, targets = data.batch(0, config.examples, config.seed, comm.rank, comm.size, every_position=per_example > 1)
    strategy.step(inputs, targets, config.examples * per_example)
    return strategy


def _max_over_ranks(comm, value: int) -> int:
    return int(comm.allreduce(numpy.array([value], dtype=numpy.int64), op="max")[0])


# Eight equal hidden layers (blocks) dwarf the embedding and output, so one layer is ~1/10 of
# the model.
BALANCED = {"mlp": replace(TINY, dtype="float32", context=4, embed=8, hidden=32, layers=8, bucket_bytes=0),
            "gpt": replace(GPT_TINY, dtype="float32", context=4, embed=8, hidden=16, layers=8, bucket_bytes=0)}


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_memory_per_rank_is_what_zero_says(comm, model, strategy):
    n = comm.size
    config = replace(BALANCED[model], strategy=strategy)
    measured = _one_step(config, comm)
    memory = {k: _max_over_ranks(comm, v) for k, v in measured.memory.snapshot().items()}
    model = measured.model
    model_bytes = model.param_count * model.dtype.itemsize
    ddp = 3 * model_bytes  # parameters + gradients + momentum, each whole
    layer = max(model.layer_bytes)
    # Shards are array_split parts: the largest is at most one value per group longer than 1/N.
    slack = 3 * len(model.layers) * model.dtype.itemsize
    expected = expected_ratio(strategy, n, slots=1) * ddp
    assert expected - 1e-9 <= memory["model_state"] <= expected + slack
    if n == 4:  # ZeRO's formulas for fp32 SGD with momentum at 4 ranks, ratios to DDP
        formula = {"ddp": 12 / 12, "zero1": (8 + 4 / n) / 12, "zero2": (4 + 8 / n) / 12, "zero3": (12 / n) / 12}
        assert memory["model_state"] / ddp == pytest.approx(formula[strategy], rel=0.01)
    transient = memory["peak"] - memory["model_state"]
    if strategy == "ddp":
        assert memory["peak"] == memory["model_state"] == ddp
    elif strategy == "zero1":  # only the copy of this rank's piece that the all-gather sends
        assert transient <= model_bytes / n + slack
    elif strategy == "zero2":  # one bucket (here one layer) of full gradient at a time
        assert layer <= transient <= layer + model_bytes / n + slack
    else:  # one layer's gathered parameters and its full gradient
        assert layer <= transient <= 2 * layer


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_bytes_sent_per_step_are_what_the_ring_says(comm, model, strategy):
    n = comm.size
    result = train(replace(MODELS[model], strategy=strategy, steps=2, algorithm="ring"), comm, TEXT)
    report = summarize(result, comm)
    model_bytes = result.strategy.model.param_count * 8
    theory = traffic_factor(strategy, n)[0] * model_bytes
    assert report["bytes_sent_per_rank_theory"] == pytest.approx(theory)
    # Beyond the theory: the one-number loss all-reduce and the few bytes each all-gather sends
    # first to agree on the row counts (a record, or at a few ranks a slot, per peer).
    # (one all-gather per group after the update; ZeRO-3 gathers each layer twice instead)
    gathers = 0 if strategy == "ddp" else len(result.strategy.groups.ranges) * (2 if strategy == "zero3" else 1)
    record = collectives.layout_slot_bytes(comm._ring) if collectives.layout_in_slots(comm._ring) else 64
    extra = 2 * 8 + gathers * (n - 1) * record
    assert theory <= report["bytes_sent_per_rank"] <= theory + extra


def test_ranks_split_the_global_batch(comm):
    data = CharData(TEXT, 3)
    for step in (0, 1, 7):
        inputs, targets = data.batch(step, 10, 5, comm.rank, comm.size)
        everyone = comm.allgather(numpy.ascontiguousarray(targets))
        whole_inputs, whole_targets = data.batch(step, 10, 5, 0, 1)
        assert numpy.array_equal(everyone, whole_targets)
        assert numpy.array_equal(comm.allgather(numpy.ascontiguousarray(inputs)), whole_inputs)


def test_a_problem_on_one_rank_stops_every_rank(comm):
    from mpiring.training.errors import agree

    last = comm.size - 1
    with pytest.raises(TrainingError, match="disk on fire") as raised:
        agree(comm, "disk on fire" if comm.rank == last else None)
    if comm.rank != last:
        assert f"on rank {last}" in str(raised.value)
    agree(comm, None)  # and nothing happens when nobody has a problem


# ---- checkpoints -------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "strategy"), [("mlp", name) for name in STRATEGIES] + [("gpt", "zero3")])
def test_resume_continues_bitwise(comm, shared_dir, model, strategy):
    config = replace(MODELS[model], strategy=strategy, steps=6)
    straight = train(config, comm, TEXT)
    saved = replace(config, steps=3, checkpoint_dir=shared_dir, checkpoint_every=3)
    train(saved, comm, TEXT)
    assert checkpoint_module.latest(shared_dir).endswith("step-00000003")
    resumed = train(replace(saved, steps=6, resume=True), comm, TEXT)
    assert resumed.start_step == 3
    assert resumed.losses == straight.losses
    a, b = straight.strategy.full_parameters(), resumed.strategy.full_parameters()
    if comm.rank == 0:
        assert numpy.array_equal(a, b)
        with open(os.path.join(shared_dir, "step-00000003", "manifest.json")) as handle:
            assert len(__import__("json").load(handle)["shards"]) == comm.size  # one shard per rank


def test_checkpoint_loads_at_another_world_size_and_strategy(comm, alone, shared_dir):
    config = replace(TINY, steps=5)
    losses, params = reference(config, alone)
    # N ranks of ZeRO-3 save at step 3; one process of DDP continues from it.
    train(replace(config, strategy="zero3", steps=3, checkpoint_dir=shared_dir), comm, TEXT)
    if comm.rank == 0:
        private = os.path.join(shared_dir, "alone")
        shutil.copytree(shared_dir, private, ignore=shutil.ignore_patterns("alone"))
        continued = train(replace(config, strategy="ddp", checkpoint_dir=private, resume=True), alone, TEXT)
        assert continued.start_step == 3
        assert_same_run(continued, losses, params, 1e-10)
    # One process of ZeRO-1 saves at step 3; N ranks of ZeRO-2 continue from it.
    other = os.path.join(shared_dir, "from-one")
    if comm.rank == 0:
        train(replace(config, strategy="zero1", steps=3, checkpoint_dir=other), alone, TEXT)
    comm.barrier()
    continued = train(replace(config, strategy="zero2", checkpoint_dir=other, resume=True), comm, TEXT)
    assert continued.start_step == 3
    assert_same_run(continued, losses, params, 1e-10)


def test_a_crash_mid_save_leaves_the_previous_checkpoint(comm, shared_dir, monkeypatch):
    config = replace(TINY, strategy="zero3", steps=2, checkpoint_dir=shared_dir, checkpoint_every=2)
    train(config, comm, TEXT)

    def crash() -> None:
        raise RuntimeError("power cut")

    monkeypatch.setattr(checkpoint_module, "_before_publish", crash)
    with pytest.raises(RuntimeError, match="power cut"):
        train(replace(config, steps=4, resume=True), comm, TEXT)
    monkeypatch.undo()
    comm.barrier()
    # Every shard of step 4 was written, but under the temporary name: not a checkpoint.
    assert os.path.isdir(os.path.join(shared_dir, ".tmp-step-00000004"))
    assert checkpoint_module.latest(shared_dir).endswith("step-00000002")
    resumed = train(replace(config, steps=4, resume=True), comm, TEXT)
    assert resumed.start_step == 2
    assert resumed.losses == train(replace(TINY, strategy="zero3", steps=4), comm, TEXT).losses
    assert checkpoint_module.latest(shared_dir).endswith("step-00000004")
    assert not os.path.exists(os.path.join(shared_dir, ".tmp-step-00000004"))


def test_a_corrupt_or_foreign_checkpoint_stops_every_rank(comm, shared_dir):
    config = replace(TINY, strategy="zero2", steps=1, checkpoint_dir=shared_dir)
    train(config, comm, TEXT)
    with pytest.raises(TrainingError, match="different run; model"):
        train(replace(config, hidden=8, steps=2, resume=True), comm, TEXT)
    comm.barrier()
    if comm.rank == 0:
        shard = os.path.join(shared_dir, "step-00000001", "shard-00000.npy")
        with open(shard, "r+b") as handle:
            handle.seek(-1, os.SEEK_END)
            last = handle.read(1)
            handle.seek(-1, os.SEEK_END)
            handle.write(bytes([last[0] ^ 0xFF]))
    comm.barrier()
    with pytest.raises(TrainingError, match="corrupt") as raised:
        train(replace(config, steps=2, resume=True), comm, TEXT)
    assert "pass --fresh to start from step 0 anyway" in str(raised.value)
    lines: list[str] = []  # on purpose: past the corrupt checkpoint, with a warning naming it
    fresh = train(replace(config, steps=2, resume=True, fresh=True), comm, TEXT, log=lines.append)
    assert fresh.start_step == 0 and len(fresh.losses) == 2
    assert any(line.startswith("warning: step-00000001: ") and "corrupt" in line for line in lines), lines


def _edit(comm, path: str, change) -> None:
    """Rank 0 rewrites a file of a checkpoint; every rank sees the change on return."""
    if comm.rank == 0:
        with open(path, "r+b") as handle:
            data = change(handle.read())
            handle.seek(0)
            handle.truncate()
            handle.write(data)
    comm.barrier()


def test_an_edited_manifest_is_refused(comm, shared_dir):
    """Valid JSON with another step in it is not a checkpoint: the manifest checks itself."""
    config = replace(TINY, strategy="zero1", steps=2, checkpoint_dir=shared_dir)
    train(config, comm, TEXT)
    manifest = os.path.join(shared_dir, "step-00000002", "manifest.json")
    _edit(comm, manifest, lambda data: data.replace(b'"step": 2', b'"step": 1'))
    with pytest.raises(TrainingError, match="was changed after it was written"):
        train(replace(config, steps=4, resume=True), comm, TEXT)


def test_resume_falls_back_past_a_corrupt_newest_checkpoint(comm, shared_dir):
    config = replace(TINY, strategy="zero3", steps=4, checkpoint_dir=shared_dir, checkpoint_every=2)
    train(config, comm, TEXT)
    shard = os.path.join(shared_dir, "step-00000004", "shard-00000.npy")
    _edit(comm, shard, lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]))
    lines: list[str] = []
    resumed = train(replace(config, steps=6, resume=True), comm, TEXT, log=lines.append)
    assert resumed.start_step == 2
    warning = next(line for line in lines if line.startswith("warning:"))
    assert "step-00000004" in warning and "corrupt" in warning, lines
    assert resumed.losses == train(replace(TINY, strategy="zero3", steps=6), comm, TEXT).losses


def _drop_manifests(comm, directory: str, *steps: int) -> None:
    """Rank 0 deletes the manifest of these checkpoints (their shards stay); every rank sees it on return."""
    if comm.rank == 0:
        for step in steps:
            os.remove(os.path.join(checkpoint_module.checkpoint_path(directory, step), "manifest.json"))
    comm.barrier()


def _listing(directory: str) -> dict[str, list[str]]:
    return {name: sorted(os.listdir(os.path.join(directory, name))) for name in sorted(os.listdir(directory))}


def test_step_directories_without_a_manifest_stop_every_rank(comm, shared_dir):
    """Shards without a manifest are not an empty directory: resuming refuses to start from step 0."""
    config = replace(TINY, strategy="zero3", steps=4, checkpoint_dir=shared_dir, checkpoint_every=2)
    train(config, comm, TEXT)
    _drop_manifests(comm, shared_dir, 2, 4)
    before = _listing(shared_dir)
    lines: list[str] = []
    with pytest.raises(TrainingError) as raised:  # on every rank: a rank that went on would fail or hang the test
        train(replace(config, steps=6, resume=True), comm, TEXT, log=lines.append)
    message = str(raised.value)
    assert message.startswith(f"{shared_dir!r} holds step directories but no checkpoint to resume from: "), message
    for step in ("step-00000004", "step-00000002"):  # each named, with what is missing and what is there
        assert f"{step}: no manifest.json (incomplete or damaged; it holds shard-00000.npy, " in message, message
    assert "restore it, or pass --fresh to start from step 0 anyway" in message, message
    assert not any("starting from step 0" in line for line in lines), lines
    comm.barrier()
    assert _listing(shared_dir) == before  # nothing trained, nothing saved, nothing removed


def test_fresh_starts_from_step_0_when_no_step_directory_loads(comm, shared_dir):
    config = replace(TINY, strategy="zero1", steps=4, checkpoint_dir=shared_dir, checkpoint_every=2)
    train(config, comm, TEXT)
    _drop_manifests(comm, shared_dir, 2, 4)
    lines: list[str] = []
    fresh = train(replace(config, steps=3, resume=True, fresh=True, checkpoint_every=0), comm, TEXT,
                  log=lines.append)
    assert fresh.start_step == 0
    assert fresh.losses == train(replace(TINY, strategy="zero1", steps=3), comm, TEXT).losses
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert [line.split(":")[1].strip() for line in warnings] == ["step-00000004", "step-00000002"], lines
    assert f"no checkpoint in {shared_dir} loads: starting from step 0 (--fresh)" in lines
    # Its own checkpoint is the one a later resume takes, past the damaged step 4 (named again).
    lines.clear()
    again = train(replace(config, steps=5, resume=True, fresh=True), comm, TEXT, log=lines.append)
    assert again.start_step == 3
    assert any(line.startswith("warning: step-00000004: no manifest.json") and
               line.endswith("; resuming from step-00000003") for line in lines), lines


def test_resume_warns_when_it_skips_a_step_directory_without_a_manifest(comm, shared_dir):
    config = replace(TINY, strategy="ddp", steps=4, checkpoint_dir=shared_dir, checkpoint_every=2)
    train(config, comm, TEXT)
    _drop_manifests(comm, shared_dir, 4)
    lines: list[str] = []
    resumed = train(replace(config, steps=6, resume=True), comm, TEXT, log=lines.append)
    assert resumed.start_step == 2
    warning = next((line for line in lines if line.startswith("warning: ")), None)
    assert warning is not None and warning.startswith(
        "warning: step-00000004: no manifest.json (incomplete or damaged; it holds shard-00000.npy, "), lines
    assert warning.endswith("); resuming from step-00000002"), warning
    assert lines.index(warning) < next(k for k, line in enumerate(lines) if line.startswith("resumed from "))
    assert resumed.losses == train(replace(TINY, strategy="ddp", steps=6), comm, TEXT).losses
    comm.barrier()
    # The resumed run saved step 4 again: a whole checkpoint replaced the damaged directory.
    assert [os.path.basename(path) for path in checkpoint_module.complete(shared_dir)] == [
        "step-00000006", "step-00000004", "step-00000002"]


def test_ranks_that_see_different_step_directories_all_stop(comm, shared_dir):
    """The last rank alone sees step directories without a manifest (a checkpoint directory that is
    not shared): no rank starts from step 0 while it stops, none waits for it."""
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    config = replace(TINY, strategy="zero2", steps=2, checkpoint_dir=os.path.join(shared_dir, "saved"))
    train(config, comm, TEXT)
    _drop_manifests(comm, config.checkpoint_dir, 2)
    empty = os.path.join(shared_dir, "empty")
    mine = config.checkpoint_dir if comm.rank == comm.size - 1 else empty
    with pytest.raises(TrainingError, match="ranks see different checkpoints in"):
        train(replace(config, steps=4, checkpoint_dir=mine, resume=True), comm, TEXT)


def test_keep_prunes_all_but_the_newest_checkpoints(comm, shared_dir):
    config = replace(TINY, strategy="ddp", steps=5, checkpoint_dir=shared_dir, checkpoint_every=1, keep=2)
    train(config, comm, TEXT)
    comm.barrier()
    names = [os.path.basename(path) for path in checkpoint_module.complete(shared_dir)]
    assert names == ["step-00000005", "step-00000004"]
    assert sorted(os.listdir(shared_dir)) == ["step-00000004", "step-00000005"]  # nothing else left behind
