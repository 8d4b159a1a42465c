"""`mpiring info` (also `python -m mpiring info`): versions, MPI library and world facts.

Under mpirun every rank reports; rank 0 prints the table in rank order.
"""

from __future__ import annotations

import argparse
import platform
import socket
import sys


def _info() -> int:
    import mpi4py
    import numpy
    from mpi4py import MPI

    import mpiring

    comm = MPI.COMM_WORLD
    levels = {
        MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple",
    }
    row = f"  rank {comm.Get_rank()}: host {socket.gethostname()}"
    rows = comm.gather(row, root=0)  # info is a diagnostic, so it trusts MPI's own gather
    if comm.Get_rank() != 0:
        return 0
    library = MPI.Get_library_version().strip().splitlines()[0]
    print(f"mpiring {mpiring.__version__}")
    print(f"python {platform.python_version()}, numpy {numpy.__version__}, mpi4py {mpi4py.__version__}")
    print(f"MPI library: {library}")
    print(f"MPI standard {'.'.join(map(str, MPI.Get_version()))}, "
          f"thread level {levels.get(MPI.Query_thread(), MPI.Query_thread())}")
    print(f"world size: {comm.Get_size()}")
    print("\n".join(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mpiring", description="mpiring: ring collectives over MPI")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, MPI library, world size and thread level")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    return 2


if __name__ == "__main__":
    sys.exit(main())
