#!/usr/bin/env python3
"""A small character-level GPT in PyTorch, trained with DistributedDataParallel over the mpiring
backend and over gloo, or sharded with FSDP over mpiring (docs/pytorch-and-jax.md).

    mpirun -n 2 python examples/torch_ddp.py                     # DDP on mpiring and on gloo, step by step
    mpirun -n 2 python examples/torch_ddp.py --backend mpiring   # one of them
    mpirun -n 2 python examples/torch_ddp.py --overlap           # how much all-reduce time backward hides
    mpirun -n 2 python examples/torch_ddp.py --fsdp              # FSDP (fully_shard) on mpiring,
                                                                 # against one process on every rank's batches
    MPIRING_TORCH_PROGRESS=1 mpirun -n 2 python examples/torch_ddp.py --device gpu    # CUDA tensors (CuPy needed)

Each rank reads other windows of the text (Python's pydoc topics). The runs compared take their
steps in turn (one step of each, then the next), so other work on a shared machine slows them
alike. For each run it prints the
losses, tokens per second (all ranks together), and the time spent in gradient all-reduces:
a DDP communication hook times each bucket's all-reduce to completion (which makes gloo's
all-reduces wait as mpiring's do; --default-hook keeps DDP's own hook, untimed, for tokens/s
alone). Both backends start from the same weights and see the same data, so their losses agree
to rounding (the two sum in different orders; --dtype float64 makes the difference ~1e-15).

With --device gpu the models and batches live on each rank's GPU (ranks share GPUs round
robin). DDP then calls its hooks from autograd's device thread, which an mpiring group takes only
with its progress thread (MPIRING_TORCH_PROGRESS=1). The timings wait for the GPU: the timing
hook synchronizes before and after each all-reduce, and backward's end is taken after a
synchronize.

--overlap trains four models in turn: each backend with the timing hook (every all-reduce waited
for in the hook: nothing overlaps) and with an async hook (DDP's own, plus timestamps: the
bucket's all-reduce is launched and backward goes on). It prints, per backend, the backward
pass's time with each hook (loss.backward() returns once DDP has every bucket's result), and the
share of the all-reduce time hidden: (backward with the timing hook - backward with the async
hook) / (all-reduce time of the timing hook), the all-reduce time that disappeared from the step.
It also prints the exposed tail of the async runs: per step, from the launch of the last bucket
(its gradients are the last computed, so backward's compute is over) to the end of the last
all-reduce, which is what backward still waits for.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # also from a checkout

import mpiring  # noqa: E402, I001 - first: it sizes the BLAS thread pools before torch loads
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812
from mpiring.launch import local_ranks  # noqa: E402
from mpiring.training.data import default_text  # noqa: E402

import mpiring.torch  # noqa: E402, F401 - registers the "mpiring" backend


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(vocab, width), torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = torch.nn.LayerNorm(width), torch.nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batches(data: torch.Tensor, args: argparse.Namespace, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s windows at `step`: the same on every run, other ones on every rank."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    starts = torch.randint(0, len(data) - args.context - 1, (args.batch,), generator=g)
    x = torch.stack([data[s : s + args.context] for s in starts])
    y = torch.stack([data[s + 1 : s + args.context + 1] for s in starts])
    return x.to(args.device), y.to(args.device)


def build(args: argparse.Namespace, vocab: int) -> GPT:
    torch.manual_seed(args.seed)
    return GPT(vocab, args.context, args.width, args.layers, args.heads).to(args.device, args.dtype)


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work, so that a host clock reads when it is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timing_hook(group: dist.ProcessGroup, spent: list[float], device: torch.device):  # noqa: ANN201
    """A DDP communication hook: the bucket's mean over ranks, timed until it is done."""
    size = group.size()

    def hook(state, bucket):  # noqa: ANN001, ANN202 - DDP checks real annotations; this module's are text
        buffer = bucket.buffer()
        synchronize(device)  # the bucket's gradients computed: the time is the all-reduce's alone
        start = time.perf_counter()
        dist.all_reduce(buffer, group=group)
        buffer.div_(size)
        synchronize(device)
        spent[0] += time.perf_counter() - start
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(buffer)
        return future

    return hook


def async_hook(group: dist.ProcessGroup, log: list[tuple[float, float]]):  # noqa: ANN201
    """DDP's own all-reduce hook (the bucket divided by the ranks, all-reduced with async_op),
    logging each bucket's (launch, completion) times."""
    size = group.size()

    def hook(state, bucket):  # noqa: ANN001, ANN202
        buffer = bucket.buffer().div_(size)
        launched = time.perf_counter()

        def done(future):  # noqa: ANN001, ANN202 - runs where the backend completes the future
            log.append((launched, time.perf_counter()))
            return future.value()[0]

        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(done)

    return hook


