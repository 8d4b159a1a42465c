"""The training run: settings, building the strategy, the step loop, checkpoints, a sample.

`train` is what examples/train.py calls, and what the tests call in-process. It is collective:
every rank of `comm` calls it with the same settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy

from mpiring.training import checkpoint
from mpiring.training.arrays import array_module
from mpiring.training.data import CharData
from mpiring.training.ddp import DDP
from mpiring.training.errors import TrainingError, agree
from mpiring.training.model import PRESETS, Model, ModelConfig, generate
from mpiring.training.optimizer import SGD
from mpiring.training.strategy import DEFAULT_BUCKET_BYTES, Strategy
from mpiring.training.zero1 import Zero1
from mpiring.training.zero2 import Zero2
from mpiring.training.zero3 import Zero3

STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (DDP, Zero1, Zero2, Zero3)}
# Learning rates that train each preset steadily at the default batch (wider layers need less).
PRESET_LR = {"small": 0.3, "medium": 0.3, "large": 0.05}


@dataclass
class TrainConfig:
    """Everything that decides a run. `batch_size` is the global batch, split among the ranks."""

    strategy: str = "zero3"
    steps: int = 200
    seed: int = 0
    batch_size: int = 1024
    dtype: str = "float32"
    device: str = "cpu"
    preset: str = "small"
    context: int | None = None  # these four override the preset's shape
    embed: int | None = None
    hidden: int | None = None
    layers: int | None = None
    lr: float | None = None  # None: the preset's (PRESET_LR)
    momentum: float = 0.9
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    overlap: bool = False
    algorithm: str | None = None  # for every collective; None: mpiring's automatic choice
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep: int = 0  # checkpoints kept after each save, newest first; 0 keeps all
    resume: bool = False
    log_every: int = 1
    sample_chars: int = 200

    def model_config(self, vocab_size: int) -> ModelConfig:
        shape = dict(PRESETS[self.preset])
        for key in shape:
            if getattr(self, key) is not None:
                shape[key] = getattr(self, key)
        return ModelConfig(vocab_size=vocab_size, **shape)

    @property
    def learning_rate(self) -> float:
        return PRESET_LR[self.preset] if self.lr is None else self.lr

    def check(self) -> None:
        """Raise TrainingError for settings no run could use (the command line checks first)."""
        if self.strategy not in STRATEGIES:
            raise TrainingError(f"unknown strategy {self.strategy!r} (expected one of {', '.join(STRATEGIES)})")
        if self.preset not in PRESETS:
            raise TrainingError(f"unknown preset {self.preset!r} (expected one of {', '.join(PRESETS)})")
        if self.dtype not in ("float32", "float64"):
            raise TrainingError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if self.steps < 0 or self.batch_size < 1 or self.checkpoint_every < 0 or self.keep < 0:
            raise TrainingError("steps, checkpoint_every and keep must be >= 0, batch_size >= 1")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise TrainingError("checkpoint_every and resume need a checkpoint directory")


@dataclass
class TrainResult:
    """What a run did, seen from one rank (report.summarize combines the ranks)."""

    config: TrainConfig
    strategy: Strategy
    data: CharData
    losses: list[float]  # every step since step 0, including those before a resume
    start_step: int
    step_seconds: float = 0.0  # wall time in steps run by this call
    comm_seconds: float = 0.0  # of which inside collectives (exposed communication)
    bytes_sent: int = 0  # by this rank, in steps run by this call
    memory: dict[str, int] = field(default_factory=dict)
    sample: str | None = None  # generated text, on rank 0

    @property
    def steps_run(self) -> int:
        return len(self.losses) - self.start_step


def run_meta(config: TrainConfig, model: Model, data: CharData) -> dict[str, Any]:
    """What a checkpoint must agree on to continue this run exactly (strategy and world size
    may differ)."""
    return {"model": model.config.as_dict(), "dtype": config.dtype, "seed": config.seed,
            "batch_size": config.batch_size, "lr": config.learning_rate, "momentum": config.momentum,
            "data": data.fingerprint}


def build(config: TrainConfig, comm: Any, data: CharData) -> Strategy:
    """The model and the strategy for `config`, parameters initialized from the seed."""
    model = Model(config.model_config(len(data.vocab)), array_module(config.device), config.dtype)
    optimizer = SGD(lr=config.learning_rate, momentum=config.momentum)
    return STRATEGIES[config.strategy](model, comm, optimizer, seed=config.seed,
                                       bucket_bytes=config.bucket_bytes, overlap=config.overlap,
                                       algorithm=config.algorithm)


def _resume(config: TrainConfig, strategy: Strategy, meta: dict[str, Any], log: Callable[[str], None]
            ) -> tuple[int, list[float]]:
    """Load the newest checkpoint in config.checkpoint_dir that loads: (first step to run, losses).

    A newer one that is corrupt or edited is skipped with a warning naming what is wrong; if
    none loads, every rank raises the newest one's error (never a silent fresh start).
    """
    comm = strategy.comm
    paths = checkpoint.complete(config.checkpoint_dir)
    seen = numpy.array([int(path.rsplit("-", 1)[1]) for path in paths] or [-1], dtype=numpy.int64)
    count = comm.broadcast(numpy.array([seen.size]), root=0)
    first = comm.broadcast(seen.copy() if seen.size == count[0] else numpy.zeros(count[0], numpy.int64), root=0)
    agree(comm, None if numpy.array_equal(first, seen) else
          f"ranks see different checkpoints in {config.checkpoint_dir!r}: is it on a shared file system?")
    if not paths:
        log(f"no checkpoint in {config.checkpoint_dir}: starting from step 0")
        return 0, []
    failures: list[checkpoint.CheckpointError] = []
    for path in paths:
        try:
            manifest = checkpoint.load(path, strategy, meta)
        except checkpoint.CheckpointError as error:  # every rank has the same error here
            failures.append(error)
            log(f"warning: {error}; trying the checkpoint before it")
            continue
        log(f"resumed from {path} (step {manifest['step']}, saved by {manifest['strategy']} on "
            f"{manifest['world_size']} ranks)")
        return int(manifest["step"]), [float(x) for x in manifest["losses"]]
    raise failures[0]


def train(config: TrainConfig, comm: Any, text: str, log: Callable[[str], None] | None = None) -> TrainResult:
    """Collective: run `config` on the ranks of `comm` (an mpiring.Communicator) over `text`.

    `log` receives progress lines (pass print on rank 0 only). Settings or data that cannot be
    used raise TrainingError on every rank, before any step.
    """
    log = log or (lambda line: None)
    problem: Exception | None = None
    try:
        config.check()
        shape = config.model_config(1)
        data = CharData(text, shape.context)
        data.check_batch_size(config.batch_size)
        array_module(config.device)
    except TrainingError as error:
        problem = error
    agree(comm, problem)
    strategy = build(config, comm, data)
    model = strategy.model
    log(f"{config.strategy} on {comm.size} rank{'s' * (comm.size > 1)}: {model.param_count:,} parameters "
        f"({', '.join(layer.name for layer in model.layers)}), {len(data.vocab)} characters in the "
        f"vocabulary, {len(data.tokens):,} in the text; global batch {config.batch_size} "
        f"(~{config.batch_size / comm.size:.0f} per rank), {config.dtype} on {config.device}")
    meta = run_meta(config, model, data)
    start, losses = 0, []
    if config.resume:
        start, losses = _resume(config, strategy, meta, log)
        if start >= config.steps:  # every rank read the same manifest: every rank stops here
            raise TrainingError(f"the checkpoint is at step {start}: --steps {config.steps} leaves nothing to run "
                                f"(ask for more than {start} steps to continue training)")
    result = TrainResult(config, strategy, data, losses, start)
    xp = strategy.xp
    strategy.memory.reset_peak()
    for step in range(start, config.steps):
        inputs, targets = data.batch(step, config.batch_size, config.seed, comm.rank, comm.size, xp)
        sent, comm_before, began = comm.traffic.bytes_sent, strategy.comm_seconds, time.perf_counter()
        loss = strategy.step(inputs, targets, config.batch_size)
        seconds = time.perf_counter() - began
        result.step_seconds += seconds
        result.comm_seconds += strategy.comm_seconds - comm_before
        result.bytes_sent += comm.traffic.bytes_sent - sent
        losses.append(loss)
        if not numpy.isfinite(loss):  # the same loss on every rank, so every rank stops here
            raise TrainingError(f"loss became {loss} at step {step + 1}: lower --lr")
        if config.log_every and ((step + 1) % config.log_every == 0 or step + 1 == config.steps):
            sent_mb = (comm.traffic.bytes_sent - sent) / 1e6
            log(f"step {step + 1:>5}/{config.steps}  loss {loss:.4f}  "
                f"{config.batch_size / seconds:>9,.0f} tokens/s  {sent_mb:.3f} MB sent/rank")
        if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
            log(f"checkpoint {checkpoint.save(config.checkpoint_dir, step + 1, strategy, meta, losses, config.keep)}")
    result.memory = strategy.memory.snapshot()
    saved_last = config.checkpoint_every and len(losses) % config.checkpoint_every == 0
    if config.checkpoint_dir and len(losses) > start and not saved_last:
        log(f"checkpoint {checkpoint.save(config.checkpoint_dir, len(losses), strategy, meta, losses, config.keep)}")
    if config.sample_chars:
        params = strategy.full_parameters(root=0)
        if comm.rank == 0:
            host = Model(strategy.model.config, numpy, strategy.dtype)
            prompt = data.tokens[: host.config.context].tolist()
            result.sample = data.decode(prompt + generate(host, params, prompt, config.sample_chars, config.seed))
    return result
