"""A small GPT (decoder-only transformer) on characters, forward and backward written by hand.

    ids (b, t) ─► Embedding: token + position ─► x (b, t, d)
               ─► Block × L:  x += W_out · attention(LN1(x) W_query, LN1(x) W_key, LN1(x) W_value)
                              x += W_proj · gelu(LN2(x) W_fc)
               ─► Head: LN_f(x) W_vocab ─► logits (b*t, V): every position predicts its next character

The attention is causal and multi-head: `heads` heads of width d/heads, softmax(q kᵀ/√(d/heads))
with the positions after each query masked out. The output matrix W_vocab is *untied* from the
token embedding, so each of the L+2 layers owns its parameters outright: the strategies cut the
flat vector at layer boundaries (ZeRO-3 gathers one block at a time), and a tied matrix would be
needed by two layers far apart.

A layer's flat vector holds its tensors one after another (`Tensors`). Like the MLP's layers
(model.py) these keep no reference to their parameters after a call, return per-example
gradient *sums*, write every value of `grad` (it may be an uninitialized buffer), and compute
with the array module `xp` (NumPy, or CuPy on a GPU) only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy

_LN_EPS = 1e-5
_GELU_C = math.sqrt(2.0 / math.pi)
# Unit-variance embeddings: the first layer norm sees inputs of its own scale, and plain SGD
# moves them at a useful rate (GPT-2's 0.02 suits Adam).
EMBED_STD = 1.0


class Tensors:
    """Named tensors packed one after another in a flat vector."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.shapes = shapes
        self.spans: dict[str, tuple[int, int]] = {}
        at = 0
        for name, shape in shapes.items():
            size = math.prod(shape)
            self.spans[name] = (at, at + size)
            at += size
        self.size = at

    def views(self, flat: Any) -> dict[str, Any]:
        """Each tensor as a view of `flat` in its shape (writing a view writes `flat`)."""
        return {name: flat[lo:hi].reshape(self.shapes[name]) for name, (lo, hi) in self.spans.items()}


def _init(tensors: Tensors, rng: numpy.random.Generator, scales: dict[str, float]) -> numpy.ndarray:
    """Normal(0, scale) for the named matrices, 1 for layer-norm gains, 0 for everything else."""
    flat = numpy.zeros(tensors.size)
    for name, (lo, hi) in tensors.spans.items():
        if name in scales:
            flat[lo:hi] = rng.normal(0.0, scales[name], hi - lo)
        elif name.endswith("gain"):
            flat[lo:hi] = 1.0
    return flat


def _rows(a: Any) -> Any:
    """(..., n) as a matrix of rows (n columns)."""
    return a.reshape(-1, a.shape[-1])


def _linear_backward(xp: Any, x: Any, dy: Any, weight_grad: Any, bias_grad: Any | None) -> None:
    """The weight (and bias) gradient sums of y = x W + b, written in place."""
    xp.matmul(_rows(x).T, _rows(dy), out=weight_grad)
    if bias_grad is not None:
        xp.sum(_rows(dy), axis=0, out=bias_grad)


def _layer_norm(xp: Any, x: Any, gain: Any, bias: Any) -> tuple[Any, Any]:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    rstd = 1.0 / xp.sqrt((centered * centered).mean(axis=-1, keepdims=True) + _LN_EPS)
    xhat = centered * rstd
    return xhat * gain + bias, (xhat, rstd)


def _layer_norm_backward(xp: Any, cache: Any, gain: Any, dy: Any, gain_grad: Any, bias_grad: Any) -> Any:
    xhat, rstd = cache
    xp.sum(_rows(dy * xhat), axis=0, out=gain_grad)
    xp.sum(_rows(dy), axis=0, out=bias_grad)
    dxhat = dy * gain
    return rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                   - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


@dataclass(frozen=True)
class GPTConfig:
    """Shapes: vocabulary, context (positions), embedding width d, attention heads, MLP width
    (4d in GPT-2), blocks."""

    vocab_size: int
    context: int = 32
    embed: int = 48
    heads: int = 4
    hidden: int = 192
    layers: int = 2
    kind: str = "gpt"

    # Every position of a sequence predicts the character after it.
    @property
    def predictions_per_example(self) -> int:
        return self.context

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def build_layers(self) -> list[Any]:
        blocks = [Block(self.embed, self.heads, self.hidden, self.layers, i) for i in range(self.layers)]
        return [Embedding(self.vocab_size, self.context, self.embed), *blocks, Head(self.embed, self.vocab_size)]


