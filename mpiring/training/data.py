"""Text in, batches of (context, next character) out, sharded by rank.

Every rank reads the whole text (it is small, and every rank needs the vocabulary). An example
is a position e of the text: the k characters from e are the context, the one after is the
target (for the MLP); for the GPT every one of the k positions is a prediction, its target the
character after it. Each epoch visits the examples in a permutation drawn from (seed, epoch); step s takes
the next `batch_size` of them: that *global* batch depends only on the seed and the step, never
on the world size. Rank r then takes part r of it, cut as numpy.array_split cuts it.

Being a pure function of (seed, step), the data needs no state in a checkpoint: a resumed run
draws exactly the batches the uninterrupted run would have.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy

from mpiring.training.errors import TrainingError
from mpiring.training.sharding import split_bounds

DEFAULT_SOURCE = "pydoc_data.topics (Python's own help texts)"


def default_text() -> str:
    """The standard library's pydoc topics: ~465k characters of English and code, no download."""
    try:
        from pydoc_data.topics import topics
    except ImportError as error:  # some distributions strip pydoc_data
        raise TrainingError(
            f"this Python has no pydoc_data module for the default text ({error}); pass --data FILE"
        ) from error
    return "".join(topics[key] for key in sorted(topics))


def read_text(path: str) -> str:
    """The text of a file (UTF-8; undecodable bytes become U+FFFD), or a TrainingError saying
    plainly why it cannot be read."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise TrainingError(f"data file {path!r} does not exist") from None
    except IsADirectoryError:
        raise TrainingError(f"data file {path!r} is a directory, not a text file") from None
    except OSError as error:
        raise TrainingError(f"cannot read data file {path!r}: {error.strerror or error}") from None
    return raw.decode("utf-8", errors="replace")


class CharData:
    """The encoded text and its batches. `vocab` is the sorted set of characters in the text."""

    def __init__(self, text: str, context: int) -> None:
        if len(text) <= context + 1:
            raise TrainingError(
                f"the text has {len(text)} characters: too short for a context of {context} characters"
            )
        self.vocab = "".join(sorted(set(text)))
        codes = numpy.frombuffer(text.encode("utf-32-le"), dtype=numpy.uint32)
        table = numpy.frombuffer(self.vocab.encode("utf-32-le"), dtype=numpy.uint32)
        self.tokens = numpy.searchsorted(table, codes).astype(numpy.int64)
        self.context = context
        self.examples = len(self.tokens) - context
        self.fingerprint = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
        self._epoch: tuple[int, int, numpy.ndarray] | None = None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size > self.examples:
            raise TrainingError(
                f"--batch-size {batch_size} is larger than the {self.examples} examples in the text"
            )

    def global_batch(self, step: int, batch_size: int, seed: int) -> numpy.ndarray:
        """The example positions of step `step`'s global batch (the same on every rank)."""
        per_epoch = self.examples // batch_size
        epoch, index = divmod(step, per_epoch)
        if self._epoch is None or self._epoch[:2] != (seed, epoch):
            order = numpy.random.default_rng([seed, 2, epoch]).permutation(self.examples)
            self._epoch = (seed, epoch, order)
        return self._epoch[2][index * batch_size : (index + 1) * batch_size]

    def batch(self, step: int, batch_size: int, seed: int, rank: int, size: int, xp: Any = numpy,
              every_position: bool = False) -> tuple[Any, Any]:
        """This rank's part of step `step`'s global batch: contexts (b, k) and targets (b,), or
        with `every_position` targets (b*k,): the character after each context position."""
        bounds = split_bounds(batch_size, size)
        starts = self.global_batch(step, batch_size, seed)[bounds[rank] : bounds[rank + 1]]
        window = starts[:, None] + numpy.arange(self.context + 1)
        rows = self.tokens[window]
        targets = rows[:, 1:].reshape(-1) if every_position else rows[:, -1]
        return xp.asarray(rows[:, :-1]), xp.asarray(targets)
