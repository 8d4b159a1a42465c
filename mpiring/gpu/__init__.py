"""CuPy device buffers: the backend for them, the path to MPI, and which GPU each rank uses.

Nothing here imports CuPy until a CuPy array reaches a collective (mpiring.backend.backend_for
recognises one by its type, without importing CuPy), so host-only users never pay for it.

    path      when                                    what MPI sees
    direct    cuda_aware() is True                    device buffers (after a stream sync)
    ipc       otherwise, on a communicator whose      descriptors only: payloads go device to
              ranks share one node                    device by CUDA IPC (mpiring.gpu.ipc)
    staged    otherwise (every PyPI MPI wheel)        pinned host segments, copies overlapped

MPIRING_GPU_IPC=1 puts IPC first (before direct), =0 turns it off. Direct comes first by default
because it measured faster at large messages on an H100 (docs/gpu.md).

MPIRING_DEBUG=1 says once per device and path which path device buffers take, and why.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mpiring import environment
from mpiring.cuda_detection import ENV as CUDA_AWARE_ENV
from mpiring.cuda_detection import CudaAwareness, cuda_aware, cuda_awareness, parse_override
from mpiring.gpu.binding import bind_device

__all__ = ["bind_device", "cuda_aware", "cuda_awareness", "device_backend", "ipc_enabled", "path_for"]

IPC_ENV = "MPIRING_GPU_IPC"

# (device, path, ipc) -> its backend; ("chosen", device, the two variables' raw text) -> the choice
_backends: dict[tuple, Any] = {}


def ipc_enabled(awareness: CudaAwareness) -> bool:
    """Whether node-local communicators move device buffers by CUDA IPC: MPIRING_GPU_IPC=1 or 0,
    else only where MPI is not CUDA-aware (the direct path measured faster)."""
    override = parse_override(environment.text(IPC_ENV), IPC_ENV)
    return not awareness.aware if override is None else override


def path_for(awareness: CudaAwareness) -> str:
    """"direct" when device pointers may go to MPI, else "staged"."""
    return "direct" if awareness.aware else "staged"


def device_backend(x: Any) -> Any:
    """The backend for CuPy array `x`: its device, on the path the CUDA-awareness answer allows.

    Where IPC is on (`ipc_enabled`), the backend is an IPC backend wrapping that one:
    communicators whose ranks share a node take the IPC path, others the MPI path.

    The environment overrides are re-read on every call (they can change between calls, as the
    tests do), but only as raw text: the choice for the same text is remembered once MPI has
    answered. The backends, their streams and pools are made once and kept.
    """
    device_id = int(x.device.id)
    remembered = ("chosen", device_id, os.environ.get(CUDA_AWARE_ENV), os.environ.get(IPC_ENV))
    backend = _backends.get(remembered)
    if backend is not None:
        return backend
    awareness = cuda_awareness()
    path = path_for(awareness)
    ipc = ipc_enabled(awareness)
    backend = _backends.get((device_id, path, ipc))
    if backend is None:
        backend = _make_backend(device_id, path)
        if ipc:
            backend = _make_ipc_backend(device_id, backend)
        _backends[(device_id, path, ipc)] = backend
        announce(device_id, backend, awareness)
    if awareness.settled:
        _backends[remembered] = backend
    return backend


def _make_backend(device_id: int, path: str) -> Any:
    import cupy

    from mpiring.gpu.backend import CupyBackend, StagedCupyBackend
    from mpiring.gpu.copy_streams import CupyCopyEngine

    engine = CupyCopyEngine(cupy, device_id)
    name = f"cupy (GPU {device_id})"
    if path == "direct":
        return CupyBackend(cupy, engine.device, engine, name=name)
    return StagedCupyBackend(cupy, engine.device, engine, name=name)


def _make_ipc_backend(device_id: int, fallback: Any) -> Any:
    import cupy

    from mpiring.gpu.backend import IpcCupyBackend
    from mpiring.gpu.copy_streams import CupyIpcEngine

    engine = CupyIpcEngine(cupy, device_id)
    return IpcCupyBackend(cupy, engine.device, engine, fallback, name=f"cupy (GPU {device_id}, ipc)")


def announce(device_id: int, backend: Any, awareness: CudaAwareness) -> None:
    """Under MPIRING_DEBUG=1, say (once per device and path) which path device buffers take."""
    if not environment.flag("MPIRING_DEBUG", "mpiring"):
        return
    mpi_backend = getattr(backend, "fallback", backend)
    detail = f", {mpi_backend.segment_bytes} B segments" if mpi_backend.path == "staged" else ""
    prefix = "the ipc path on communicators whose ranks share one node, else " if backend.path == "ipc" else ""
    sys.stderr.write(f"mpiring: CuPy buffers on GPU {device_id} take {prefix}the {mpi_backend.path} path "
                     f"({awareness.how}{detail})\n")