class Embedding:
    """Token table (V, d) plus position table (T, d)."""

    def __init__(self, vocab: int, context: int, dim: int) -> None:
        self.tensors = Tensors({"token": (vocab, dim), "position": (context, dim)})
        self.size = self.tensors.size
        self.name = f"embedding {vocab}x{dim} + {context}x{dim}"

    def init(self, rng: numpy.random.Generator) -> numpy.ndarray:
        return _init(self.tensors, rng, {"token": EMBED_STD, "position": EMBED_STD})

    def forward(self, xp: Any, flat: Any, ids: Any) -> tuple[Any, Any]:
        p = self.tensors.views(flat)
        return p["token"][ids] + p["position"][: ids.shape[1]], ids

    def backward(self, xp: Any, flat: Any, ids: Any, dout: Any, grad: Any) -> None:
        g = self.tensors.views(grad)
        vocab, dim = self.tensors.shapes["token"]
        # A one-hot product rather than a scatter-add: deterministic, and the same on CPU and GPU.
        onehot = (ids.reshape(-1, 1) == xp.arange(vocab).reshape(1, -1)).astype(dout.dtype)
        xp.matmul(onehot.T, _rows(dout), out=g["token"])
        t = ids.shape[1]
        xp.sum(dout, axis=0, out=g["position"][:t])
        g["position"][t:] = 0
        return None


