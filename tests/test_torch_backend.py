"""torch.distributed on the "mpiring" backend (mpiring.torch): every collective DDP and FSDP use,
on CPU tensors of every supported dtype, blocking and async, against NumPy on regenerated inputs;
in place and zero-copy (data_ptr() unchanged, the view over the tensor's own memory);
DistributedDataParallel's losses equal to the same training on gloo; FSDP's parameters equal to
a one-process run of the same steps. CUDA tensors: skipped without a GPU. World sizes 1-4."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI
from oracles import all_inputs, assert_same, numpy_reduce, op_valid, rank_input

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpiring[torch]')")
import torch.distributed as dist  # noqa: E402

import mpiring.torch  # noqa: E402
from mpiring.torch.tensors import host_view  # noqa: E402

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N, RANK = WORLD.Get_size(), WORLD.Get_rank()

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
TORCH_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
             "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT, "band": dist.ReduceOp.BAND,
             "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
# ops torch.distributed itself takes on complex tensors (it reduces their real view)
COMPLEX_OPS = ("sum", "avg")


@pytest.fixture(scope="module", autouse=True)
def world():
    dist.init_process_group("mpiring")
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo(world):
    return dist.new_group(backend="gloo")


def tensor(seed: int, shape, dtype: str, op: str = "sum", rank: int = RANK):
    return torch.from_numpy(rank_input(seed, rank, shape, dtype, op).copy())


def cases():
    for dtype in DTYPES:
        for op in TORCH_OPS:
            kind = np.dtype(dtype).kind
            if not op_valid(op, np.dtype(dtype)) or (kind == "c" and op not in COMPLEX_OPS):
                continue
            if kind == "b" and op in ("avg", "prod"):  # sums of bools are ors; avg has no bool meaning
                continue
            yield dtype, op


@pytest.mark.parametrize("dtype,op", list(cases()))
@pytest.mark.parametrize("async_op", [False, True])
def test_all_reduce_every_dtype_and_op(dtype, op, async_op):
    t = tensor(10, (3, 4), dtype, op)
    ptr = t.data_ptr()
    work = dist.all_reduce(t, op=TORCH_OPS[op], async_op=async_op)
    if async_op:
        work.wait()
        assert work.is_completed()
    want = numpy_reduce(op, all_inputs(10, N, (3, 4), dtype, op))
    if dtype == "bool" and op == "sum":
        want = numpy_reduce("lor", all_inputs(10, N, (3, 4), dtype, op))
    assert t.data_ptr() == ptr  # in place, in the tensor's own memory
    if np.dtype(dtype).kind in "fc" and op == "avg":
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-3)
    else:
        assert_same(t.numpy(), want, f"all_reduce {op} {dtype}")


def test_views_are_the_tensors_memory():
    t = torch.arange(8.0)
    assert host_view(t).__array_interface__["data"][0] == t.data_ptr()
    half = t[4:]
    assert host_view(half).__array_interface__["data"][0] == half.data_ptr()
    assert host_view(t.reshape(2, 4)[:, 1]).strides == (4 * t.element_size(),)  # strided, not copied


def test_repeated_calls_replay_a_plan():
    t = torch.ones(16)
    for _ in range(3):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    x = host_view(t)
    assert dist.group.WORLD.comm.plan_of("allreduce", x, x, op="max") is not None


@pytest.mark.parametrize("dtype", ["float32", "int64", "bfloat16"])
def test_broadcast_reduce_and_bfloat16(dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="bfloat16 tensors need ml_dtypes")
        t = tensor(11, (5,), "float32").to(torch.bfloat16)
        dist.all_reduce(t)
        want = sum(tensor(11, (5,), "float32", rank=k).to(torch.bfloat16).float() for k in range(N))
        assert torch.equal(t.float(), want.to(torch.bfloat16).float())
        return
    for root in range(N):
        t = tensor(12 + root, (2, 3), dtype)
        dist.broadcast(t, src=root)
        assert_same(t.numpy(), rank_input(12 + root, root, (2, 3), dtype), "broadcast")
        t = tensor(20 + root, (4,), dtype)
        dist.reduce(t, dst=root)
        if RANK == root:
            assert_same(t.numpy(), numpy_reduce("sum", all_inputs(20 + root, N, (4,), dtype)), "reduce")


@pytest.mark.parametrize("async_op", [False, True])
def test_gathers_and_scatters(async_op):
    def done(work):
        if async_op:
            work.wait()

    inputs = all_inputs(30, N, (2, 3), "float64")
    mine = tensor(30, (2, 3), "float64")
    out = torch.empty(2 * N, 3, dtype=torch.float64)
    done(dist.all_gather_into_tensor(out, mine, async_op=async_op))
    assert_same(out.numpy(), np.concatenate(inputs), "all_gather_into_tensor")
    parts = [torch.empty(2, 3, dtype=torch.float64) for _ in range(N)]
    done(dist.all_gather(parts, mine, async_op=async_op))
    for k in range(N):
        assert_same(parts[k].numpy(), inputs[k], "all_gather")

    big = tensor(31, (2 * N, 3), "float64")
    total = numpy_reduce("sum", all_inputs(31, N, (2 * N, 3), "float64"))
    part = torch.empty(2, 3, dtype=torch.float64)
    done(dist.reduce_scatter_tensor(part, big, async_op=async_op))
    assert_same(part.numpy(), total[2 * RANK : 2 * RANK + 2], "reduce_scatter_tensor")
    part.zero_()
    done(dist.reduce_scatter(part, list(big.chunk(N)), async_op=async_op))
    assert_same(part.numpy(), total[2 * RANK : 2 * RANK + 2], "reduce_scatter")

    root = N - 1
    gathered = [torch.empty(2, 3, dtype=torch.float64) for _ in range(N)] if RANK == root else None
    done(dist.gather(mine, gathered, dst=root, async_op=async_op))
    if RANK == root:
        for k in range(N):
            assert_same(gathered[k].numpy(), inputs[k], "gather")
    got = torch.empty(2, 3, dtype=torch.float64)
    pieces = [tensor(32 + k, (2, 3), "float64", rank=root) for k in range(N)] if RANK == root else None
    done(dist.scatter(got, pieces, src=root, async_op=async_op))
    assert_same(got.numpy(), rank_input(32 + RANK, root, (2, 3), "float64"), "scatter")


@pytest.mark.parametrize("async_op", [False, True])
def test_uneven_all_gather_and_gather(async_op):
    """Tensors of different sizes on different ranks, as gloo takes them (rank k: k + 1 rows,
    rank 0 none where there are several ranks)."""
    def done(work):
        if async_op:
            work.wait()

    rows = [(k + 1) % max(N, 2) for k in range(N)]
    inputs = [rank_input(50, k, (rows[k], 3), "float32") for k in range(N)]
    mine = torch.from_numpy(inputs[RANK].copy())
    parts = [torch.full((rows[k], 3), -1.0) for k in range(N)]
    done(dist.all_gather(parts, mine, async_op=async_op))
    for k in range(N):
        assert_same(parts[k].numpy(), inputs[k], "uneven all_gather")
    root = N // 2
    gathered = [torch.full((rows[k], 3), -1.0) for k in range(N)] if RANK == root else None
    done(dist.gather(mine, gathered, dst=root, async_op=async_op))
    if RANK == root:
        for k in range(N):
            assert_same(gathered[k].numpy(), inputs[k], "uneven gather")


def test_a_refused_all_gather_leaves_the_group_usable():
    mine = torch.ones(2)
    with pytest.raises(ValueError, match="one output tensor per rank"):
        dist.all_gather([torch.empty(2) for _ in range(N + 1)], mine)
    with pytest.raises(ValueError, match="this rank's input has 2 elements"):
        dist.all_gather([torch.empty(3) for _ in range(N)], mine)
    parts = [torch.empty(2) for _ in range(N)]
    dist.all_gather(parts, mine * RANK)
    for k in range(N):
        assert_same(parts[k].numpy(), np.full(2, float(k), dtype=np.float32), "after a refusal")


def test_all_to_all():
    rows = 2 * N
    mine = tensor(40, (rows, 3), "int32")
    inputs = all_inputs(40, N, (rows, 3), "int32")
    out = torch.empty_like(mine)
    dist.all_to_all_single(out, mine)
    assert_same(out.numpy(), np.concatenate([inputs[k][2 * RANK : 2 * RANK + 2] for k in range(N)]), "equal")
    # uneven: rank i sends (i + j) % 3 rows to rank j
    send = [(RANK + j) % 3 for j in range(N)]
    receive = [(i + RANK) % 3 for i in range(N)]
    mine = tensor(41, (sum(send), 2), "float32")
    out = torch.empty(sum(receive), 2)
    dist.all_to_all_single(out, mine, receive, send)
    want = []
    for i in range(N):
        theirs = rank_input(41, i, (sum((i + j) % 3 for j in range(N)), 2), "float32")
        start = sum((i + j) % 3 for j in range(RANK))
        want.append(theirs[start : start + receive[i]])
    assert_same(out.numpy(), np.concatenate(want), "uneven")
    outs = [torch.empty(receive[i], 2) for i in range(N)]
    dist.all_to_all(outs, list(mine.split(send)))
    assert_same(torch.cat(outs).numpy(), np.concatenate(want), "all_to_all lists")


def test_barrier_send_recv():
    dist.barrier()
    if N == 1:
        return
    right, left = (RANK + 1) % N, (RANK - 1) % N
    message = torch.full((3,), float(RANK))
    got = torch.empty(3)
    if RANK % 2 == 0:
        dist.send(message, right, tag=7)
        dist.recv(got, left, tag=7)
    else:
        dist.recv(got, left, tag=7)
        dist.send(message, right, tag=7)
    assert torch.equal(got, torch.full((3,), float(left)))
    requests = [dist.isend(message, right, tag=8), dist.irecv(got, tag=8)]
    for request in requests:
        request.wait()
    assert torch.equal(got, torch.full((3,), float(left)))


def test_refused_before_anything_moves():
    premul = dist._make_nccl_premul_sum(2.0) if hasattr(dist, "_make_nccl_premul_sum") else None
    if premul is not None:
        with pytest.raises(ValueError, match="PREMUL_SUM"):
            dist.all_reduce(torch.ones(2), op=premul)
    with pytest.raises(mpiring.ArgumentError, match="avg"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG)
    t = torch.ones(2)
    dist.all_reduce(t)  # the group is still usable
    assert torch.equal(t, torch.full((2,), float(N)))


def test_subgroup():
    members = list(range(0, N, 2))
    group = dist.new_group(members, backend="mpiring")
    t = torch.full((2,), float(RANK))
    if RANK in members:
        dist.all_reduce(t, group=group)
        assert torch.equal(t, torch.full((2,), float(sum(members))))


# ---- the progress thread (MPIRING_TORCH_PROGRESS=1): async calls go on by themselves, from any thread ----

@pytest.fixture(scope="module")
def threaded(world):
    """A group of every rank with a progress thread (the default group has one only where the
    whole run sets MPIRING_TORCH_PROGRESS=1)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MPIRING_TORCH_PROGRESS", "1")
        group = dist.new_group(backend="mpiring")
    assert group.progress.threaded
    return group


