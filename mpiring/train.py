"""Train a small character-level language model (a GPT, or an MLP) with DDP or ZeRO-1/2/3, every byte moved by
mpiring's ring collectives: the `mpiring-train` command (also `python -m mpiring.train`, and
examples/train.py).

    mpirun -n 8 mpiring-train                                  # ZeRO-3 on 8 ranks
    mpirun -n 4 mpiring-train --strategy ddp --report ddp.json --plot ddp.png
    mpirun -n 4 mpiring-train --checkpoint-dir ckpt --checkpoint-every 100
    mpirun -n 3 mpiring-train --checkpoint-dir ckpt --resume   # any world size
    mpirun -n 3 mpiring-train --checkpoint-dir ckpt --resume --fresh   # step 0 if nothing there loads

The work is in mpiring.training (docs/training.md); this is only its command line.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

import mpiring
from mpiring import survival
from mpiring.launch import RankZeroArgumentParser, launcher_rank


def _count(minimum: int):  # noqa: ANN202
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = RankZeroArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", choices=("ddp", "zero1", "zero2", "zero3"), default="zero3",
                   help="what to shard: ddp nothing; zero1 optimizer state; zero2 + gradients; "
                        "zero3 + parameters (default: %(default)s)")
    p.add_argument("--model", choices=("gpt", "mlp"), default="gpt",
                   help="gpt: a small transformer; mlp: a Bengio-style MLP, the smallest runs (default: %(default)s)")
    p.add_argument("--steps", type=_count(0), help="total training steps (default: 400 for gpt, 200 for mlp)")
    p.add_argument("--seed", type=int, default=0, help="initial parameters and data order (default: %(default)s)")
    p.add_argument("--batch-size", type=_count(1),
                   help="GLOBAL batch in examples, split among the ranks, so the math does not depend on the "
                        "world size; an MLP example predicts 1 character, a GPT example (a sequence) one per "
                        "position (default: 32 for gpt, 1024 for mlp)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="gpu computes with CuPy")
    p.add_argument("--data", metavar="FILE", help="a text file to learn (default: Python's own pydoc topics)")
    p.add_argument("--preset", choices=("small", "medium", "large"), default="small",
                   help="model shape; large shows the memory savings (default: %(default)s)")
    for name, what in (("context", "characters of context"), ("embed", "embedding width"),
                       ("hidden", "hidden layer width (gpt: the MLP's)"), ("layers", "hidden layers (gpt: blocks)"),
                       ("heads", "attention heads (gpt only)")):
        p.add_argument(f"--{name}", type=_count(1), metavar="N", help=f"{what} (overrides the preset)")
    p.add_argument("--lr", type=_positive_float, help="learning rate (default: the preset's; docs/training.md)")
    p.add_argument("--warmup", type=_count(0), metavar="N",
                   help="learning rate: linear warm-up over N steps (default: 50 for gpt, 0 for mlp)")
    p.add_argument("--decay-steps", type=_count(0), metavar="N",
                   help="then a cosine down to a tenth at step N, 0 = none (default: 400 for gpt, 0 for mlp)")
    p.add_argument("--momentum", type=_fraction, default=0.9,
                   help="SGD momentum; 0 is plain SGD, with no optimizer state (default: %(default)s)")
    p.add_argument("--bucket-kb", type=_count(0), default=256,
                   help="gradient bucket cap for ddp and zero2, KiB; 0 = one layer per bucket (default: %(default)s)")
    p.add_argument("--overlap", action="store_true",
                   help="overlap collectives with compute (needs mpiring's nonblocking collectives)")
    p.add_argument("--algorithm", choices=("auto", "ring"), default="auto",
                   help="collective algorithms: mpiring's choice by size, or rings throughout (what the "
                        "traffic theory assumes) (default: %(default)s)")
    p.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                   help="a collective that waits longer for a peer fails, naming the missing rank "
                        "(default: $MPIRING_TIMEOUT, else 600; inf: no limit)")
    p.add_argument("--report", metavar="FILE.json", help="write the run's measurements as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw the loss curve (needs matplotlib)")
    p.add_argument("--elastic", action="store_true",
                   help="survive lost ranks: the survivors shrink to N-1 ranks, reload the newest checkpoint and "
                        "go on (needs --checkpoint-dir, and a launch that keeps survivors running, e.g. MPICH's "
                        "mpiexec -disable-auto-cleanup; docs/lost-rank.md)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="where checkpoints go (one directory each)")
    p.add_argument("--checkpoint-every", type=_count(0), default=0, metavar="N",
                   help="save every N steps (and at the end); 0 = only at the end")
    p.add_argument("--keep", type=_count(0), default=0, metavar="N",
                   help="keep only the newest N checkpoints; 0 = all (default: %(default)s)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir that loads (at any world "
                        "size); a directory without step directories starts from step 0, one whose step "
                        "directories all fail to load stops the run")
    p.add_argument("--fresh", action="store_true",
                   help="with --resume: start from step 0 when no checkpoint in --checkpoint-dir loads (step "
                        "directories without a manifest.json, corrupt or another run's), instead of stopping")
    p.add_argument("--log-every", type=_count(0), default=10, metavar="N",
                   help="progress line every N steps (and the last), 0 = none (default: %(default)s)")
    p.add_argument("--sample-chars", type=_count(0), default=200, metavar="N",
                   help="characters of text to generate at the end (default: %(default)s)")
    args = p.parse_args(argv)
    if (args.checkpoint_every or args.resume or args.elastic) and not args.checkpoint_dir:
        p.error("--checkpoint-every, --resume and --elastic need --checkpoint-dir")
    if args.fresh and not args.resume:
        p.error("--fresh applies with --resume only (without --resume a run starts from step 0)")
    return args


def _check_output(path: str | None, flag: str) -> None:
    from mpiring.training import TrainingError

    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise TrainingError(f"{flag} {path!r}: cannot write in {folder!r}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mpiring.training import TrainConfig, TrainingError, default_text, read_text, train
    from mpiring.training.errors import agree
    from mpiring.training.report import format_summary, summarize, write_json

    survive = True if args.elastic else None
    comm = (mpiring.Communicator(timeout=args.timeout, survive=survive) if args.timeout
            else mpiring.Communicator(survive=survive))
    say = print if comm.rank == 0 else None
    if args.elastic:  # after a loss, rank 0 of the survivors speaks (it may be another process)
        current = [comm]

        def say(line: str) -> None:
            if current[0].rank == 0:
                print(line, flush=True)
    bar = None
    if comm.rank == 0 and sys.stdout.isatty():  # a terminal: a bar between the logged lines
        say, bar = _terminal_lines()
    config = TrainConfig(
        strategy=args.strategy, model=args.model, steps=args.steps, seed=args.seed, batch_size=args.batch_size,
        dtype=args.dtype, device=args.device, preset=args.preset, context=args.context,
        embed=args.embed, hidden=args.hidden, layers=args.layers, heads=args.heads, lr=args.lr, momentum=args.momentum,
        warmup=args.warmup, decay_steps=args.decay_steps,
        bucket_bytes=args.bucket_kb * 1024, overlap=args.overlap,
        algorithm=None if args.algorithm == "auto" else args.algorithm, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every, keep=args.keep, resume=args.resume, fresh=args.fresh,
        log_every=args.log_every, sample_chars=args.sample_chars, elastic=args.elastic,
    )
    try:
        # Every rank checks its inputs itself, then they agree: a rank that cannot read the
        # data stops every rank with its message, and none is left waiting in a collective.
        problem: TrainingError | None = None
        try:
            text = read_text(args.data) if args.data else default_text()
            _check_output(args.report, "--report")
            _check_output(args.plot, "--plot")
            if args.plot:
                from mpiring.training.plotting import pyplot
                pyplot()
        except TrainingError as error:
            problem = error
        agree(comm, problem)
        result = train(config, comm, text, log=say, progress=bar,
                       shrunk=(lambda new: current.__setitem__(0, new)) if args.elastic else None)
        comm = result.strategy.comm  # the survivors' communicator after a loss (--elastic)
        report = summarize(result, comm)
    except TrainingError as error:
        if comm.rank == 0:
            print(f"{os.path.basename(sys.argv[0])}: error: {error}", file=sys.stderr)
        return 1
    if comm.rank == 0:
        print(format_summary(report))
        if args.report:
            write_json(report, args.report)
            print(f"report: {args.report}")
        if args.plot:
            from mpiring.training.plotting import plot_run
            plot_run(report, args.plot)
            print(f"plot: {args.plot}")
    return 0


def run(argv: list[str] | None = None) -> int:
    """main() as a command: Ctrl-C ends the job with one line; any other unexpected error on one
    rank would leave the others waiting for it in a collective for ever, so it takes the whole
    job down after printing its traceback."""
    signal.signal(signal.SIGINT, _interrupted)
    try:
        code = main(argv)
        survival.exit_after_loss(code)  # (--elastic: MPI_Finalize would wait for the lost ranks)
        return code
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        _abort(1)
    return 1


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C: the launcher hands it to every rank. Rank 0 says so once, and every rank leaves at
    once, with no KeyboardInterrupt (which could surface anywhere, a finalizer included) and
    without MPI_Finalize (which could wait for a peer that is already gone). The others leave a
    moment later: the launcher ends the whole job when the first rank exits. A rank 0 inside a
    blocking MPI wait runs this only when the wait returns, so the job may end silently."""
    if launcher_rank() == 0:
        os.write(2, b"\nmpiring-train: interrupted\n")
    else:
        time.sleep(0.5)
    os._exit(128 + signum)


def _abort(code: int) -> None:
    sys.stderr.flush()
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        MPI.COMM_WORLD.Abort(code)
    sys.exit(code)


if __name__ == "__main__":
    sys.exit(run())


def _terminal_lines() -> tuple[Callable[[str], None], Callable[[int, int, float], None]]:
    """A log that first clears the bar, and the bar: one line redrawn in place."""

    def say(line: str) -> None:
        print("\r\033[K" + line, flush=True)

    def bar(step: int, steps: int, loss: float) -> None:
        done = 30 * step // max(steps, 1)
        sys.stdout.write(f"\r\033[Kstep {step}/{steps} [{'#' * done}{'.' * (30 - done)}] loss {loss:.4f}")
        sys.stdout.flush()

    return say, bar