class Block:
    """Pre-norm transformer block: causal multi-head self-attention, then a GELU MLP, each
    added to the residual stream."""

    def __init__(self, dim: int, heads: int, hidden: int, depth: int, index: int) -> None:
        self.dim, self.heads, self.hidden, self.depth = dim, heads, hidden, depth
        self.tensors = Tensors({
            "ln1.gain": (dim,), "ln1.bias": (dim,),
            "W_query": (dim, dim), "b_query": (dim,), "W_key": (dim, dim), "b_key": (dim,),
            "W_value": (dim, dim), "b_value": (dim,), "W_out": (dim, dim), "b_out": (dim,),
            "ln2.gain": (dim,), "ln2.bias": (dim,),
            "W_fc": (dim, hidden), "b_fc": (hidden,), "W_proj": (hidden, dim), "b_proj": (dim,),
        })
        self.size = self.tensors.size
        self.name = f"block {index} ({heads} heads, d {dim}, mlp {hidden})"

    def init(self, rng: numpy.random.Generator) -> numpy.ndarray:
        # Variance 1/fan_in (plain SGD needs weights of that size to move at all; GPT-2's 0.02
        # suits Adam), the two projections into the residual stream scaled down by sqrt(2L) so
        # the stream's variance does not grow with depth.
        d, h = 1 / math.sqrt(self.dim), 1 / math.sqrt(self.hidden)
        depth = 1 / math.sqrt(2 * self.depth)
        return _init(self.tensors, rng, {"W_query": d, "W_key": d, "W_value": d, "W_fc": d,
                                         "W_out": d * depth, "W_proj": h * depth})

    def _heads(self, a: Any) -> Any:
        """(b, t, d) -> (b, heads, t, d/heads)."""
        b, t, _ = a.shape
        return a.reshape(b, t, self.heads, self.dim // self.heads).transpose(0, 2, 1, 3)

    def _merge(self, a: Any) -> Any:
        """(b, heads, t, d/heads) -> (b, t, d), contiguous."""
        b, _, t, _ = a.shape
        return a.transpose(0, 2, 1, 3).reshape(b, t, self.dim)

    def forward(self, xp: Any, flat: Any, x: Any) -> tuple[Any, Any]:
        p = self.tensors.views(flat)
        h1, ln1 = _layer_norm(xp, x, p["ln1.gain"], p["ln1.bias"])
        q, k, v = (self._heads(h1 @ p[f"W_{n}"] + p[f"b_{n}"]) for n in ("query", "key", "value"))
        t = x.shape[1]
        scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(self.dim // self.heads))
        scores[..., xp.triu(xp.ones((t, t), dtype=bool), 1)] = -xp.inf  # no looking ahead
        scores -= scores.max(axis=-1, keepdims=True)
        probs = xp.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        y = self._merge(probs @ v)
        x2 = x + (y @ p["W_out"] + p["b_out"])
        h2, ln2 = _layer_norm(xp, x2, p["ln2.gain"], p["ln2.bias"])
        f = h2 @ p["W_fc"] + p["b_fc"]
        tanh = xp.tanh(_GELU_C * (f + 0.044715 * f * f * f))
        g = 0.5 * f * (1.0 + tanh)
        out = x2 + (g @ p["W_proj"] + p["b_proj"])
        return out, (ln1, h1, q, k, v, probs, y, ln2, h2, f, tanh, g)

    def backward(self, xp: Any, flat: Any, cache: Any, dout: Any, grad: Any) -> Any:
        ln1, h1, q, k, v, probs, y, ln2, h2, f, tanh, g = cache
        p, d = self.tensors.views(flat), self.tensors.views(grad)
        # MLP branch: out = x2 + gelu(h2 W_fc + b_fc) W_proj + b_proj
        _linear_backward(xp, g, dout, d["W_proj"], d["b_proj"])
        dg = dout @ p["W_proj"].T
        df = dg * (0.5 * (1.0 + tanh) + 0.5 * f * (1.0 - tanh * tanh) * _GELU_C * (1.0 + 3 * 0.044715 * f * f))
        _linear_backward(xp, h2, df, d["W_fc"], d["b_fc"])
        dx2 = dout + _layer_norm_backward(xp, ln2, p["ln2.gain"], df @ p["W_fc"].T, d["ln2.gain"], d["ln2.bias"])
        # Attention branch: x2 = x + merge(softmax(q kᵀ/√dh) v) W_out + b_out
        _linear_backward(xp, y, dx2, d["W_out"], d["b_out"])
        dy = self._heads(dx2 @ p["W_out"].T)
        dprobs = dy @ v.transpose(0, 1, 3, 2)
        dv = probs.transpose(0, 1, 3, 2) @ dy
        # softmax backward; masked entries have probability 0, so their gradient is 0 too
        dscores = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))
        dscores *= 1.0 / math.sqrt(self.dim // self.heads)
        dq = dscores @ k
        dk = dscores.transpose(0, 1, 3, 2) @ q
        dh1 = 0
        for name, dpart in (("query", dq), ("key", dk), ("value", dv)):
            merged = self._merge(dpart)
            _linear_backward(xp, h1, merged, d[f"W_{name}"], d[f"b_{name}"])
            dh1 = dh1 + merged @ p[f"W_{name}"].T
        return dx2 + _layer_norm_backward(xp, ln1, p["ln1.gain"], dh1, d["ln1.gain"], d["ln1.bias"])


class Head:
    """Final layer norm and the (untied) output matrix: logits for every position."""

    def __init__(self, dim: int, vocab: int) -> None:
        self.tensors = Tensors({"lnf.gain": (dim,), "lnf.bias": (dim,), "W_vocab": (dim, vocab)})
        self.size = self.tensors.size
        self.name = f"head {dim}x{vocab}"

    def init(self, rng: numpy.random.Generator) -> numpy.ndarray:
        # Small: the first predictions are near uniform (loss ~ ln V).
        return _init(self.tensors, rng, {"W_vocab": 0.1 / math.sqrt(self.tensors.shapes["W_vocab"][0])})

    def forward(self, xp: Any, flat: Any, x: Any) -> tuple[Any, Any]:
        p = self.tensors.views(flat)
        h, ln = _layer_norm(xp, x, p["lnf.gain"], p["lnf.bias"])
        return _rows(h) @ p["W_vocab"], (ln, h)

    def backward(self, xp: Any, flat: Any, cache: Any, dout: Any, grad: Any) -> Any:
        ln, h = cache
        p, d = self.tensors.views(flat), self.tensors.views(grad)
        _linear_backward(xp, h, dout, d["W_vocab"], None)
        dh = (dout @ p["W_vocab"].T).reshape(h.shape)
        return _layer_norm_backward(xp, ln, p["lnf.gain"], dh, d["lnf.gain"], d["lnf.bias"])