@pytest.fixture(params=["default", "threaded"])
def group(request):
    """The default group (as the run sets it) and a group with a progress thread."""
    return request.getfixturevalue("threaded") if request.param == "threaded" else dist.group.WORLD


def test_a_progress_thread_offers_the_core_unless_the_rank_has_two(monkeypatch):
    """The thread waits beside the caller's own work: its waits offer the core unless this rank has
    two cores (one for that work, one for the thread) or MPIRING_BUSY_POLL says otherwise; a group
    without the thread keeps the communicator's default."""
    from mpiring.torch import factory

    def group(progress: str, cores: int, busy_poll: str | None = None):  # noqa: ANN202
        monkeypatch.setenv("MPIRING_TORCH_PROGRESS", progress)
        monkeypatch.setattr(factory.os, "sched_getaffinity", lambda _: set(range(cores)))
        if busy_poll is None:
            monkeypatch.delenv("MPIRING_BUSY_POLL", raising=False)
        else:
            monkeypatch.setenv("MPIRING_BUSY_POLL", busy_poll)
        made = dist.new_group(backend="mpiring")
        spins = made.comm._ring.busy_poll
        default = made.comm._ring.core_per_rank
        dist.destroy_process_group(made)
        return spins, default

    local = max(1, factory.local_ranks())
    assert group("1", 2 * local - 1)[0] is False
    spins, default = group("1", 2 * local)
    assert spins is default
    assert group("1", 1, busy_poll="1")[0] is True
    spins, default = group("0", 1)
    assert spins is default


