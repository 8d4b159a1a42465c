"""Stand-ins for other libraries' arrays, as mpiring sees them: objects that offer their memory
through DLPack or the CUDA array interface alone (no buffer protocol), as torch's CPU tensors,
JAX arrays and device arrays do."""

from __future__ import annotations

import numpy as np


class DLPackOnly:
    """Host memory offered through DLPack and nothing else."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class LegacyDLPack(DLPackOnly):
    """A DLPack exporter that takes none of the newer keywords (as mpi4py's own test helpers), so
    NumPy cannot import it."""

    def __dlpack__(self):
        return self.array.__dlpack__()


class DeviceOnly:
    """A buffer offered through the CUDA array interface alone."""

    __cuda_array_interface__ = {"shape": (2,), "typestr": "<f8", "data": (0, False), "version": 3}
