"""CuPy device buffers: the backend for them, the path to MPI, and which GPU each rank uses.

Nothing here imports CuPy until a CuPy array reaches a collective (mpiring.backend.backend_for
recognises one by its type, without importing CuPy), so host-only users never pay for it.

    path      when                                    what MPI sees
    direct    cuda_aware() is True                    device buffers (after a stream sync)
    staged    otherwise (every PyPI MPI wheel)        pinned host segments, copies overlapped

MPIRING_DEBUG=1 says once per device and path which path device buffers take, and why.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mpiring.cuda_detection import CudaAwareness, cuda_aware, cuda_awareness
from mpiring.gpu.binding import bind_device

__all__ = ["bind_device", "cuda_aware", "cuda_awareness", "device_backend", "path_for"]

_backends: dict[tuple[int, str], Any] = {}


def path_for(awareness: CudaAwareness) -> str:
    """"direct" when device pointers may go to MPI, else "staged"."""
    return "direct" if awareness.aware else "staged"


def device_backend(x: Any) -> Any:
    """The backend for CuPy array `x`: its device, on the path the CUDA-awareness answer allows.

    The answer is re-read on every call (the environment override can change between calls, as
    the tests do); the backends, their streams and pinned pools are made once and kept.
    """
    awareness = cuda_awareness()
    device_id = int(x.device.id)
    path = path_for(awareness)
    backend = _backends.get((device_id, path))
    if backend is None:
        backend = _backends[(device_id, path)] = _make_backend(device_id, path)
        announce(device_id, backend, awareness)
    return backend


def _make_backend(device_id: int, path: str) -> Any:
    import cupy

    from mpiring.gpu.backend import CupyBackend, StagedCupyBackend
    from mpiring.gpu.engine import CupyCopyEngine

    engine = CupyCopyEngine(cupy, device_id)
    name = f"cupy (GPU {device_id})"
    if path == "direct":
        return CupyBackend(cupy, engine.device, engine, name=name)
    return StagedCupyBackend(cupy, engine.device, engine, name=name)


def announce(device_id: int, backend: Any, awareness: CudaAwareness) -> None:
    """Under MPIRING_DEBUG=1, say (once per device and path) which path device buffers take."""
    if os.environ.get("MPIRING_DEBUG") != "1":
        return
    detail = f", {backend.segment_bytes} B segments" if backend.staged else ""
    sys.stderr.write(f"mpiring: CuPy buffers on GPU {device_id} take the {backend.path} path "
                     f"({awareness.how}{detail})\n")
