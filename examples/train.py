#!/usr/bin/env python3
"""Train a small character-level language model with DDP or ZeRO-1/2/3 on mpiring's collectives.

    mpirun -n 8 python examples/train.py                      # ZeRO-3 on 8 ranks
    mpirun -n 4 python examples/train.py --strategy ddp --report ddp.json --plot ddp.png
    mpiexec -disable-auto-cleanup -n 4 python examples/train.py --elastic --checkpoint-dir ckpt --checkpoint-every 50

The same as the installed `mpiring-train` command: mpiring/train.py has the flags, docs/training.md the rest.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # also from an uninstalled checkout

from mpiring.train import run  # noqa: E402

if __name__ == "__main__":
    sys.exit(run())
