"""mpiring: MPI's collectives from mpi4py point-to-point messages (rings, trees and more).

    import mpiring
    comm = mpiring.Communicator()            # COMM_WORLD, or Communicator(any intracomm)
    total = comm.allreduce(x, op=mpiring.SUM)
"""

from mpiring.launch import share_cores_among_local_ranks

# Under a launcher, before NumPy loads its BLAS: each rank's thread pool gets its share of the
# node's cores, not all of them (unless the thread variables are set; see the function).
share_cores_among_local_ranks()

from mpiring import backend, gpu  # noqa: E402
from mpiring.communicator import Communicator  # noqa: E402
from mpiring.cuda_detection import cuda_aware, cuda_awareness  # noqa: E402
from mpiring.engine.transport import Traffic  # noqa: E402
from mpiring.errors import (  # noqa: E402
    ArgumentError,
    ArgumentTypeError,
    CollectiveMismatchError,
    CollectiveTimeout,
    CommunicationError,
    CommunicatorBrokenError,
    CommunicatorFreedError,
    CommunicatorRevokedError,
    ConcurrentUseError,
    MessageMismatchError,
    MpiringError,
    RankLostError,
)
from mpiring.gpu.binding import bind_device  # noqa: E402
from mpiring.host_memory import empty  # noqa: E402
from mpiring.ops import AVG, BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MIN, OPS, PROD, SUM  # noqa: E402

# The composition root: the core finds a device array's backend through this hook and never
# imports gpu/ (which imports CuPy only once a CuPy array reaches a collective).
backend.register_device_backend(gpu.device_backend)

__version__ = "0.2.0"  # CHANGELOG.md says what changed in each version

__all__ = [
    "AVG", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR", "MAX", "MIN", "OPS", "PROD", "SUM",
    "ArgumentError", "ArgumentTypeError", "CollectiveMismatchError", "CollectiveTimeout", "CommunicationError",
    "Communicator", "CommunicatorBrokenError", "CommunicatorFreedError", "ConcurrentUseError",
    "CommunicatorRevokedError", "MessageMismatchError", "MpiringError", "RankLostError",
    "Traffic", "__version__", "bind_device", "cuda_aware", "cuda_awareness", "empty",
]
