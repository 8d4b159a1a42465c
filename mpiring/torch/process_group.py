"""`ProcessGroupMpiring`: torch.distributed's ProcessGroup on an mpiring Communicator.

Each collective runs on views of the caller's tensors (mpiring.torch.tensors), in place where
torch.distributed writes in place, so no data is copied on the way in or out, except where a
call gives a list of separate tensors (allgather, gather, scatter, reduce_scatter, alltoall of
lists), which run on one temporary buffer copied from or into them. A call made with
async_op=False runs mpiring's blocking collective (planned after its second call with the same
tensors). Every collective is a job of the group's Progress (mpiring.torch.progress): with
MPIRING_TORCH_PROGRESS=1 its thread, the one thread that calls the Communicator, runs them in
the order they were issued (async_op=False: the caller waits for it; async_op=True: the caller
gets at once a Work whose future the thread completes, mpiring.torch.work); without it they
run in the caller's thread at once. The checks the group makes itself (sizes,
dtypes, ops) raise in the caller before anything is queued; mpiring's own argument errors
and any failure of the call reach the caller through wait() or the future.
send and recv use MPI's own point-to-point messages on a private duplicate of the communicator.

Refused: ReduceOp.PREMUL_SUM (ValueError); AVG on integer tensors, MIN/MAX on complex ones and
the bitwise ops on floating ones (mpiring's ArgumentTypeError); tensors on devices other than
CPU and CUDA. torch.distributed itself turns complex tensors into real ones for SUM and AVG.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI

import mpiring
from mpiring.torch.progress import Progress
from mpiring.torch.tensors import view
from mpiring.torch.work import Work, of_mpi

_RedOpType = dist.ReduceOp.RedOpType
_OPS = {
    _RedOpType.SUM: "sum", _RedOpType.AVG: "avg", _RedOpType.MIN: "min", _RedOpType.MAX: "max",
    _RedOpType.PRODUCT: "prod", _RedOpType.BAND: "band", _RedOpType.BOR: "bor", _RedOpType.BXOR: "bxor",
}


def _op(op: Any) -> str:
    """mpiring's name for a torch ReduceOp (or its RedOpType)."""
    name = _OPS.get(getattr(op, "op", op))
    if name is None:
        raise ValueError(f"mpiring: {op} is not supported (supported: SUM, AVG, MIN, MAX, PRODUCT, BAND, BOR, "
                         "BXOR; PREMUL_SUM is not)")
    return name