class Run:
    """One model in training: its optimizer, losses, the seconds its timed steps took and their
    backward passes took, and (with async_hook's `log`) the exposed tail of its all-reduces."""

    def __init__(self, net: torch.nn.Module, args: argparse.Namespace, data_of,  # noqa: ANN001
                 log: list[tuple[float, float]] | None = None) -> None:
        self.net, self.data_of, self.log, self.device = net, data_of, log, args.device
        self.optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr)
        self.losses: list[float] = []
        self.seconds = self.backward_s = self.exposed_s = 0.0

    def step(self, step: int) -> None:
        start = time.perf_counter()
        x, y = self.data_of(step)
        loss = F.cross_entropy(self.net(x).flatten(0, 1).float(), y.flatten())
        self.optimizer.zero_grad(set_to_none=True)
        if self.log is not None:
            self.log.clear()
        backward = time.perf_counter()
        loss.backward()
        synchronize(self.device)
        ended = time.perf_counter()
        self.optimizer.step()
        self.losses.append(loss.item())
        if step > 0:  # step 0 warms up (first plans, allocations): not timed
            self.seconds += time.perf_counter() - start
            self.backward_s += ended - backward
            if self.log:
                self.exposed_s += max(done for _, done in self.log) - max(launched for launched, _ in self.log)


def train(runs: list[Run], steps: int) -> None:
    """Step every run in turn (interleaved, so a machine shared with other work slows all alike)."""
    for step in range(steps + 1):
        for run in runs:
            dist.barrier()
            run.step(step)


def ddp_runs(args: argparse.Namespace, groups: dict, data: torch.Tensor, vocab: int) -> list[dict]:
    """Every (backend, hook) run, trained in turn: the timing hook, DDP's own (--default-hook), or
    both the timing hook and async_hook (--overlap)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    hooks = ("timing", "async") if args.overlap else ("own",) if args.default_hook else ("timing",)
    runs, results = [], []
    for name, group in groups.items():
        for hook in hooks:
            net = torch.nn.parallel.DistributedDataParallel(
                build(args, vocab), process_group=group, bucket_cap_mb=args.bucket_mb,
                device_ids=None if args.device.type == "cpu" else [args.device])
            spent, log = [0.0], [] if hook == "async" else None
            if hook == "timing":
                net.register_comm_hook(None, timing_hook(group, spent, args.device))
            elif hook == "async":
                net.register_comm_hook(None, async_hook(group, log))
            runs.append(Run(net, args, lambda step: batches(data, args, rank, step), log))
            results.append({"name": name, "hook": hook, "spent": spent})
    train(runs, args.steps)
    tokens = args.steps * args.batch * args.context * size
    for result, run in zip(results, runs, strict=True):
        comm_s = result.pop("spent")[0] * args.steps / (args.steps + 1) if result["hook"] == "timing" else None
        result.update(losses=run.losses, tokens_per_s=tokens / run.seconds, seconds=run.seconds, comm_s=comm_s,
                      backward_s=run.backward_s, exposed_s=run.exposed_s if run.log is not None else None)
    return results


def report_overlap(runs: list[dict]) -> None:
    """Per backend: the share of the timing hook's all-reduce time that the async hook hid."""
    for name in dict.fromkeys(run["name"] for run in runs):
        timed, overlapped = (next(r for r in runs if r["name"] == name and r["hook"] == hook)
                             for hook in ("timing", "async"))
        hidden = (timed["backward_s"] - overlapped["backward_s"]) / timed["comm_s"]
        print(f"  {name:8s} backward {timed['backward_s']:.3f} s (timing hook, all-reduce {timed['comm_s']:.3f} s) "
              f"-> {overlapped['backward_s']:.3f} s (async hook): {100 * hidden:.0f}% of the all-reduce time hidden; "
              f"exposed tail {overlapped['exposed_s']:.3f} s ({100 * overlapped['exposed_s'] / timed['comm_s']:.0f}% "
              "of it)")


