"""Where the benchmark's buffers live: NumPy on the host (`--device cpu`) or CuPy on a GPU
(`--device gpu`).

On a GPU, mpiring gets device arrays. The native collective and the point-to-point ceiling
get device arrays too when the MPI library is CUDA-aware; otherwise they run on host buffers
(handing a device pointer to an MPI built without CUDA can segfault), and the report says so:
their times are then what MPI does with host memory, a reference rather than a like-for-like
race. `MPIRING_CUDA_AWARE=1` or `=0` overrides the detection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy
from mpi4py import MPI

from mpiring import bind_device, cuda_aware, host_memory
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

    def empty(self, xp: Any, count: int, dtype: numpy.dtype) -> Any:
        """A new buffer of module `xp`. Host buffers of mpiring and of the MPI library alike come
        from mpiring.host_memory: which pages a buffer has changes what MPI costs."""
        return host_memory.empty(count, dtype) if xp is numpy else xp.empty(count, dtype)

    def put(self, xp: Any, host: numpy.ndarray) -> Any:
        """Host data as a new array of module `xp`."""
        if xp is not numpy:
            return xp.asarray(host)
        array = host_memory.empty(host.shape, host.dtype)
        array[...] = host
        return array


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
    bind_device(world)  # one GPU per node-local rank, as mpiring's own collectives expect
    if world.allreduce(cuda_aware(), op=MPI.LAND):
        return Device("gpu", cupy, cupy, "device buffers (CUDA-aware MPI)")
    return Device("gpu", cupy, numpy, "host buffers: MPI is not CUDA-aware")
