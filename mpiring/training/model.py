"""The Bengio-style MLP language model, and what every model shares: the flat parameter vector
cut into layers, initialization, sampling. (gpt.py has the transformer.)

    context ids (b, k) ─► Embedding ─► (b, k*E) ─► Dense+tanh ─► ... ─► Dense ─► logits (b, V)

Each layer keeps its parameters in one flat vector (weights row-major, then bias), and the
model's flat vector is the layers' vectors one after another. The strategies shard, gather and
reduce those flat vectors and never look inside a layer; a layer never keeps a reference to its
parameters after a call, so a strategy can free gathered parameters as soon as it is done.

Backward returns *sums* of per-example gradients, not means: ranks add up their partial sums
and divide once by the global batch size, so the result does not depend on how the global
batch was split among ranks (even unevenly, or with empty parts).

All array code goes through `xp`, the array module (NumPy, or CuPy on a GPU).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy

# Model shapes by model and name. The default (gpt, small) trains on 8 ranks sharing 2 cores in
# under a minute; "large" is there to show what sharding saves.
PRESETS: dict[str, dict[str, dict[str, int]]] = {
    "mlp": {
        "small": {"context": 12, "embed": 24, "hidden": 128, "layers": 3},
        "medium": {"context": 16, "embed": 32, "hidden": 512, "layers": 4},
        "large": {"context": 32, "embed": 64, "hidden": 1024, "layers": 6},
    },
    "gpt": {
        "small": {"context": 32, "embed": 48, "heads": 4, "hidden": 192, "layers": 2},
        "medium": {"context": 64, "embed": 128, "heads": 4, "hidden": 512, "layers": 4},
        "large": {"context": 64, "embed": 256, "heads": 8, "hidden": 1024, "layers": 8},
    },
}


@dataclass(frozen=True)
class ModelConfig:
    """Shapes: vocabulary, context length, embedding width, hidden width, hidden layers."""

    vocab_size: int
    context: int = 12
    embed: int = 24
    hidden: int = 128
    layers: int = 3
    kind: str = "mlp"

    # One example (k characters of context) predicts one character.
    predictions_per_example: ClassVar[int] = 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def build_layers(self) -> list[Any]:
        layers: list[Any] = [Embedding(self.vocab_size, self.embed, self.context)]
        width = self.context * self.embed
        for _ in range(self.layers):
            layers.append(Dense(width, self.hidden, activation=True))
            width = self.hidden
        layers.append(Dense(width, self.vocab_size, activation=False))
        return layers


class Embedding:
    """A (vocab, dim) table; each of the k context characters looks up its row."""

    def __init__(self, vocab: int, dim: int, context: int) -> None:
        self.shape = (vocab, dim)
        self.context = context
        self.size = vocab * dim
        self.name = f"embedding {vocab}x{dim}"

    def init(self, rng: numpy.random.Generator) -> numpy.ndarray:
        return rng.normal(0.0, 1.0, self.size)

    def forward(self, xp: Any, flat: Any, ids: Any) -> tuple[Any, Any]:
        table = flat.reshape(self.shape)
        return table[ids].reshape(len(ids), self.context * self.shape[1]), ids

    def backward(self, xp: Any, flat: Any, ids: Any, dout: Any, grad: Any) -> None:
        # A one-hot matrix product instead of a scatter-add: the same code on CPU and GPU, and
        # deterministic (a GPU scatter-add with atomics is not).
        vocab, dim = self.shape
        onehot = (ids.reshape(-1, 1) == xp.arange(vocab).reshape(1, -1)).astype(dout.dtype)
        xp.matmul(onehot.T, dout.reshape(-1, dim), out=grad.reshape(self.shape))
        return None


class Dense:
    """x @ W + b, then tanh unless it is the output layer."""

    def __init__(self, n_in: int, n_out: int, activation: bool) -> None:
        self.n_in, self.n_out, self.activation = n_in, n_out, activation
        self.size = n_in * n_out + n_out
        self.name = f"dense {n_in}x{n_out}" + (" tanh" if activation else "")

    def _split(self, flat: Any) -> tuple[Any, Any]:
        cut = self.n_in * self.n_out
        return flat[:cut].reshape(self.n_in, self.n_out), flat[cut:]

    def init(self, rng: numpy.random.Generator) -> numpy.ndarray:
        # tanh layers: variance 1/n_in keeps activations in range; the output layer starts small
        # so the first predictions are near uniform (loss ~ ln V).
        scale = (1.0 if self.activation else 0.1) / math.sqrt(self.n_in)
        weights = rng.normal(0.0, scale, self.n_in * self.n_out)
        return numpy.concatenate([weights, numpy.zeros(self.n_out)])

    def forward(self, xp: Any, flat: Any, x: Any) -> tuple[Any, Any]:
        weights, bias = self._split(flat)
        z = x @ weights
        z += bias
        if self.activation:
            xp.tanh(z, out=z)
        return z, (x, z)

    def backward(self, xp: Any, flat: Any, cache: Any, dout: Any, grad: Any) -> Any:
        x, z = cache
        dz = dout * (1 - z * z) if self.activation else dout
        gw, gb = self._split(grad)
        xp.matmul(x.T, dz, out=gw)
        xp.sum(dz, axis=0, out=gb)
        return dz @ self._split(flat)[0].T


class Model:
    """The layers, where each sits in the flat parameter vector, and how to initialize them."""

    def __init__(self, config: Any, xp: Any = numpy, dtype: Any = numpy.float64) -> None:
        """`config` is a ModelConfig (the MLP) or a gpt.GPTConfig: anything with build_layers()."""
        self.config = config
        self.xp = xp
        self.dtype = numpy.dtype(dtype)
        self.layers: list[Any] = config.build_layers()
        self.offsets = [0]
        for layer in self.layers:
            self.offsets.append(self.offsets[-1] + layer.size)

    @property
    def param_count(self) -> int:
        return self.offsets[-1]

    @property
    def layer_bytes(self) -> list[int]:
        return [layer.size * self.dtype.itemsize for layer in self.layers]

    def span(self, i: int) -> tuple[int, int]:
        """Layer i's [lo, hi) in the flat parameter vector."""
        return self.offsets[i], self.offsets[i + 1]

    def initial(self, i: int, seed: int) -> Any:
        """Layer i's initial parameters: drawn on the host from (seed, i), so the same on any
        world size, device or strategy, and layer by layer (no rank ever builds the whole model)."""
        rng = numpy.random.default_rng([seed, 1, i])
        return self.xp.asarray(self.layers[i].init(rng).astype(self.dtype))

    def logits(self, params: Any, ids: Any) -> Any:
        """Forward pass with the full flat parameter vector (for sampling, not for training):
        (b, V) for the MLP, (b*t, V) for the GPT (every position's prediction)."""
        h = ids
        for i, layer in enumerate(self.layers):
            lo, hi = self.span(i)
            h, _ = layer.forward(self.xp, params[lo:hi], h)
        return h


def cross_entropy_sum(xp: Any, logits: Any, targets: Any) -> tuple[Any, Any]:
    """Summed (not averaged) softmax cross-entropy over the rows, and its gradient wrt logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    rows = xp.arange(len(targets))
    loss = (xp.log(total[:, 0]) - shifted[rows, targets]).sum()
    dlogits = exp / total
    dlogits[rows, targets] -= 1
    return loss, dlogits


def generate(model: Model, params: numpy.ndarray, prompt: list[int], length: int, seed: int,
             temperature: float = 0.8) -> list[int]:
    """Sample `length` characters after `prompt` (host arrays; the model's xp must be NumPy)."""
    rng = numpy.random.default_rng([seed, 3])
    ids = list(prompt)
    k = model.config.context
    for _ in range(length):
        context = numpy.asarray([ids[-k:]])
        logits = model.logits(params, context)[-1].astype(numpy.float64) / temperature
        p = numpy.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return ids[len(prompt):]
