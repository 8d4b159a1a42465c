"""mpiring: every MPI collective as a ring of mpi4py point-to-point messages.

    import mpiring
    comm = mpiring.Communicator()            # COMM_WORLD, or Communicator(any intracomm)
    total = comm.allreduce(x, op=mpiring.SUM)
"""

from mpiring.communicator import Communicator
from mpiring.cuda_detection import cuda_aware, cuda_awareness
from mpiring.errors import (
    ArgumentError,
    CollectiveMismatchError,
    CollectiveTimeout,
    CommunicationError,
    MpiringError,
)
from mpiring.gpu.binding import bind_device
from mpiring.ops import AVG, MAX, MIN, OPS, PROD, SUM
from mpiring.ring import Traffic

__version__ = "0.1.0"

__all__ = [
    "AVG", "MAX", "MIN", "OPS", "PROD", "SUM",
    "ArgumentError", "CollectiveMismatchError", "CollectiveTimeout", "CommunicationError", "Communicator",
    "MpiringError", "Traffic", "__version__", "bind_device", "cuda_aware", "cuda_awareness",
]
