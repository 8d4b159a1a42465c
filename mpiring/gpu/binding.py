"""Which GPU each rank uses: one per rank by node-local rank, round robin when ranks outnumber GPUs.

    local rank = rank within Split_type(COMM_TYPE_SHARED)   (the ranks on this node)
    device     = local rank % visible device count

The device count is what the CUDA runtime sees, so CUDA_VISIBLE_DEVICES is respected: device i
is the i-th entry of that list. Several ranks sharing one GPU is fine (the lent test machines
have one): each gets its own streams and pinned buffers.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from mpi4py import MPI


@dataclass(frozen=True)
class Binding:
    """Where one rank runs: for `mpiring info` and logs."""

    rank: int
    host: str
    local_rank: int
    local_size: int
    device: int | None  # index among the visible devices; None without a usable GPU
    physical: str | None  # the CUDA_VISIBLE_DEVICES entry (or the index when it is unset)
    pci_bus_id: str | None = None

    def describe(self) -> str:
        where = f"rank {self.rank}: host {self.host}, local rank {self.local_rank}/{self.local_size}"
        if self.device is None:
            return f"{where}, no GPU"
        physical = "" if self.physical == str(self.device) else f" (CUDA_VISIBLE_DEVICES entry {self.physical})"
        bus = f", PCI {self.pci_bus_id}" if self.pci_bus_id else ""
        return f"{where}, GPU {self.device}{physical}{bus}"


def node_local_rank(comm: MPI.Intracomm) -> tuple[int, int]:
    """This rank's index among the ranks of comm on the same node, and their number (collective)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def choose_device(local_rank: int, device_count: int) -> int:
    """The device index for a node-local rank: round robin over the visible devices."""
    if device_count < 1:
        raise RuntimeError("no CUDA device is visible to this rank (check CUDA_VISIBLE_DEVICES)")
    return local_rank % device_count


def visible_devices(environ: dict[str, str] | None = None) -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES, or None when it is unset (every device is visible)."""
    text = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    return [entry.strip() for entry in text.split(",") if entry.strip()]


def physical_device(index: int, visible: list[str] | None) -> str:
    """How the node names visible device `index`: its CUDA_VISIBLE_DEVICES entry, else the index."""
    if visible and index < len(visible):
        return visible[index]
    return str(index)


def bind_device(comm: MPI.Intracomm | None = None) -> int:
    """Make the GPU for this rank CuPy's current device and return its index (collective over comm).

    Call it on every rank before allocating CuPy arrays: arrays live on the device that was
    current when they were made, and mpiring runs each collective on its input's device.
    """
    import cupy

    local_rank, _ = node_local_rank(MPI.COMM_WORLD if comm is None else comm)
    device = choose_device(local_rank, cupy.cuda.runtime.getDeviceCount())
    cupy.cuda.Device(device).use()
    return device


def describe_binding(comm: MPI.Intracomm, cupy: Any | None) -> Binding:
    """Bind (when a GPU is usable) and describe this rank; collective over comm."""
    local_rank, local_size = node_local_rank(comm)
    device = physical = bus = None
    if cupy is not None and cupy.is_available():
        device = choose_device(local_rank, cupy.cuda.runtime.getDeviceCount())
        cupy.cuda.Device(device).use()
        physical = physical_device(device, visible_devices())
        try:
            bus = cupy.cuda.Device(device).pci_bus_id
        except Exception:  # informational only
            bus = None
    return Binding(comm.Get_rank(), socket.gethostname(), local_rank, local_size, device, physical, bus)
