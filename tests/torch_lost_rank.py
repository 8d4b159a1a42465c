"""A rank lost inside torch.distributed's all_reduce on the "mpiring" backend, for
tests/test_lost_rank.py, run as

    MPIRING_SURVIVE=1 mpiexec -disable-auto-cleanup -n K python tests/torch_lost_rank.py VICTIM DIR

Every rank all-reduces in a loop; world rank VICTIM leaves (os._exit from a timer thread) inside
it. Each survivor catches the error, calls mpiring.torch.shrink_process_group(), and checks
all_reduce, broadcast (from the first and the last rank), all_gather and a new_group's all_reduce
on the new default group against NumPy on inputs regenerated from the world ranks. Each survivor
prints "RESULT <json>" with what it saw (and time.time() values: when the error came, when the
new group was made, when its first all_reduce returned).
"""

from __future__ import annotations

import faulthandler
import json
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
from lost_rank_scenarios import GUARD_SECONDS, inputs, leave

import mpiring.torch

SIZE = 20000


def same(tensor: torch.Tensor, want: np.ndarray) -> bool:
    return bool(np.array_equal(tensor.numpy(), want))


def main() -> None:
    victim, directory = int(sys.argv[1]), sys.argv[2]
    faulthandler.dump_traceback_later(40.0)  # where a hang is
    dist.init_process_group("mpiring")
    me, size = dist.get_rank(), dist.get_world_size()  # world ranks: the default group is MPI's world
    members = [w for w in range(size) if w != victim]
    record: dict = {"world": me, "calls": 0, "wrong": 0, "error": None, "lost": None}
    x = torch.from_numpy(inputs(me, "allreduce", SIZE, size))
    want = np.sum([inputs(w, "allreduce", SIZE, size) for w in range(size)], axis=0)
    if me == victim:
        threading.Timer(0.05, leave, (directory, 0)).start()
    began = time.monotonic()
    try:
        while time.monotonic() - began < GUARD_SECONDS:
            y = x.clone()
            dist.all_reduce(y)
            record["calls"] += 1
            record["wrong"] += not same(y, want)  # data came back, and it is not the sum
    except Exception as error:  # noqa: BLE001 - the test checks which one it was
        record["t_error"] = time.time()
        record["error"] = type(error).__name__
        record["lost"] = getattr(error, "lost", None)
    group = mpiring.torch.shrink_process_group()
    record["t_shrunk"] = time.time()
    rank, n = dist.get_rank(), dist.get_world_size()
    record["rank"], record["size"] = rank, n
    record["default"] = group is dist.group.WORLD
    xs = [inputs(w, "allreduce", SIZE, n) for w in members]
    mine = torch.from_numpy(xs[rank].copy())
    y = mine.clone()
    dist.all_reduce(y)
    record["t_first"] = time.time()
    checks = {"all_reduce": same(y, np.sum(xs, axis=0))}
    for root in (0, n - 1):
        y = mine.clone()
        dist.broadcast(y, src=root)
        checks[f"broadcast_{root}"] = same(y, xs[root])
    gathered = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(gathered, mine)
    checks["all_gather"] = same(torch.stack(gathered), np.stack(xs))
    pair = dist.new_group([0, 1])
    if rank < 2:
        y = mine.clone()
        dist.all_reduce(y, group=pair)
        checks["new_group"] = same(y, xs[0] + xs[1])
    record["checks"] = checks
    print("RESULT " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
