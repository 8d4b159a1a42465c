"""Where the benchmark's buffers live: NumPy on the host (`--device cpu`) or CuPy on a GPU
(`--device gpu`).

On a GPU, mpiring gets device arrays. The native collective and the point-to-point ceiling
get device arrays too when the MPI library is CUDA-aware; otherwise they run on host buffers
(handing a device pointer to an MPI built without CUDA can segfault), and the report says so:
their times are then what MPI does with host memory, a reference rather than a like-for-like
race. `MPIRING_CUDA_AWARE=1` or `=0` overrides the detection.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

import numpy
from mpi4py import MPI

from mpiring.bench.options import UsageError


@dataclass(frozen=True)
class Device:
    """The array modules for mpiring's buffers (`xp`) and for native MPI's (`native_xp`)."""

    name: str
    xp: Any
    native_xp: Any
    note: str  # how the native collective's buffers relate to mpiring's, for the report

    def synchronize(self) -> None:
        """Wait until queued device work is done: MPI must see finished data, timers finished work."""
        if self.xp is not numpy:
            self.xp.cuda.get_current_stream().synchronize()

    def to_host(self, a: Any) -> numpy.ndarray:
        return a if isinstance(a, numpy.ndarray) else self.xp.asnumpy(a)

    def put(self, xp: Any, host: numpy.ndarray) -> Any:
        """Host data as an array of module `xp`."""
        return host if xp is numpy else xp.asarray(host)


def open_device(name: str, world: MPI.Intracomm) -> Device:
    """The device for `--device name`. Collective over `world`: every rank agrees or all raise."""
    if name == "cpu":
        return Device("cpu", numpy, numpy, "host buffers")
    problem = None
    try:
        import cupy

        if not cupy.is_available():
            problem = "CuPy finds no usable CUDA GPU on this node"
    except ImportError as error:
        cupy, problem = None, f"CuPy is not installed ({error}); install e.g. cupy-cuda12x"
    problems = world.allgather(problem)
    failed = [(rank, text) for rank, text in enumerate(problems) if text]
    if failed:
        rank, text = failed[0]
        raise UsageError(f"--device gpu: rank {rank}: {text}")
    # One GPU per rank on each node, round robin over the node's GPUs.
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    cupy.cuda.Device(local.Get_rank() % cupy.cuda.runtime.getDeviceCount()).use()
    local.Free()
    if world.allreduce(mpi_is_cuda_aware(), op=MPI.LAND):
        return Device("gpu", cupy, cupy, "device buffers (CUDA-aware MPI)")
    return Device("gpu", cupy, numpy, "host buffers: MPI is not CUDA-aware")


def mpi_is_cuda_aware() -> bool:
    """Whether the loaded MPI library can take CUDA device pointers (call after MPI init).

    Asks the library through its own extension (mpi4py has no call for it): Open MPI's
    MPIX_Query_cuda_support, MPICH's MPIX_GPU_query_support. Unknown libraries count as not aware.
    """
    override = os.environ.get("MPIRING_CUDA_AWARE")
    if override is not None:
        return override.strip().lower() not in ("", "0", "no", "false")
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "/libmpi" in line})
    for path in paths:
        library = ctypes.CDLL(path)
        if "Open MPI" in MPI.Get_library_version() and hasattr(library, "MPIX_Query_cuda_support"):
            return bool(library.MPIX_Query_cuda_support())
        if hasattr(library, "MPIX_GPU_query_support"):  # MPICH >= 4; 0 = MPIX_GPU_SUPPORT_CUDA
            flag = ctypes.c_int(0)
            return library.MPIX_GPU_query_support(0, ctypes.byref(flag)) == 0 and bool(flag.value)
    return False
