"""Data-parallel training of a small language model (a GPT, or an MLP) on mpiring's collectives:
DDP and ZeRO-1/2/3.

    from mpiring import Communicator
    from mpiring.training import TrainConfig, train, default_text

    result = train(TrainConfig(strategy="zero3", steps=100), Communicator(), default_text())

Modules: gpt (the transformer) and model (the MLP, and the flat layout every model shares),
forward and backward by hand; data (text to sharded batches),
optimizer (SGD), sharding (buckets and array_split shards), memory (measured bytes held),
strategy (the shared step) and one module per strategy (ddp, zero1, zero2, zero3), checkpoint
(sharded, atomic, reshardable), trainer (the run), report (summary and JSON), plotting.
See docs/training.md.
"""

from mpiring.training.data import CharData, default_text, read_text
from mpiring.training.errors import TrainingError
from mpiring.training.gpt import GPTConfig
from mpiring.training.model import PRESETS, Model, ModelConfig
from mpiring.training.trainer import STRATEGIES, TrainConfig, TrainResult, build, train

__all__ = [
    "PRESETS", "STRATEGIES", "CharData", "GPTConfig", "Model", "ModelConfig", "TrainConfig", "TrainResult",
    "TrainingError", "build", "default_text", "read_text", "train",
]