def test_async_futures_complete_while_the_caller_works(threaded):
    t = tensor(50, (1 << 16,), "float32")
    work = dist.all_reduce(t, async_op=True, group=threaded)
    future = work.get_future()
    a = torch.randn(64, 64)
    deadline = time.monotonic() + 60
    while not future.done() and time.monotonic() < deadline:  # never waits: only the thread moves it
        a = torch.tanh(a @ a)
    assert future.done() and work.is_completed()
    assert future.value() == [t]
    np.testing.assert_allclose(t.numpy(), numpy_reduce("sum", all_inputs(50, N, (1 << 16,), "float32")), rtol=1e-5)


def test_calls_from_another_thread(threaded):
    """DDP's hooks on CUDA tensors run on autograd's device threads: any thread may call the group."""
    got: dict = {}

    def other() -> None:
        try:
            t = tensor(51, (7,), "int64")
            dist.all_reduce(t, group=threaded)
            u = tensor(52, (5,), "float64")
            dist.all_reduce(u, op=dist.ReduceOp.MAX, async_op=True, group=threaded).wait()
            got["values"] = (t, u)
        except BaseException as error:  # noqa: BLE001 - checked below, in the test's thread
            got["error"] = error

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert "error" not in got, repr(got.get("error"))
    t, u = got["values"]
    assert_same(t.numpy(), numpy_reduce("sum", all_inputs(51, N, (7,), "int64")), "another thread")
    assert_same(u.numpy(), numpy_reduce("max", all_inputs(52, N, (5,), "float64", "max")), "another thread")
    v = torch.ones(3)
    dist.all_reduce(v, group=threaded)  # and from this one again
    assert torch.equal(v, torch.full((3,), float(N)))