def fsdp_run(args: argparse.Namespace, data: torch.Tensor, vocab: int) -> None:
    from torch.distributed.fsdp import fully_shard

    rank, size = dist.get_rank(), dist.get_world_size()
    net = build(args, vocab)
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)

    def everyone(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [batches(data, args, k, step) for k in range(size)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    sharded = Run(net, args, lambda step: batches(data, args, rank, step))
    # one process, every rank's windows at once: the same mean gradient
    alone = Run(build(args, vocab), args, everyone)
    train([sharded, alone], args.steps)
    mean = torch.tensor(sharded.losses, dtype=torch.float64)  # each rank's loss is on its own windows
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    losses, seconds, alone_losses, alone_seconds = mean.tolist(), sharded.seconds, alone.losses, alone.seconds
    worst = 0.0
    for piece, single in zip(net.parameters(), alone.net.parameters(), strict=True):
        shards = [None] * size
        dist.all_gather_object(shards, piece.to_local().detach().cpu())
        worst = max(worst, (torch.cat(shards) - single.detach().cpu()).abs().max().item())
    if rank == 0:
        tokens = args.steps * args.batch * args.context * size
        print(f"FSDP over mpiring, {size} ranks: loss (mean over ranks) {losses[0]:.4f} -> {losses[-1]:.4f}, "
              f"{tokens / seconds:,.0f} tokens/s")
        print(f"one process, same {args.batch * size} windows per step: loss {alone_losses[0]:.4f} -> "
              f"{alone_losses[-1]:.4f}, {tokens / alone_seconds:,.0f} tokens/s")
        print(f"largest parameter difference after {args.steps + 1} steps: {worst:.3g}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("both", "mpiring", "gloo"), default="both")
    p.add_argument("--fsdp", action="store_true", help="FSDP over mpiring against one process (no DDP runs)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=16, help="windows per rank per step")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where the models train: gpu puts each rank on a CUDA GPU (mpiring.bind_device; CuPy needed)")
    p.add_argument("--default-hook", action="store_true", help="DDP's own all-reduce hook (not timed)")
    p.add_argument("--bucket-mb", type=float, default=None, help="DDP's bucket_cap_mb (default: DDP's own)")
    p.add_argument("--overlap", action="store_true",
                   help="each backend with the timing hook and an async hook: the all-reduce time backward hides")
    args = p.parse_args()
    args.dtype = getattr(torch, args.dtype)
    if args.device == "gpu":
        if not torch.cuda.is_available():
            p.error("--device gpu: torch finds no CUDA device here")
        try:
            args.device = torch.device("cuda", mpiring.bind_device())
        except ImportError as error:
            p.error(f"--device gpu needs CuPy ({error}): pip install 'mpiring[gpu]'")
        torch.cuda.set_device(args.device)
    else:
        args.device = torch.device("cpu")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_ranks())))

    dist.init_process_group("mpiring")
    text = default_text()
    alphabet = sorted(set(text))
    data = torch.tensor([alphabet.index(c) for c in text[:200_000]], dtype=torch.long)
    if args.fsdp:
        fsdp_run(args, data, len(alphabet))
        dist.destroy_process_group()
        return
    groups = {"mpiring": dist.group.WORLD}  # the default group: this backend
    if args.backend in ("both", "gloo"):
        groups["gloo"] = dist.new_group(backend="gloo")
    runs = ddp_runs(args, {name: group for name, group in groups.items() if args.backend in ("both", name)}, data,
                    len(alphabet))
    if dist.get_rank() == 0:
        print(f"DDP, {dist.get_world_size()} ranks on {args.device.type}, {args.batch} x {args.context} tokens per "
              f"rank per step, {args.steps} timed steps, torch {torch.__version__}, mpiring {mpiring.__version__}")
        for run in runs:
            comm = "" if run["comm_s"] is None else (f", all-reduce {run['comm_s']:.2f} s of {run['seconds']:.2f} s "
                                                     f"({100 * run['comm_s'] / run['seconds']:.0f}%)")
            print(f"  {run['name']:8s} {run['hook']:6s} hook: loss {run['losses'][0]:.4f} -> "
                  f"{run['losses'][-1]:.4f}, {run['tokens_per_s']:,.0f} tokens/s{comm}")
        if len({run["name"] for run in runs}) == 2:
            diff = max(abs(a - b) for mine, theirs in zip(runs[: len(runs) // 2], runs[len(runs) // 2 :], strict=True)
                       for a, b in zip(mine["losses"], theirs["losses"], strict=True))
            scale = max(abs(v) for v in runs[0]["losses"])
            print(f"  largest loss difference mpiring vs gloo: {diff:.3g} ({diff / scale:.2g} relative)"
                  + ("" if math.isfinite(diff) else " (not finite!)"))
        if args.overlap:
            report_overlap(runs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
