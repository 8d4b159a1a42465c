"""The training run: settings, building the strategy, the step loop, checkpoints, a sample.

`train` is what examples/train.py calls, and what the tests call in-process. It is collective:
every rank of `comm` calls it with the same settings.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy

from mpiring.errors import CommunicatorRevokedError, RankLostError
from mpiring.training import checkpoint
from mpiring.training.arrays import array_module
from mpiring.training.data import CharData
from mpiring.training.ddp import DDP
from mpiring.training.errors import TrainingError, agree
from mpiring.training.gpt import GPTConfig
from mpiring.training.model import PRESETS, Model, ModelConfig, generate
from mpiring.training.optimizer import SGD
from mpiring.training.strategy import DEFAULT_BUCKET_BYTES, Strategy
from mpiring.training.zero1 import Zero1
from mpiring.training.zero2 import Zero2
from mpiring.training.zero3 import Zero3

STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (DDP, Zero1, Zero2, Zero3)}
MODELS = {"mlp": ModelConfig, "gpt": GPTConfig}
# Learning rates that train each preset steadily at the default batch (wider layers need less).
PRESET_LR = {"mlp": {"small": 0.3, "medium": 0.3, "large": 0.05},
             "gpt": {"small": 1.5, "medium": 0.2, "large": 0.1}}
# Global batch (examples) by model: an MLP example predicts one character, a GPT example (a
# sequence of `context` characters) predicts one per position.
DEFAULT_BATCH = {"mlp": 1024, "gpt": 128}
DEFAULT_STEPS = {"mlp": 200, "gpt": 400}
# (warm-up steps, cosine decay steps): the MLP trains at a constant rate unless asked.
DEFAULT_SCHEDULE = {"mlp": (0, 0), "gpt": (50, 400)}


@dataclass
class TrainConfig:
    """Everything that decides a run. `batch_size` is the global batch, split among the ranks."""

    strategy: str = "zero3"
    model: str = "gpt"
    steps: int | None = None  # None: the model's DEFAULT_STEPS (set in __post_init__)
    seed: int = 0
    batch_size: int | None = None  # examples; None: the model's DEFAULT_BATCH
    dtype: str = "float32"
    device: str = "cpu"
    preset: str = "small"
    context: int | None = None  # these override the preset's shape
    embed: int | None = None
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None  # gpt only
    lr: float | None = None  # None: the preset's (PRESET_LR)
    momentum: float = 0.9
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    overlap: bool = False
    algorithm: str | None = None  # for every collective; None: mpiring's automatic choice
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep: int = 0  # checkpoints kept after each save, newest first; 0 keeps all
    resume: bool = False
    fresh: bool = False  # with resume: start from step 0 when no checkpoint loads, instead of stopping
    log_every: int = 1
    sample_chars: int = 200
    warmup: int | None = None  # learning-rate schedule (see schedule); None: the model's
    decay_steps: int | None = None
    # a lost rank: the survivors shrink, reload the newest checkpoint (step 0 without one) and go
    # on (the communicator must survive lost ranks: Communicator(survive=True); docs/lost-rank.md)
    elastic: bool = False

    def __post_init__(self) -> None:
        if self.steps is None:
            self.steps = DEFAULT_STEPS.get(self.model, 0)

    def model_config(self, vocab_size: int) -> ModelConfig | GPTConfig:
        shape = dict(PRESETS[self.model][self.preset])
        for key in shape:
            if getattr(self, key) is not None:
                shape[key] = getattr(self, key)
        if self.model == "gpt" and self.heads is None and shape["embed"] % shape["heads"]:
            # --embed alone: the most heads, up to the preset's, that divide the width evenly
            shape["heads"] = max(h for h in range(1, shape["heads"] + 1) if shape["embed"] % h == 0)
        return MODELS[self.model](vocab_size=vocab_size, **shape)

    @property
    def learning_rate(self) -> float:
        return PRESET_LR[self.model][self.preset] if self.lr is None else self.lr

    def schedule(self, step: int) -> float:
        """The learning rate's factor at `step`: a linear warm-up over `warmup` steps (SGD on a
        transformer diverges without one), then a cosine from 1 down to 0.1 at step `decay_steps`
        (none if that is not past the warm-up), 0.1 after it (nanoGPT's shape). It depends on the
        step and these settings only, not on --steps: a run resumed with more steps follows it exactly."""
        warmup, decay = self.lr_schedule
        if step < warmup:
            return (step + 1) / warmup
        if decay <= warmup:
            return 1.0
        progress = min((step - warmup) / (decay - warmup), 1.0)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    @property
    def lr_schedule(self) -> tuple[int, int]:
        """(warm-up steps, decay steps), the model's defaults where not given."""
        warmup, decay = DEFAULT_SCHEDULE[self.model]
        return (warmup if self.warmup is None else self.warmup,
                decay if self.decay_steps is None else self.decay_steps)

    @property
    def examples(self) -> int:
        """The global batch in examples."""
        return DEFAULT_BATCH.get(self.model, 1) if self.batch_size is None else self.batch_size

    def check(self) -> None:
        """Raise TrainingError for settings no run could use (the command line checks first)."""
        if self.model not in MODELS:
            raise TrainingError(f"unknown model {self.model!r} (expected one of {', '.join(MODELS)})")
        if self.strategy not in STRATEGIES:
            raise TrainingError(f"unknown strategy {self.strategy!r} (expected one of {', '.join(STRATEGIES)})")
        if self.preset not in PRESETS[self.model]:
            raise TrainingError(f"unknown preset {self.preset!r} (expected one of {', '.join(PRESETS[self.model])})")
        if self.model == "mlp" and self.heads is not None:
            raise TrainingError("heads applies to the gpt model only")
        if self.model == "gpt":
            shape = self.model_config(1)
            if shape.embed % shape.heads:
                raise TrainingError(f"the embedding width {shape.embed} must be a multiple of the {shape.heads} heads")
        if self.dtype not in ("float32", "float64"):
            raise TrainingError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if self.steps < 0 or self.examples < 1 or self.checkpoint_every < 0 or self.keep < 0:
            raise TrainingError("steps, checkpoint_every and keep must be >= 0, batch_size >= 1")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise TrainingError("checkpoint_every and resume need a checkpoint directory")
        if self.fresh and not self.resume:
            raise TrainingError("fresh applies with resume only (a run without resume starts from step 0)")
        if self.elastic and not self.checkpoint_dir:
            raise TrainingError("elastic needs a checkpoint directory (the survivors go on from its newest checkpoint)")


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
    hidden_seconds: float = 0.0  # collectives in flight while computing (with overlap)
    predictions: int = 0  # characters predicted per global batch (tokens per step)
    bytes_sent: int = 0  # by this rank, in steps run by this call
    memory: dict[str, int] = field(default_factory=dict)
    sample: str | None = None  # generated text, on rank 0
    recoveries: list[dict[str, Any]] = field(default_factory=list)  # elastic: each loss and where it went on

    @property
    def steps_run(self) -> int:
        return len(self.losses) - self.start_step


def run_meta(config: TrainConfig, model: Model, data: CharData) -> dict[str, Any]:
    """What a checkpoint must agree on to continue this run exactly (strategy and world size
    may differ)."""
    return {"model": model.config.as_dict(), "dtype": config.dtype, "seed": config.seed,
            "batch_size": config.examples, "lr": config.learning_rate, "lr_schedule": list(config.lr_schedule),
            "momentum": config.momentum,
            "data": data.fingerprint}


def build(config: TrainConfig, comm: Any, data: CharData) -> Strategy:
    """The model and the strategy for `config`, parameters initialized from the seed."""
    model = Model(config.model_config(len(data.vocab)), array_module(config.device), config.dtype)
    optimizer = SGD(lr=config.learning_rate, momentum=config.momentum)
    return STRATEGIES[config.strategy](model, comm, optimizer, seed=config.seed,
                                       bucket_bytes=config.bucket_bytes, overlap=config.overlap,
                                       algorithm=config.algorithm)


def _agreed_step_directories(comm: Any, directory: str) -> list[checkpoint.StepDirectory]:
    """Collective: the step directories in `directory`, which every rank must see alike (each
    one's step, and whether it has its manifest); raises on every rank if they do not, so the
    ranks take the same decisions from here on."""
    found = checkpoint.step_directories(directory)
    seen = numpy.array([[entry.step, entry.complete] for entry in found] or [[-1, 0]], dtype=numpy.int64).ravel()
    count = comm.broadcast(numpy.array([seen.size]), root=0)
    first = comm.broadcast(seen.copy() if seen.size == count[0] else numpy.zeros(count[0], numpy.int64), root=0)
    agree(comm, None if numpy.array_equal(first, seen) else
          f"ranks see different checkpoints in {directory!r}: is it on a shared file system?",
          checkpoint.CheckpointError)
    return found


def _resume(config: TrainConfig, strategy: Strategy, meta: dict[str, Any], log: Callable[[str], None]
            ) -> tuple[int, list[float]]:
    """Load the newest checkpoint in config.checkpoint_dir that loads: (first step to run, losses).

    Newer step directories that do not load (no manifest.json, a corrupt shard, an edited
    manifest, another run's) are skipped, each with a warning naming it, why, and the checkpoint
    resumed from instead. If none loads, every rank raises (never a silent fresh start) unless
    config.fresh asks to start from step 0; only a directory with no step directory at all
    starts from step 0 by itself (a first run).
    """
    directory = config.checkpoint_dir
    found = _agreed_step_directories(strategy.comm, directory)
    if not found:
        unfinished = checkpoint.unfinished(directory)
        what = "a save that never finished" if len(unfinished) == 1 else "saves that never finished"
        note = f" ({', '.join(unfinished)}: {what}, never read)" if unfinished else ""
        log(f"no checkpoint in {directory}{note}: starting from step 0")
        return 0, []
    skipped: list[tuple[str, str]] = []  # (name, why), newest first
    errors: list[checkpoint.CheckpointError] = []
    for entry in found:  # every rank takes the same turns: the listing is agreed, load() agrees on failure
        name = os.path.basename(entry.path)
        if not entry.complete:
            skipped.append((name, checkpoint.missing_manifest(entry.path)))
            continue
        try:
            manifest = checkpoint.load(entry.path, strategy, meta)
        except checkpoint.CheckpointError as error:
            errors.append(error)
            skipped.append((name, str(error)))
            continue
        for other, why in skipped:
            log(f"warning: {other}: {why}; resuming from {name}")
        log(f"resumed from {entry.path} (step {manifest['step']}, saved by {manifest['strategy']} on "
            f"{manifest['world_size']} ranks)")
        return int(manifest["step"]), [float(x) for x in manifest["losses"]]
    hint = "pass --fresh to start from step 0 anyway (nothing in the directory is removed)"
    if config.fresh or errors:  # (without them, the error below names every directory itself)
        for other, why in skipped:
            log(f"warning: {other}: {why}")
    if config.fresh:
        log(f"no checkpoint in {directory} loads: starting from step 0 (--fresh)")
        return 0, []
    if errors:  # the newest complete checkpoint's own error says most
        raise checkpoint.CheckpointError(f"{errors[0]}; no checkpoint in {directory!r} loads: {hint}") from errors[0]
    listing = "; ".join(f"{other}: {why}" for other, why in skipped)
    raise checkpoint.CheckpointError(
        f"{directory!r} holds step directories but no checkpoint to resume from: {listing}. A save writes "
        f"{checkpoint.MANIFEST} before the directory gets its step name, so it was lost afterwards (deleted, or "
        f"not copied): restore it, or {hint}")


def train(config: TrainConfig, comm: Any, text: str, log: Callable[[str], None] | None = None,
          progress: Callable[[int, int, float], None] | None = None,
          shrunk: Callable[[Any], None] | None = None) -> TrainResult:
    """Collective: run `config` on the ranks of `comm` (an mpiring.Communicator) over `text`.

    `log` receives progress lines (pass print on rank 0 only); `progress(step, steps, loss)`, if
    given, is called after every step that logs no line (a terminal's progress bar). Settings or
    data that cannot be used raise TrainingError on every rank, before any step.

    With `config.elastic` (and a communicator that survives lost ranks), a rank lost during the
    run does not end it: the survivors shrink `comm`, call `shrunk(new communicator)`, reload the
    newest checkpoint on the fewer ranks (resharding its state as a resume does) and go on; a
    second loss the same way. The result's `strategy.comm` is the communicator the run ended on.
    """
    log = log or (lambda line: None)
    problem: Exception | None = None
    try:
        config.check()
        shape = config.model_config(1)
        data = CharData(text, shape.context)
        data.check_batch_size(config.examples)
        array_module(config.device)
    except TrainingError as error:
        problem = error
    agree(comm, problem)
    strategy = build(config, comm, data)
    model = strategy.model
    examples = config.examples
    per_example = model.config.predictions_per_example
    log(f"{config.model} trained with {config.strategy} on {comm.size} rank{'s' * (comm.size > 1)}: "
        f"{model.param_count:,} parameters ({', '.join(layer.name for layer in model.layers)}), "
        f"{len(data.vocab)} characters in the vocabulary, {len(data.tokens):,} in the text; global batch "
        f"{examples} x {per_example} = {examples * per_example} tokens (~{examples / comm.size:.1f} examples "
        f"per rank), {config.dtype} on {config.device}")
    meta = run_meta(config, model, data)
    start, losses = 0, []
    if config.resume:
        start, losses = _resume(config, strategy, meta, log)
        if start >= config.steps:  # every rank read the same manifest: every rank stops here
            raise TrainingError(f"the checkpoint is at step {start}: --steps {config.steps} leaves nothing to run "
                                f"(ask for more than {start} steps to continue training)")
    predictions = examples * per_example
    result = TrainResult(config, strategy, data, losses, start, predictions=predictions)
    while True:
        try:
            _steps(config, result, log, progress, meta)
            break
        except (RankLostError, CommunicatorRevokedError) as error:
            if not config.elastic:
                raise
            current = [result.strategy.comm]  # a loss during the recovery itself starts it over, shrinking again
            while True:
                try:
                    _recover(config, result, current, error, meta, log)
                    break
                except (RankLostError, CommunicatorRevokedError) as again:
                    error = again
            if shrunk is not None:
                shrunk(current[0])
    strategy, comm, losses, start = result.strategy, result.strategy.comm, result.losses, result.start_step
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


def _recover(config: TrainConfig, result: TrainResult, current: list[Any], error: Exception, meta: dict[str, Any],
             log: Callable[[str], None]) -> None:
    """Elastic: the survivors of a lost rank shrink the communicator (`current[0]`, replaced by
    the new one), build the strategy again on the fewer ranks and reload the newest checkpoint
    that loads (step 0 if none): the run goes on as a run resumed from it on N-1 ranks would."""
    old = current[0]
    comm = current[0] = old.shrink()
    lost = getattr(error, "lost", [])
    old.free()
    strategy = build(config, comm, result.data)
    resumed = TrainConfig(**{**config.__dict__, "resume": True, "fresh": True})
    start, losses = _resume(resumed, strategy, meta, log)
    log(f"rank{'s' * (len(lost) > 1)} {', '.join(map(str, lost)) or '(revoked)'} lost: went on with "
        f"{comm.size} ranks from step {start}")
    result.recoveries.append({"lost": lost, "ranks": comm.size, "step": start})
    result.strategy, result.losses, result.start_step = strategy, losses, start


def _steps(config: TrainConfig, result: TrainResult, log: Callable[[str], None],
           progress: Callable[[int, int, float], None] | None, meta: dict[str, Any]) -> None:
    """The step loop, from where the losses end to config.steps."""
    strategy, data, losses = result.strategy, result.data, result.losses
    comm, xp = strategy.comm, strategy.xp
    examples, predictions = config.examples, result.predictions
    per_example = strategy.model.config.predictions_per_example
    strategy.memory.reset_peak()
    for step in range(len(losses), config.steps):
        inputs, targets = data.batch(step, examples, config.seed, comm.rank, comm.size, xp,
                                     every_position=per_example > 1)
        sent, began = comm.traffic.bytes_sent, time.perf_counter()
        waited, hidden = strategy.comm_seconds, strategy.hidden_seconds
        loss = strategy.step(inputs, targets, predictions, config.schedule(step))
        seconds = time.perf_counter() - began
        waited, hidden = strategy.comm_seconds - waited, strategy.hidden_seconds - hidden
        result.step_seconds += seconds
        result.comm_seconds += waited
        result.hidden_seconds += hidden
        result.bytes_sent += comm.traffic.bytes_sent - sent
        losses.append(loss)
        if not numpy.isfinite(loss):  # the same loss on every rank, so every rank stops here
            raise TrainingError(f"loss became {loss} at step {step + 1}: lower --lr")
        if config.log_every and ((step + 1) % config.log_every == 0 or step + 1 == config.steps):
            sent_mb = (comm.traffic.bytes_sent - sent) / 1e6
            log(f"step {step + 1:>5}/{config.steps}  loss {loss:.4f}  {predictions / seconds:>8,.0f} tokens/s  "
                f"step {seconds * 1e3:6.1f} ms = compute {(seconds - waited) * 1e3:6.1f} + comm waited "
                f"{waited * 1e3:5.1f} (hidden {hidden * 1e3:5.1f})  {sent_mb:.3f} MB sent/rank")
        elif progress is not None:
            progress(step + 1, config.steps, loss)
        if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
            log(f"checkpoint {checkpoint.save(config.checkpoint_dir, step + 1, strategy, meta, losses, config.keep)}")