def test_outstanding_async_ops_complete_in_order(group):
    calls = [(60 + k, (3 + 1000 * k,), dtype, op)
             for k, (dtype, op) in enumerate([("float32", "sum"), ("int32", "max"), ("float64", "min"),
                                              ("int64", "sum"), ("float32", "prod"), ("uint8", "bor")])]
    done: list[int] = []
    tensors, chained = [], []
    for k, (seed, shape, dtype, op) in enumerate(calls):
        t = tensor(seed, shape, dtype, op)
        work = dist.all_reduce(t, op=TORCH_OPS[op], async_op=True, group=group)
        chained.append(work.get_future().then(lambda _, k=k: done.append(k)))  # done once the callback ran
        tensors.append(t)
    torch.futures.wait_all(chained)
    assert done == list(range(len(calls)))
    for t, (seed, shape, dtype, op) in zip(tensors, calls, strict=True):
        want = numpy_reduce(op, all_inputs(seed, N, shape, dtype, op))
        if op == "prod":
            np.testing.assert_allclose(t.numpy(), want, rtol=1e-5)
        else:
            assert_same(t.numpy(), want, f"outstanding {op} {dtype}")


def test_an_error_reaches_the_future(group):
    bad = torch.ones(2, dtype=torch.int32)
    work = dist.all_reduce(bad, op=dist.ReduceOp.AVG, async_op=True, group=group)  # mpiring's own check
    # a failed future, as torch's own backends give (wait() on the Work raises mpiring's error itself)
    with pytest.raises(RuntimeError, match=r"ArgumentTypeError: allreduce: argument .op.: op .avg"):
        work.get_future().wait()
    with pytest.raises(mpiring.ArgumentError, match="avg"):
        work.wait()
    assert work.is_completed() and not work.is_success()
    assert isinstance(work.exception(), mpiring.ArgumentError)
    premul = dist._make_nccl_premul_sum(2.0) if hasattr(dist, "_make_nccl_premul_sum") else None
    if premul is not None:  # the group's own check: in the caller, at once
        with pytest.raises(ValueError, match="PREMUL_SUM"):
            dist.all_reduce(torch.ones(2), op=premul, async_op=True, group=group)
    t = torch.ones(2)
    dist.all_reduce(t, async_op=True, group=group).wait()  # the group is still usable
    assert torch.equal(t, torch.full((2,), float(N)))


