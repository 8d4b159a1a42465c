"""torch.distributed on mpiring: `import mpiring.torch` registers the backend "mpiring".

    import torch.distributed as dist
    import mpiring.torch                   # registers the backend (and, under mpirun, env://'s variables)
    dist.init_process_group("mpiring")     # under mpirun -n N python train.py
    model = torch.nn.parallel.DistributedDataParallel(model)

With survival on (MPIRING_SURVIVE=1), a collective raises mpiring.RankLostError on every survivor
when a rank is lost, and `mpiring.torch.shrink_process_group()` makes the default group again on
the survivors (docs/lost-rank.md).

CPU tensors run on mpiring's host collectives, CUDA tensors on its device paths (through CuPy).
Tested with torch 2.13.0 (the version 'mpiring[torch]' installs). Importing this module is
collective when MASTER_ADDR or MASTER_PORT is unset (mpiring.torch.rendezvous): every rank
imports it, as every rank runs the same program. Nothing else in mpiring imports torch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mpiring.torch.factory import BACKEND, create, shrink_process_group
from mpiring.torch.process_group import ProcessGroupMpiring
from mpiring.torch.rendezvous import fill_environment

if int(torch.__version__.split(".")[0]) < 2:
    raise ImportError(f"mpiring.torch needs torch 2 (tested with 2.13.0), found {torch.__version__}")
if not dist.is_available():
    raise ImportError("mpiring.torch needs a torch built with torch.distributed")

if BACKEND not in dist.Backend.backend_list:  # a second import registers nothing
    dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu", "cuda"])
fill_environment()

__all__ = ["BACKEND", "ProcessGroupMpiring", "create", "fill_environment", "shrink_process_group"]
