"""`mpiring-bench` / `python -m mpiring.bench`: parse the flags, run every requested collective
and algorithm over the size sweep, report on rank 0.

Nothing may hang: bad flags end every rank with status 2 before any message moves, and an
unexpected exception on any rank prints its traceback and aborts the whole MPI job.
"""

from __future__ import annotations

import sys
import time
import traceback

from mpiring.bench.options import PROG, Options, UsageError, algorithms_for, parse_options


def run(options: Options) -> int:
    """Measure everything the options ask for; 0 when every result matched native MPI, else 1."""
    from mpi4py import MPI

    import mpiring
    import mpiring.algorithms
    from mpiring.bench.device import open_device
    from mpiring.bench.harness import measure, sweep
    from mpiring.bench.report import Reporter, metadata
    from mpiring.bench.table import COLLECTIVES, Setup, native_datatype, native_op

    # Name the algorithm mpiring picks when none is asked for, where the core says which.
    default = getattr(mpiring.algorithms, "DEFAULT_ALGORITHM", "default")
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if options.root >= size and any(COLLECTIVES[name].rooted for name in options.collectives):
        raise UsageError(f"--root {options.root} is not a rank: the job has {size} ranks")
    device = open_device(options.device, world)
    comm = mpiring.Communicator(world)
    p2p = world.Dup()  # the ceiling's messages never meet anyone else's
    meta = metadata(options, world, device)
    reporter = Reporter(meta, device) if rank == 0 else None
    results = []
    for name in options.collectives:
        row = COLLECTIVES[name]
        setup_args = dict(
            comm=comm, mpi=world, rank=rank, size=size, root=options.root, op=options.op,
            mpi_type=native_datatype(options.dtype, row.reduces), mpi_op=native_op(options.op, options.dtype),
        )
        for algorithm in algorithms_for(name, options.algorithm):
            setup = Setup(algorithm=algorithm, **setup_args)
            for count, nbytes in sweep(row, options, size):
                for result in measure(row, setup, device, p2p, count, nbytes, options, algorithm or default):
                    results.append(result)
                    if reporter:
                        reporter.add(result)
    if reporter:
        reporter.finish(options, results)
    p2p.Free()
    comm.free()
    return 1 if any(r.wrong for r in results) else 0


def abort_job() -> None:
    """Print the current exception with this rank's number and abort every rank of the job."""
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    sys.stdout.flush()
    sys.stderr.write(f"\n[rank {rank}] {PROG} failed; aborting the MPI job\n{traceback.format_exc()}")
    sys.stderr.flush()
    time.sleep(0.5)  # let the launcher forward this rank's stderr before it tears the job down
    MPI.COMM_WORLD.Abort(1)


def main(argv: list[str] | None = None) -> int:
    """The console script's entry point."""
    options = parse_options(argv)
    try:
        return run(options)
    except UsageError as error:
        # Raised alike on every rank (checks on agreed values only), so every rank returns.
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except BaseException:  # noqa: BLE001 - whatever it is, the other ranks must not wait for ever
        abort_job()
        return 1  # not reached: Abort ends the process