def test_a_groups_thread_ends_with_the_group():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MPIRING_TORCH_PROGRESS", "1")
        group = dist.new_group(backend="mpiring")
    t = torch.ones(2)
    dist.all_reduce(t, group=group)
    thread = group.progress._thread
    assert thread.is_alive()
    dist.destroy_process_group(group)
    assert not thread.is_alive()
    assert torch.equal(t, torch.full((2,), float(N)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_tensors():
    t = torch.full((4,), float(RANK + 1), device="cuda")
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.full((4,), float(N * (N + 1) // 2)))


# ---- DDP and FSDP ----

def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1)).double()


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def train(net: torch.nn.Module, steps: int, data) -> list[float]:
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = data(step)
        loss = torch.nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def ddp_equals_gloo(group, gloo, bucket_mb: float, device: torch.device) -> None:
    """DDP on `group` and on gloo from the same weights and data: the same losses, and the same
    parameters on every rank."""
    ids = None if device.type == "cpu" else [device]

    def data(step: int) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(device) for t in batch(step, RANK))

    def ddp(net: torch.nn.Module, on) -> torch.nn.Module:  # noqa: ANN001
        return torch.nn.parallel.DistributedDataParallel(net.to(device), device_ids=ids, process_group=on,
                                                         bucket_cap_mb=bucket_mb)

    net = model(5)
    on_mpiring = train(ddp(net, group), 6, data)
    on_gloo = train(ddp(model(5), gloo), 6, data)
    # float64, summed in different orders by the two backends: equal to rounding
    np.testing.assert_allclose(on_mpiring, on_gloo, rtol=1e-12, atol=0)
    # every rank saw other data, yet holds the same parameters: the gradients were averaged
    first = next(net.parameters()).detach().cpu().numpy()
    everyone = [None] * N
    dist.all_gather_object(everyone, first)
    for theirs in everyone:
        np.testing.assert_array_equal(theirs, first)


@pytest.mark.parametrize("bucket_mb", [25.0, 0.0001])  # DDP's default; a bucket per layer, several in flight
def test_ddp_losses_equal_gloos(gloo, group, bucket_mb):
    """DDP's own hook: its buckets' all-reduces are async calls (with a progress thread, going on
    behind the backward pass)."""
    ddp_equals_gloo(group, gloo, bucket_mb, torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("bucket_mb", [25.0, 0.0001])
def test_ddp_on_cuda_tensors_equals_gloo(gloo, threaded, bucket_mb):
    """On CUDA tensors DDP calls its hooks from autograd's device thread: a group with a progress
    thread (MPIRING_TORCH_PROGRESS=1) runs them there, and CuPy carries the tensors."""
    device = torch.device("cuda", mpiring.bind_device(WORLD))
    torch.cuda.set_device(device)
    ddp_equals_gloo(threaded, gloo, bucket_mb, device)


def test_fsdp_parameters_equal_a_one_process_run():
    from torch.distributed.fsdp import fully_shard

    net = model(6)
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    train(net, 4, lambda s: batch(s, RANK))
    alone = model(6)  # one process: every rank's batch at once (the mean of the ranks' mean losses)
    train(alone, 4, lambda s: tuple(torch.cat(parts) for parts in zip(*(batch(s, k) for k in range(N)), strict=True)))
    for sharded, single in zip(net.parameters(), alone.parameters(), strict=True):
        # each rank's shard (rows of dim 0), joined (full_tensor() would take torch's functional
        # collectives, which a process group written in Python does not serve)
        shards = [None] * N
        dist.all_gather_object(shards, sharded.to_local().detach().numpy())
        np.testing.assert_allclose(np.concatenate(shards), single.detach().numpy(), rtol=1e-10, atol=1e-12)
