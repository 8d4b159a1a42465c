"""torch tensors as the arrays mpiring's collectives run on, sharing their memory.

A CPU tensor becomes a NumPy array over its memory; a CUDA tensor a CuPy array (through
mpiring.interop, which loads CuPy). The NumPy arrays are mpiring.interop's stable views, one per
memory layout, looked up here by the tensor's own layout (address, dtype, shape, strides: a
fraction of a microsecond), so that the same tensor called twice is the same array to mpiring
and its call replays a plan. bfloat16 tensors become NumPy arrays of ml_dtypes' bfloat16, which
mpiring reduces in float32 (pip install ml_dtypes; 'mpiring[torch]' brings it).
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from mpiring import interop
from mpiring.errors import Unconverted

# Layouts seen lately, each with its stable view; dropped whole past this many (a long-lived
# program that keeps allocating new tensors must not grow it for ever)
_LAYOUTS = 4096
_host: dict[tuple, numpy.ndarray] = {}


def host_view(tensor: torch.Tensor, flat: bool = False) -> numpy.ndarray:
    """A NumPy array over a CPU tensor's memory (1-D with `flat`: the tensor must then be
    contiguous), the same object every time for the same memory layout. It does not keep the
    memory alive: for blocking calls, while the caller holds the tensor (see owned_view)."""
    key = (tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride(), flat)
    view = _host.get(key)
    if view is None:
        view = interop.stable(owned_view(tensor, flat))
        if len(_host) >= _LAYOUTS:
            _host.clear()
        _host[key] = view
    return view


def owned_view(tensor: torch.Tensor, flat: bool = False) -> numpy.ndarray:
    """A NumPy array over a CPU tensor's memory that keeps the tensor alive (for a call that may
    outlive the caller's reference: a nonblocking one); a new object every time."""
    if flat and not tensor.is_contiguous():
        raise ValueError("mpiring: this collective needs contiguous tensors (it reads and writes them as one "
                         "block): pass tensor.contiguous()")
    tensor = tensor.detach()  # the same memory; NumPy takes no tensor that requires grad
    if tensor.is_conj() or tensor.is_neg():
        raise ValueError("mpiring: a tensor with a lazy conjugate or negation bit is not plain memory: pass "
                         "tensor.resolve_conj() or tensor.resolve_neg()")
    if tensor.dtype is torch.bfloat16:
        view = tensor.view(torch.int16).numpy().view(_bfloat16())
    else:
        try:
            view = tensor.numpy()
        except TypeError as error:
            raise TypeError(f"mpiring: tensors of dtype {tensor.dtype} are not supported ({error})") from None
    return view.reshape(-1) if flat else view


def _bfloat16() -> numpy.dtype:
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("mpiring: bfloat16 tensors need ml_dtypes (pip install 'mpiring[torch]' or ml_dtypes)") \
            from None
    return numpy.dtype(ml_dtypes.bfloat16)


def view(tensor: torch.Tensor, flat: bool = False, owned: bool = False) -> Any:
    """The array mpiring runs on for `tensor`: on the CPU, host_view (owned_view with `owned`);
    on a GPU, a CuPy array (which keeps the tensor alive)."""
    if tensor.is_cpu:
        return owned_view(tensor, flat) if owned else host_view(tensor, flat)
    if tensor.is_cuda:
        if flat and not tensor.is_contiguous():
            raise ValueError("mpiring: this collective needs contiguous tensors: pass tensor.contiguous()")
        array = interop.native("torch.distributed", "tensor", tensor.detach(), writable=True)
        if isinstance(array, Unconverted):
            raise array.error
        return array.reshape(-1) if flat else array
    raise ValueError(f"mpiring: tensors on {tensor.device.type} are not supported (CPU and CUDA tensors are)")
