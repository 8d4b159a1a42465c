"""The benchmark's command line: flags, size suffixes, and every check that can be made before
any message moves (so bad flags fail cleanly on every rank instead of hanging the job).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy

from mpiring import __version__
from mpiring.backend import SUPPORTED_DTYPES
from mpiring.catalogue import NAMES, REDUCING
from mpiring.launch import RankZeroArgumentParser
from mpiring.ops import OPS, SUM, op_problem

COLLECTIVE_NAMES = NAMES
# mpiring.bench.table.FORMS says what each is
FORM_NAMES = ("best", "plain", "fresh", "dropin", "dropin-mmap", "dropin-inplace")
PROG = "mpiring-bench"
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class UsageError(Exception):
    """A request the benchmark cannot carry out. Raised alike on every rank, so no rank hangs."""


@dataclass(frozen=True)
class Options:
    """The parsed and checked command line."""

    collectives: tuple[str, ...]
    min_bytes: int
    max_bytes: int
    factor: float
    dtype: numpy.dtype
    op: str
    root: int
    device: str
    algorithm: str | None  # None: mpiring's default; "all": every algorithm of each collective
    forms: tuple[str, ...]  # how mpiring is called (table.FORMS)
    warmup: int
    iters: int
    reps: int
    rotate: int  # buffer sets the calls cycle through (1: one set, as nccl-tests)
    csv: str | None
    json: str | None
    plot: str | None
    min_batch: float = 1e-3  # seconds a timed batch lasts at least (mpiring.bench.timing)


def parse_bytes(text: str) -> int:
    """'4096', '1K', '16M', '1G', '2KiB', '8MB' -> bytes (binary suffixes: K = 1024, as nccl-tests)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (examples: 512, 1K, 16M, 1G)")
    return int(match.group(1)) * _SUFFIXES[match.group(2).upper()]


def format_bytes(n: int) -> str:
    """The shortest exact binary-suffixed form: 1024 -> '1K', 3 << 20 -> '3M', 1000 -> '1000'."""
    for suffix in ("T", "G", "M", "K"):
        unit = _SUFFIXES[suffix]
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def _positive(kind: type) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return convert


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _nonnegative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = RankZeroArgumentParser(
        prog=PROG,
        description="mpiring's collectives against mpi4py's native ones and a point-to-point ceiling, "
        "nccl-tests style. Run under mpirun, e.g.  mpirun -n 4 python -m mpiring.bench -c allreduce -e 16M",
    )
    dtype_names = sorted(d.name for d in SUPPORTED_DTYPES)
    add = parser.add_argument
    add("-c", "--collective", default="all", choices=(*COLLECTIVE_NAMES, "all"), metavar="NAME",
        help=f"one of {', '.join(COLLECTIVE_NAMES)}, or all (default)")
    add("-b", "--min-bytes", type=parse_bytes, default=8, metavar="SIZE",
        help="smallest size S, suffixes K M G (default 8)")
    add("-e", "--max-bytes", type=parse_bytes, default=64 << 20, metavar="SIZE",
        help="largest size S (default 64M)")
    add("-f", "--factor", type=float, default=2.0, help="size multiplier between steps (default 2)")
    add("-d", "--dtype", default="float32", choices=dtype_names, metavar="DTYPE",
        help=f"element type (default float32): {', '.join(dtype_names)}")
    add("-o", "--op", default=SUM, choices=OPS,
        help="reduction of reduce, allreduce, reduce_scatter, scan, exscan (default sum)")
    add("-r", "--root", type=_nonnegative_int, default=0,
        help="root of broadcast, reduce, gather, scatter (default 0)")
    add("--device", default="cpu", choices=("cpu", "gpu"),
        help="host NumPy or GPU CuPy buffers (default cpu)")
    add("-a", "--algorithm", default=None, metavar="NAME",
        help="a name in mpiring.algorithms.ALGORITHMS, auto, or all to sweep every one (default: mpiring's)")
    add("--form", default="best", choices=(*FORM_NAMES, "all"),
        help="how mpiring is called, each against the native call a mpi4py user would write: best (the same "
             "arrays, out= and counts= given), plain (no out= or counts=), fresh (a new input each call), "
             "dropin (comm.Allreduce(x, y) ...), dropin-mmap (the drop-in with [buf, count, type] over an mmap, as "
             "mpi4py's OSU demos), dropin-inplace (the drop-in with MPI.IN_PLACE where MPI allows it), or all "
             "(default best)")
    add("-w", "--warmup", type=_nonnegative_int, default=5, help="untimed iterations per size (default 5)")
    add("-n", "--iters", type=_positive(int), default=20, help="iterations per timed batch (default 20)")
    add("--min-batch-ms", type=_nonnegative_float, default=1.0, metavar="MS",
        help="each timed batch lasts at least this long: more iterations than --iters where calls are short, "
             "so that the barrier before a batch does not count (default 1; 0: --iters always)")
    add("--reps", type=_positive(int), default=5,
        help="timed batches per size; each rank keeps its median batch (default 5)")
    add("--rotate", type=_positive(int), default=1, metavar="N",
        help="cycle every timed call through N sets of buffers, so sizes that fit in the cache are not "
             "flattered by reusing one (default 1)")
    add("--csv", metavar="FILE", help="write the results as CSV")
    add("--json", metavar="FILE", help="write the results and the run's metadata as JSON")
    add("--plot", metavar="FILE.png", help="plot busbw against size (needs matplotlib)")
    add("--version", action="version", version=f"{PROG} {__version__}")
    return parser


