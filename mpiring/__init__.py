"""mpiring: every MPI collective as a ring of mpi4py point-to-point messages.

    import mpiring
    comm = mpiring.Communicator()            # COMM_WORLD, or Communicator(any intracomm)
    total = comm.allreduce(x, op=mpiring.SUM)
"""

from mpiring.communicator import Communicator
from mpiring.errors import (
    ArgumentError,
    CollectiveMismatchError,
    CommunicationError,
    MpiringError,
)
from mpiring.ops import AVG, MAX, MIN, OPS, PROD, SUM
from mpiring.ring import Traffic

__version__ = "0.1.0"

__all__ = [
    "AVG", "MAX", "MIN", "OPS", "PROD", "SUM",
    "ArgumentError", "CollectiveMismatchError", "CommunicationError", "Communicator",
    "MpiringError", "Traffic", "__version__",
]