class ProcessGroupMpiring(dist.ProcessGroup):
    """torch.distributed on mpiring's collectives: made by `dist.init_process_group("mpiring")`
    (or `dist.new_group(..., backend="mpiring")`) once `mpiring.torch` is imported; `threaded`:
    its collectives run on a progress thread (MPIRING_TORCH_PROGRESS=1, mpiring.torch.progress)."""

    def __init__(self, comm: mpiring.Communicator, threaded: bool) -> None:
        super().__init__(comm.rank, comm.size)
        self.comm = comm  # the mpiring Communicator this group runs on: only its progress thread (if any) calls it
        self.progress = Progress(f"mpiring.torch progress {id(self):x}", threaded=threaded)
        self._p2p = comm.mpi.Dup()  # send/recv: their own context, apart from the caller's and mpiring's
        self._group_name = ""
        self._group_desc = ""
        self._counts: dict[int, tuple[int, ...]] = {}

    # ---- what torch asks of every process group ----

    def getBackendName(self) -> str:  # noqa: N802 - torch's names
        return "mpiring"

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def shutdown(self) -> None:
        """End the progress thread once the calls already issued are done (torch's
        destroy_process_group calls this; the interpreter's exit does it too)."""
        self.progress.close()

    def free(self) -> None:
        """Free the communicators this group runs on, after shutdown()
        (mpiring.torch.shrink_process_group frees those of the groups it destroys)."""
        self.progress.close()
        self.comm.free()  # the thread that called it has ended: any thread may free it now
        self._p2p.Free()

    def on_thread(self, job: Callable[[], Any]) -> Any:
        """`job()` run on the progress thread in its turn (for calls on `comm` other than the
        collectives, such as shrink()); its value, or its exception raised here."""
        return self.progress.call(job)

    # ---- plumbing ----

    def _equal(self, n: int) -> tuple[int, ...]:
        """counts= of a call where every rank has n rows (given, the ranks skip exchanging them)."""
        counts = self._counts.get(n)
        if counts is None:
            counts = self._counts[n] = (n,) * self.comm.size
        return counts

    def _run(self, opts: Any, collective: str, args: tuple, kwargs: dict, outputs: Sequence[torch.Tensor],
             finish: Callable[[], None] | None = None, keep: Any = None) -> Work:
        """One mpiring call (then `finish`, copying a result out of a temporary) on the progress
        thread: waited for here unless the caller asked for async_op, else a Work over its future.
        `keep` (temporaries the call reads or writes) lives as long as the job and the Work.
        Without the thread the call runs here at once, and its Work holds a future only where an
        async_op call failed (a torch Future per call costs more than a small call itself)."""
        call = getattr(self.comm, collective)

        def job() -> None:
            call(*args, **kwargs)
            if finish is not None:
                finish()

        if not self.progress.threaded:
            self.progress.check_open()
            try:
                job()
            except Exception as error:
                if not getattr(opts, "asyncOp", True):
                    raise
                failed: torch.futures.Future = torch.futures.Future()
                failed.set_exception(error)
                return Work(outputs, failed)
            return Work(outputs)
        future = self.progress.submit(job, outputs)
        if getattr(opts, "asyncOp", True):
            work = Work(outputs, future)
            work._keep = keep
            return work
        future.wait()
        return Work(outputs)

    def _each(self, works: list[Work], outputs: Sequence[torch.Tensor]) -> Work:
        """One Work for several calls (a list of tensors, one call each)."""
        if len(works) == 1:
            return works[0]
        futures = [work._future for work in works if work._future is not None]
        if not futures:  # blocking calls, all done
            return Work(outputs)

        def check() -> None:  # queued after them: they are done, and the first error is this one's
            for future in futures:
                future.wait()

        return Work(outputs, self.progress.submit(check, outputs))

    # ---- collectives ----

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts or dist.AllreduceOptions()
        op = _op(opts.reduceOp)
        if len(tensors) == 1:  # the common case, kept lean
            x = view(tensors[0])
            return self._run(opts, "allreduce", (x, op), {"out": x}, tensors)
        return self._each([self.allreduce([t], opts) for t in tensors], tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        options = dist.AllreduceOptions()
        if opts is not None:
            options.reduceOp = opts.reduceOp
            options.asyncOp = getattr(opts, "asyncOp", True)
        return self._each([self.allreduce([t], options) for t in tensors], tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts or dist.BroadcastOptions()
        works = []
        for tensor in tensors:
            x = view(tensor)
            works.append(self._run(opts, "broadcast", (x, opts.rootRank), {"out": x}, [tensor]))
        return self._each(works, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts or dist.ReduceOptions()
        op, root = _op(opts.reduceOp), opts.rootRank
        works = []
        for tensor in tensors:
            x = view(tensor)
            out = x if self.comm.rank == root else None
            works.append(self._run(opts, "reduce", (x, op, root), {"out": out}, [tensor]))
        return self._each(works, tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:  # noqa: A002
        """Every rank's `input`, in rank order, in `output` (size times as long)."""
        _same_kind("all_gather_single", input, output)
        x = view(input, flat=True)
        return self._run(opts, "allgather", (x,), {"out": view(output, flat=True), "counts": self._equal(x.size)},
                         [output])

    _allgather_base = all_gather_single  # the name torch.distributed used before

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> Work:
        """Every rank's tensor into `output_tensors`, whose sizes may differ by rank (as gloo
        takes them): every rank lists them all, so the sizes are the counts= of one all-gather."""
        works = []
        for outputs, tensor in zip(output_tensors, input_tensors, strict=True):
            counts = _counts("all_gather", outputs, self.comm.size)
            if tensor.numel() != counts[self.comm.rank]:
                raise ValueError(f"mpiring: all_gather: this rank's input has {tensor.numel()} elements, but "
                                 f"output_tensors[{self.comm.rank}] has {counts[self.comm.rank]}")
            _same_kind("all_gather", tensor, outputs[0])
            x = view(tensor.detach(), flat=True)
            whole = tensor.new_empty(sum(counts))
            works.append(self._run(opts, "allgather", (x,), {"out": view(whole, flat=True), "counts": counts},
                                   outputs, lambda w=whole, o=outputs: _split_into(w, o), keep=whole))
        return self._each(works, [t for outputs in output_tensors for t in outputs])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:  # noqa: A002
        """`input` split in size equal parts, reduced over the ranks: part `rank` in `output`."""
        opts = opts or dist.ReduceScatterOptions()
        _same_kind("reduce_scatter_single", input, output)
        out = view(output, flat=True)
        return self._run(opts, "reduce_scatter", (view(input, flat=True), _op(opts.reduceOp)),
                         {"out": out, "counts": self._equal(out.size)}, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> Work:
        works = []
        for output, inputs in zip(output_tensors, input_tensors, strict=True):
            whole = torch.cat([t.detach().reshape(-1) for t in inputs])
            work = self.reduce_scatter_single(output, whole, opts)
            work._keep = whole
            works.append(work)
        return self._each(works, output_tensors)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> Work:
        opts = opts or dist.GatherOptions()
        root = opts.rootRank
        (tensor,) = input_tensors
        x = view(tensor, flat=True)
        whole = out = finish = None
        if self.comm.rank == root:
            outputs = output_tensors[0]
            counts = _counts("gather", outputs, self.comm.size)
            if x.size != counts[root]:
                raise ValueError(f"mpiring: gather: the root's input has {x.size} elements, but "
                                 f"gather_list[{root}] has {counts[root]}")
            whole = tensor.new_empty(sum(counts))
            out = view(whole, flat=True)
            finish = lambda: _split_into(whole, outputs)  # noqa: E731
        # only the root knows every rank's size (gather_list): the ranks exchange their counts
        return self._run(opts, "gather", (x, root), {"out": out}, output_tensors[0] if output_tensors else [],
                         finish, keep=whole)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> Work:
        opts = opts or dist.ScatterOptions()
        root = opts.rootRank
        (output,) = output_tensors
        whole = x = None
        if self.comm.rank == root:
            whole = torch.cat([t.detach().reshape(-1) for t in input_tensors[0]])
            x = view(whole, flat=True)
        out = view(output, flat=True)
        return self._run(opts, "scatter", (x, root), {"out": out, "counts": self._equal(out.size)},
                         output_tensors, keep=whole)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],  # noqa: A002
                          input_split_sizes: list[int], opts: Any = None) -> Work:
        """Rows (dim 0) of `input` to every rank, `input_split_sizes[j]` of them to rank j (equal
        parts when empty); `output` takes `output_split_sizes[i]` rows from each rank i."""
        opts = opts or dist.AllToAllOptions()
        _same_kind("all_to_all_single", input, output)
        x, out = view(input, flat=True), view(output, flat=True)
        if not output_split_sizes and not input_split_sizes:
            return self._run(opts, "alltoall", (x,), {"out": out}, [output])
        row = input[0].numel() if input.dim() and input.shape[0] else (output[0].numel() if output.dim() and
                                                                          output.shape[0] else 1)
        size = self.comm.size
        send = [n * row for n in input_split_sizes] if input_split_sizes else [x.size // size] * size
        receive = [n * row for n in output_split_sizes] if output_split_sizes else [out.size // size] * size
        return self._run(opts, "alltoallv", (x, send, receive), {"out": out}, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> Work:
        opts = opts or dist.AllToAllOptions()
        whole_in = torch.cat([t.detach().reshape(-1) for t in input_tensors])
        whole_out = whole_in.new_empty(sum(t.numel() for t in output_tensors))
        work = self._run(opts, "alltoallv", (view(whole_in, flat=True), [t.numel() for t in input_tensors],
                                             [t.numel() for t in output_tensors]),
                         {"out": view(whole_out, flat=True)}, output_tensors,
                         lambda: _split_into(whole_out, output_tensors), keep=(whole_in, whole_out))
        return work

    def barrier(self, opts: Any = None) -> Work:
        return self._run(opts, "barrier", (), {}, [])

    # ---- point to point (MPI's own messages) ----

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Work:
        (tensor,) = tensors
        data = tensor.detach().cpu() if tensor.is_cuda else tensor  # device tensors travel through the host
        buffer = view(data, flat=True).view("u1")
        request = self._p2p.Isend([buffer, MPI.BYTE], dst, tag)
        work = Work(tensors, pending=(of_mpi(request),))
        work._keep = data
        return work

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        return self._receive(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Work:
        return self._receive(tensors, MPI.ANY_SOURCE, tag)

    def _receive(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        (tensor,) = tensors
        data = torch.empty_like(tensor, device="cpu") if tensor.is_cuda else tensor
        status = MPI.Status()
        request = self._p2p.Irecv([view(data, flat=True).view("u1"), MPI.BYTE], src, tag)
        work: Work

        def finish() -> None:
            work.source = status.Get_source()
            if data is not tensor:
                tensor.copy_(data)

        work = Work(tensors, pending=(of_mpi(request, status),), finish=finish)
        work._keep = data
        return work


def _split_into(whole: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    """Copy consecutive parts of a flat `whole` into `outputs`, each shaped as its tensor."""
    start = 0
    for tensor in outputs:
        n = tensor.numel()
        tensor.copy_(whole[start : start + n].view(tensor.shape))
        start += n


def _counts(collective: str, outputs: Sequence[torch.Tensor], size: int) -> list[int]:
    """Every rank's element count, from the list of output tensors (one per rank)."""
    if len(outputs) != size:
        raise ValueError(f"mpiring: {collective} needs one output tensor per rank ({size}), got {len(outputs)}")
    return [t.numel() for t in outputs]


def _same_kind(collective: str, input: torch.Tensor, output: torch.Tensor) -> None:  # noqa: A002
    if input.dtype != output.dtype or input.device != output.device:
        raise ValueError(f"mpiring: {collective} needs input and output of one dtype and device, got "
                         f"{input.dtype} on {input.device} and {output.dtype} on {output.device}")
