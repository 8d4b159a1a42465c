"""Sharded, atomic checkpoints that load at any world size and with any strategy.

    CHECKPOINT_DIR/
      step-00000100/          one directory per checkpoint, complete by construction
        manifest.json         step, run settings, losses so far, and for every shard file:
                              the flat-vector pieces it holds and its sha256; and the
                              sha256 of the manifest itself, so an edited step is refused
        shard-00000.npy       rank 0's pieces, one after another; rows: parameters, then
        shard-00001.npy       optimizer state (momentum)
      .tmp-step-00000200/     a save in progress, or one a crash interrupted: never read

Saving is collective. Rank 0 makes an empty temporary directory; every rank writes its own
shard into it (and fsyncs); rank 0 writes the manifest with every shard's checksum and then
renames the directory to its final name. The rename is atomic, so a crash at any moment leaves
the earlier checkpoints untouched, and a half-written one never gets a name that is read.

Loading needs no communication to move data: each rank asks for the flat ranges it holds under
its own strategy and world size; the reader finds the pieces that overlap them in whichever
files hold them, checks those files' checksums and copies. So a checkpoint written by 8 ranks
of ZeRO-3 loads into 3 ranks of DDP (resharding). The ranks agree on any failure, so a bad
checkpoint stops every rank with the same message instead of hanging some of them; resuming
then falls back to the newest checkpoint that loads (mpiring.training.trainer), and names what
it skipped. A step directory without its manifest lost it after the save (the manifest is
written before the rename): it is never loaded, but it is listed (step_directories), so that
resuming can say so rather than start from step 0 as if the directory were empty. `keep` prunes
all but the newest few after each save.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any

import numpy

from mpiring.training.arrays import to_host
from mpiring.training.errors import TrainingError, agree
from mpiring.training.strategy import Strategy

FORMAT = 2  # 2: the manifest carries its own checksum
MANIFEST = "manifest.json"
SELF_CHECKSUM = "manifest_sha256"
_PREFIX = "step-"
_LISTED = 4  # files named in a message about a step directory without a manifest


class CheckpointError(TrainingError):
    """A checkpoint that cannot be written, read, or used for this run."""


def checkpoint_path(directory: str, step: int) -> str:
    return os.path.join(directory, f"{_PREFIX}{step:08d}")


@dataclass(frozen=True)
class StepDirectory:
    """A step-NNNNNNNN entry of a checkpoint directory, with or without its manifest."""

    path: str
    step: int
    complete: bool  # has its manifest.json: a finished save (the only kind ever renamed to this name)


def step_directories(directory: str) -> list[StepDirectory]:
    """Every step-NNNNNNNN entry in `directory`, newest first, complete or not. Temporary
    directories (.tmp-step-..., .old-step-...) are left out by name: they are never read."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [StepDirectory(os.path.join(directory, name), int(name[len(_PREFIX):]),
                           os.path.isfile(os.path.join(directory, name, MANIFEST)))
             for name in names if name.startswith(_PREFIX) and name[len(_PREFIX):].isdigit()]
    return sorted(found, key=lambda entry: entry.step, reverse=True)


def complete(directory: str) -> list[str]:
    """The complete checkpoints in `directory`, newest first. Temporary directories are skipped
    by name: only a finished save is ever renamed to step-NNNNNNNN."""
    return [entry.path for entry in step_directories(directory) if entry.complete]