def parse_options(argv: list[str] | None = None) -> Options:
    """Parse and check the command line; exits with status 2 and a message on a bad flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _check(args)
    except UsageError as error:
        parser.error(str(error))
    raise AssertionError("unreachable: parser.error exits")


def _check(args: argparse.Namespace) -> Options:
    collectives = COLLECTIVE_NAMES if args.collective == "all" else (args.collective,)
    if args.min_bytes > args.max_bytes:
        raise UsageError(f"--min-bytes {args.min_bytes} is larger than --max-bytes {args.max_bytes}")
    if args.factor <= 1 and args.min_bytes != args.max_bytes:
        raise UsageError(f"--factor must be > 1 to sweep from --min-bytes to --max-bytes, got {args.factor}")
    dtype = numpy.dtype(args.dtype)
    if any(name in REDUCING for name in collectives):
        problem = op_problem(args.op, dtype.kind)
        if problem:
            raise UsageError(f"--op {args.op} with --dtype {dtype}: {problem}")
    if args.algorithm is not None:
        _check_algorithm(args.algorithm, collectives)
    forms = FORM_NAMES if args.form == "all" else (args.form,)
    if forms != ("best",) and args.device != "cpu":
        raise UsageError(f"--form {args.form} runs on host buffers only (--device cpu)")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install matplotlib (or mpiring[bench])")
    for flag in ("csv", "json", "plot"):
        path = getattr(args, flag)
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(f"--{flag} {path}: no such directory")
    return Options(
        collectives=tuple(collectives), min_bytes=args.min_bytes, max_bytes=args.max_bytes,
        factor=args.factor, dtype=dtype, op=args.op, root=args.root, device=args.device,
        algorithm=args.algorithm, forms=forms, warmup=args.warmup, iters=args.iters, reps=args.reps, rotate=args.rotate,
        csv=args.csv, json=args.json, plot=args.plot, min_batch=args.min_batch_ms / 1e3,
    )


def algorithms_for(collective: str, requested: str | None) -> list[str | None]:
    """The algorithms to run for a collective: [requested], or every one for 'all'."""
    if requested != "all":
        return [requested]
    from mpiring.algorithms import ALGORITHMS

    names: list[str | None] = list(ALGORITHMS[collective])
    if "auto" not in names and _accepts(collective, "auto"):
        names.append("auto")
    return names


def _accepts(collective: str, algorithm: str) -> bool:
    """Whether mpiring itself accepts `algorithm=` for this collective (its own check decides)."""
    from mpiring.errors import ArgumentError
    from mpiring.validation import check_algorithm

    try:
        check_algorithm(collective, algorithm)
    except ArgumentError:
        return False
    return True


def _check_algorithm(algorithm: str, collectives: tuple[str, ...]) -> None:
    if algorithm == "all":
        return
    missing = [name for name in collectives if not _accepts(name, algorithm)]
    if missing:
        from mpiring.algorithms import ALGORITHMS

        known = "; ".join(f"{name}: {', '.join(ALGORITHMS[name])}" for name in missing)
        raise UsageError(f"--algorithm {algorithm} is unknown to {', '.join(missing)} (known: {known})")

