"""The training run losing ranks, for tests/test_lost_rank.py, run as

    mpiexec -disable-auto-cleanup -n 4 python tests/elastic_training.py elastic DIR
    mpiexec -n 3 python tests/elastic_training.py reference DIR

elastic: 4 ranks train with checkpoints every 4 steps; world rank 2 leaves after step 6 and
world rank 0 (rank 0 itself) after step 10 (os._exit). The survivors shrink, reload the newest
checkpoint and go on: to step 12 on 2 ranks. Rank 0 of the last communicator prints the losses.

reference: fresh runs resumed from copies of the checkpoints the elastic run went on from, on
the ranks it went on with: step 4 on 3 ranks (to step 8), step 8 on 2 ranks (to step 12).
Each prints its losses ("RESULT <json>").
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from mpi4py import MPI

import mpiring
from mpiring.training import TrainConfig, train

TEXT = "The ring all-reduce sends every byte twice around the ring. " * 20
LEAVES = {2: 6, 0: 10}  # world rank: the step after which it leaves


def config(directory: str, steps: int, **more: object) -> TrainConfig:
    return TrainConfig(strategy="zero3", model="mlp", steps=steps, dtype="float64", context=3, embed=5, hidden=7,
                       layers=2, batch_size=12, log_every=0, sample_chars=0, checkpoint_dir=directory,
                       checkpoint_every=4, **more)


def elastic(directory: str) -> None:
    comm = mpiring.Communicator(survive=True)
    me = comm.rank

    def progress(step: int, steps: int, loss: float) -> None:
        if LEAVES.get(me) == step:
            os._exit(7)

    result = train(config(os.path.join(directory, "elastic"), 12, elastic=True), comm, TEXT, progress=progress)
    if result.strategy.comm.rank == 0:
        print("RESULT " + json.dumps({"losses": result.losses, "recoveries": result.recoveries,
                                      "size": result.strategy.comm.size}), flush=True)


def reference(directory: str) -> None:
    world = MPI.COMM_WORLD
    results = {}
    for start, ranks, steps in ((4, 3, 8), (8, 2, 12)):
        copy = os.path.join(directory, f"from-{start}")
        if world.Get_rank() == 0:
            shutil.copytree(os.path.join(directory, "elastic", f"step-{start:08d}"),
                            os.path.join(copy, f"step-{start:08d}"))
        world.Barrier()
        part = world.Split(0 if world.Get_rank() < ranks else MPI.UNDEFINED)
        if part != MPI.COMM_NULL:
            with mpiring.Communicator(part) as comm:
                result = train(config(copy, steps, resume=True), comm, TEXT)
                results[start] = result.losses
            part.Free()
        world.Barrier()
    if world.Get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    {"elastic": elastic, "reference": reference}[sys.argv[1]](sys.argv[2])
