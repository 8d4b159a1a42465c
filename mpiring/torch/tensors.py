"""torch tensors as the arrays mpiring's collectives run on, sharing their memory.

A CPU tensor becomes a NumPy array over its memory (`tensor.numpy()`: under a microsecond, and
it keeps the tensor's memory alive while mpiring holds it); a CUDA tensor a CuPy array (through
mpiring.interop, which loads CuPy). The engine finds a call's schedule by the layout of its
arrays, so a new view per call replays the schedule of the calls before it. bfloat16 tensors
become NumPy arrays of ml_dtypes' bfloat16, which mpiring reduces in float32 (pip install
ml_dtypes; 'mpiring[torch]' brings it).
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from mpiring import interop
from mpiring.errors import Unconverted


def host_view(tensor: torch.Tensor, flat: bool = False) -> numpy.ndarray:
    """A NumPy array over a CPU tensor's memory (1-D with `flat`: the tensor must then be
    contiguous)."""
    if tensor.dtype is torch.bfloat16 or tensor.requires_grad or tensor.is_conj() or tensor.is_neg():
        view = _unusual(tensor)
    else:
        try:
            view = tensor.numpy()
        except TypeError as error:
            raise TypeError(f"mpiring: tensors of dtype {tensor.dtype} are not supported ({error})") from None
    if flat:
        if not tensor.is_contiguous():
            raise ValueError("mpiring: this collective needs contiguous tensors (it reads and writes them as "
                             "one block): pass tensor.contiguous()")
        return view.reshape(-1)
    return view


def _unusual(tensor: torch.Tensor) -> numpy.ndarray:
    """host_view of a bfloat16 tensor, or one that requires grad, or one with a lazy bit."""
    if tensor.is_conj() or tensor.is_neg():
        raise ValueError("mpiring: a tensor with a lazy conjugate or negation bit is not plain memory: pass "
                         "tensor.resolve_conj() or tensor.resolve_neg()")
    tensor = tensor.detach()  # the same memory; NumPy takes no tensor that requires grad
    if tensor.dtype is torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(_bfloat16())
    return tensor.numpy()


def _bfloat16() -> numpy.dtype:
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("mpiring: bfloat16 tensors need ml_dtypes (pip install 'mpiring[torch]' or ml_dtypes)") \
            from None
    return numpy.dtype(ml_dtypes.bfloat16)


def view(tensor: torch.Tensor, flat: bool = False) -> Any:
    """The array mpiring runs on for `tensor`: host_view on the CPU, a CuPy array on a GPU."""
    if tensor.is_cpu:
        return host_view(tensor, flat)
    if tensor.is_cuda:
        if flat and not tensor.is_contiguous():
            raise ValueError("mpiring: this collective needs contiguous tensors: pass tensor.contiguous()")
        array = interop.native("torch.distributed", "tensor", tensor.detach(), writable=True)
        if isinstance(array, Unconverted):
            raise array.error
        return array.reshape(-1) if flat else array
    raise ValueError(f"mpiring: tensors on {tensor.device.type} are not supported (CPU and CUDA tensors are)")
