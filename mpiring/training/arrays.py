"""The array module a run computes with: NumPy on the CPU, CuPy on a GPU."""

from __future__ import annotations

from typing import Any

import numpy

from mpiring.training.errors import TrainingError


def array_module(device: str) -> Any:
    """NumPy for "cpu"; CuPy for "gpu", or a TrainingError saying why it cannot be used."""
    if device == "cpu":
        return numpy
    if device != "gpu":
        raise TrainingError(f"unknown device {device!r} (expected cpu or gpu)")
    try:
        import cupy
    except ImportError:
        raise TrainingError("--device gpu needs CuPy (pip install cupy-cuda12x), which is not installed") from None
    if not cupy.is_available():
        raise TrainingError("--device gpu: CuPy is installed but finds no usable CUDA GPU on this machine")
    from mpiring.backend import backend_for

    if backend_for(cupy.zeros(1)).xp is not cupy:
        raise TrainingError(
            "--device gpu: this mpiring's collectives move NumPy arrays only; GPU buffers need its "
            "CuPy backend (docs/gpu.md)"
        )
    return cupy


def to_host(array: Any) -> numpy.ndarray:
    """A NumPy copy (or view) of a NumPy or CuPy array."""
    return array.get() if hasattr(array, "get") and not isinstance(array, numpy.ndarray) else numpy.asarray(array)
