"""`mpiring info` (also `python -m mpiring info`): versions, MPI library, GPU and world facts.
`mpiring cluster ...`: an emulated cluster on this machine (mpiring.cluster, docs/cluster.md).

Under mpirun every rank reports; rank 0 prints the table in rank order: rank -> host -> GPU.
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any


def _info() -> int:
    import mpi4py
    import numpy
    from mpi4py import MPI

    import mpiring
    from mpiring import host_memory, topology
    from mpiring.engine import native
    from mpiring.launch import check_world_size

    comm = MPI.COMM_WORLD
    check_world_size(comm.Get_size())  # under a plain srun, say so instead of "world size: 1" N times
    levels = {
        MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple",
    }
    cupy, gpu_lines = _gpu_facts()
    from mpiring.gpu.binding import describe_binding

    row = "  " + describe_binding(comm, cupy).describe()  # collective: binds each rank to its GPU
    rows = comm.gather(row, root=0)  # info is a diagnostic, so it trusts MPI's own gather
    nodes, _, spins, _ = topology.discover(comm)  # collective, as a Communicator finds them
    if comm.Get_rank() != 0:
        return 0
    library = MPI.Get_library_version().strip().splitlines()[0]
    print(f"mpiring {mpiring.__version__}")
    print(f"python {platform.python_version()}, numpy {numpy.__version__}, mpi4py {mpi4py.__version__}")
    print(f"MPI library: {library}")
    print(f"MPI standard {'.'.join(map(str, MPI.Get_version()))}, "
          f"thread level {levels.get(MPI.Query_thread(), MPI.Query_thread())}")
    print("\n".join(gpu_lines))
    print(f"planned calls replay {native.describe()}")
    print(f"large host arrays mpiring makes (mpiring.empty): {host_memory.describe()}")
    print(f"world size: {comm.Get_size()}, on {nodes.describe()} (node-aware algorithms: "
          f"{'yes' if nodes.hierarchical else 'no, one node or one rank per node'}); waits "
          f"{'spin' if spins else 'offer the core'} (MPIRING_BUSY_POLL unset"
          f"{'; the MPI library offers the core in each test' if topology.library_yields_when_idle() else ''})")
    print("\n".join(rows))
    return 0


def _gpu_facts() -> tuple[Any | None, list[str]]:
    """CuPy (when it is installed and finds a GPU), and lines on CuPy, the GPUs and CUDA-aware MPI."""
    from mpiring.cuda_detection import cuda_awareness
    from mpiring.errors import ArgumentError
    from mpiring.gpu import ipc_enabled, path_for

    lines, cupy = [], None
    try:
        import cupy as found

        if found.is_available():
            cupy = found
            runtime = found.cuda.runtime.runtimeGetVersion()
            lines.append(f"cupy {found.__version__}, CUDA runtime {runtime // 1000}.{runtime % 1000 // 10}, "
                         f"{found.cuda.runtime.getDeviceCount()} visible GPU(s)")
        else:
            lines.append(f"cupy {found.__version__}: no usable GPU here (cupy.is_available() is False)")
    except ImportError:
        lines.append("cupy: not installed (pip install 'mpiring[gpu]' for CuPy device buffers)")
    try:
        awareness = cuda_awareness()
        ipc = "the ipc path within one node, else " if ipc_enabled(awareness) else ""
        lines.append(f"CUDA-aware MPI: {'yes' if awareness.aware else 'no'} ({awareness.how}); "
                     f"device buffers take {ipc}the {path_for(awareness)} path")
    except ArgumentError as error:
        lines.append(f"CUDA-aware MPI: {error}")
    return cupy, lines


def main(argv: list[str] | None = None) -> int:
    from mpiring import __version__

    parser = argparse.ArgumentParser(prog="mpiring", description="mpiring: ring collectives over MPI")
    # The running package's own version, not the installed metadata's, which an editable install
    # leaves at whatever version was current when it was installed.
    parser.add_argument("--version", action="version", version=f"mpiring {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, MPI library, GPUs, CUDA-aware MPI, world size, rank -> host -> GPU")
    cluster = sub.add_parser("cluster", help="an emulated cluster on this machine: up, run, status, down (as root)",
                             description="An emulated cluster: network namespaces as nodes, shaped links between "
                                         "them (docs/cluster.md).")
    from mpiring.cluster.cli import add_arguments

    add_arguments(cluster)
    sub.add_parser("model", help="the cost model: calibrate, predict, project (docs/cost-model.md)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "model":
        from mpiring.cost_model import main as model

        return model(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "info":
        return _info()
    if args.command == "cluster":
        from mpiring.cluster.cli import run_action

        return run_action(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