def unfinished(directory: str) -> list[str]:
    """The names of saves that never finished (.tmp-step-...) in `directory`, newest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((name for name in names if name.startswith(".tmp-" + _PREFIX)), reverse=True)


def missing_manifest(path: str) -> str:
    """Why the step directory at `path`, which has no manifest, is not a checkpoint: what is
    missing and what is there. A save writes its manifest before the rename that gives the
    directory this name, so such a directory was damaged or copied in part afterwards."""
    try:
        names = sorted(os.listdir(path))
    except OSError as error:
        held = f"it cannot be listed: {error.strerror or error}"
    else:
        shown = ", ".join(names[:_LISTED])
        more = len(names) - _LISTED
        held = ("it is empty" if not names else
                f"it holds {shown}" + (f" and {more} more file{'s' * (more > 1)}" if more > 0 else ""))
    return f"no {MANIFEST} (incomplete or damaged; {held})"


def latest(directory: str) -> str | None:
    """The newest complete checkpoint in `directory`, or None."""
    found = complete(directory)
    return found[0] if found else None


def _manifest_checksum(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest without its own checksum, in one canonical JSON form."""
    body = {key: value for key, value in manifest.items() if key != SELF_CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _before_publish() -> None:
    """Called on every rank after all shards are written, before the rename (tests crash here)."""


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _write_shard(directory: str, rank: int, strategy: Strategy) -> None:
    """This rank's pieces as shard-RRRRR.npy, and what is in it (for the manifest) beside it."""
    pieces = strategy.checkpoint_pieces()
    rows = 1 + strategy.optimizer.slots
    columns = [numpy.stack([to_host(a) for a in arrays]) for _, _, arrays in pieces]
    table = numpy.concatenate(columns, axis=1) if columns else numpy.zeros((rows, 0), strategy.dtype)
    buffer = io.BytesIO()
    numpy.save(buffer, table)
    data = buffer.getvalue()
    name = f"shard-{rank:05d}.npy"
    _write_file(os.path.join(directory, name), data)
    entry = {"file": name, "pieces": [[lo, hi] for lo, hi, _ in pieces],
             "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    _write_file(os.path.join(directory, name + ".json"), json.dumps(entry).encode())


def save(directory: str, step: int, strategy: Strategy, meta: dict[str, Any], losses: list[float],
         keep: int = 0) -> str:
    """Collective: write the state after `step` steps as a new checkpoint; returns its path.

    `meta` describes the run (model, optimizer, data...); a later load must match it. With
    `keep` > 0, only the newest `keep` checkpoints remain afterwards.
    """
    comm = strategy.comm
    final = checkpoint_path(directory, step)
    temporary = os.path.join(directory, ".tmp-" + os.path.basename(final))
    problem: str | None = None
    if comm.rank == 0:
        try:
            os.makedirs(directory, exist_ok=True)
            shutil.rmtree(temporary, ignore_errors=True)  # left by a save that crashed
            os.mkdir(temporary)
        except OSError as error:
            problem = f"cannot create checkpoint directory {temporary!r}: {error}"
    agree(comm, problem, CheckpointError)
    try:
        _write_shard(temporary, comm.rank, strategy)
    except OSError as error:
        problem = f"cannot write checkpoint shard in {temporary!r}: {error}"
    agree(comm, problem, CheckpointError)
    _before_publish()
    if comm.rank == 0:
        try:
            _publish(temporary, final, step, strategy, meta, losses)
            for old in complete(directory)[keep:] if keep else ():
                shutil.rmtree(old)
        except (OSError, ValueError) as error:
            problem = f"cannot finish checkpoint {final!r}: {error}"
    agree(comm, problem, CheckpointError)
    return final


def _publish(temporary: str, final: str, step: int, strategy: Strategy, meta: dict[str, Any],
             losses: list[float]) -> None:
    """Rank 0: the manifest, then the atomic rename that makes the checkpoint exist."""
    shards = []
    for rank in range(strategy.comm.size):
        with open(os.path.join(temporary, f"shard-{rank:05d}.npy.json")) as handle:
            shards.append(json.load(handle))
    manifest = {
        "format": FORMAT, "step": step, "strategy": strategy.name, "world_size": strategy.comm.size,
        "dtype": strategy.dtype.name, "param_count": strategy.model.param_count,
        "rows": ["params"] + ["momentum"] * strategy.optimizer.slots,
        "meta": meta, "losses": losses, "shards": shards,
    }
    manifest[SELF_CHECKSUM] = _manifest_checksum(manifest)
    _write_file(os.path.join(temporary, MANIFEST), json.dumps(manifest, indent=1).encode())
    _fsync_dir(temporary)
    stale = None
    if os.path.exists(final):  # the same step saved again (a resumed run): swap it out
        stale = os.path.join(os.path.dirname(final), ".old-" + os.path.basename(final))
        shutil.rmtree(stale, ignore_errors=True)
        os.rename(final, stale)
    os.rename(temporary, final)
    _fsync_dir(os.path.dirname(final) or ".")
    if stale:
        shutil.rmtree(stale, ignore_errors=True)


class Reader:
    """Reads any flat range of any row from a checkpoint's shard files, checking checksums."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(os.path.join(path, MANIFEST)) as handle:
                self.manifest = json.load(handle)
        except (OSError, ValueError) as error:
            raise CheckpointError(f"cannot read the manifest of checkpoint {path!r}: {error}") from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            found = self.manifest.get("format") if isinstance(self.manifest, dict) else None
            raise CheckpointError(f"checkpoint {path!r} has format {found}, expected {FORMAT}")
        if self.manifest.get(SELF_CHECKSUM) != _manifest_checksum(self.manifest):
            raise CheckpointError(f"the manifest of checkpoint {path!r} was changed after it was written "
                                  "(its checksum does not match)")
        self._tables: dict[str, numpy.ndarray] = {}

    def _table(self, shard: dict[str, Any]) -> numpy.ndarray:
        name = shard["file"]
        if name not in self._tables:
            try:
                with open(os.path.join(self.path, name), "rb") as handle:
                    data = handle.read()
            except OSError as error:
                raise CheckpointError(f"cannot read {name} of checkpoint {self.path!r}: {error}") from None
            if hashlib.sha256(data).hexdigest() != shard["sha256"]:
                raise CheckpointError(f"{name} of checkpoint {self.path!r} is corrupt (checksum mismatch)")
            self._tables[name] = numpy.load(io.BytesIO(data), allow_pickle=False)
        return self._tables[name]

    def read(self, row: int, lo: int, hi: int) -> numpy.ndarray:
        """Values [lo, hi) of row `row` (0 parameters, 1.. optimizer state) of the flat vector."""
        out = numpy.empty(hi - lo, dtype=numpy.dtype(self.manifest["dtype"]))
        covered = 0
        for shard in self.manifest["shards"]:
            at = 0
            for piece_lo, piece_hi in shard["pieces"]:
                a, b = max(lo, piece_lo), min(hi, piece_hi)
                if a < b:
                    out[a - lo : b - lo] = self._table(shard)[row, at + a - piece_lo : at + b - piece_lo]
                    covered += b - a
                at += piece_hi - piece_lo
        if covered != hi - lo:
            raise CheckpointError(f"checkpoint {self.path!r} does not hold all of [{lo}, {hi})")
        return out


def load(path: str, strategy: Strategy, meta: dict[str, Any]) -> dict[str, Any]:
    """Collective: fill `strategy` from the checkpoint at `path`; returns its manifest.

    Raises CheckpointError on every rank if the checkpoint is unreadable, corrupt, or was made
    by a run that differs from `meta` (another model, optimizer, data, seed or batch size).
    """
    problem: BaseException | None = None
    manifest: dict[str, Any] = {}
    try:
        reader = Reader(path)
        manifest = reader.manifest
        saved = manifest.get("meta", {})
        differ = [f"{key}: checkpoint {saved.get(key)!r}, this run {meta[key]!r}"
                  for key in meta if saved.get(key) != meta[key]]
        if differ:
            raise CheckpointError(f"checkpoint {path!r} was made by a different run; " + "; ".join(differ))
        strategy.load_state(reader.read)
    except CheckpointError as error:
        problem = error
    except (OSError, ValueError, KeyError, IndexError) as error:
        problem = CheckpointError(f"checkpoint {path!r} is unusable: {error!r}")
    agree(strategy.comm, problem, CheckpointError)
    return manifest
