"""Collectives over a group of ranks.

Control data (a few numbers, small Python objects) travels over MPI on the calling thread.
Tensor collectives run, in submission order, on one communication thread per communicator:
over a duplicate of the MPI communicator, or over a torch.distributed group (NCCL for GPU
tensors; gloo exercises the same path on CPU). MPI sends host memory, so GPU tensors on the MPI
path are staged through page-locked host copies: that is the path when ranks share a GPU,
which NCCL refuses (:func:`tensor_backend`). A dedicated thread gives real
overlap with computation without relying on MPI's asynchronous progress, and the duplicate keeps
its collectives apart from the control collectives that the main thread issues at the same time
(MPI requires collectives on one communicator to be ordered).

Every wait is bounded by ``timeout_s`` (``comm.timeout_s``): a tensor collective's
:meth:`Handle.wait` raises :class:`CommTimeout`, and a blocking control collective is watched
by runner/comm/deadline.py; both messages name this rank, the communicator and the operation,
so a dead or hung peer ends the job instead of leaving it waiting.

Lower precision on the wire (``comm.exchange_dtype``, the ``wire`` argument): an exchange
sends its tensor rounded to ``wire`` and widens what it receives into the caller's buffers; an
allreduce runs as a ring (:meth:`_ring_allreduce`) whose messages are in ``wire`` and whose
sums are kept in the tensor's own dtype, every rank ending with the same values.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np

from ..lazy import torch
from .deadline import DEADLINES, CommTimeout
from .traffic import Traffic
from .ulfm import (
    GarbledMessage,
    free_completed,
    keep_abandoned,
    retire_comm,
    start_recv,
    start_send,
    track,
)
from .world import mpi

TENSOR_BACKENDS = ("mpi", "nccl", "gloo")
log = logging.getLogger("adpsgd")
EXCHANGE = 11  # MPI tag of model exchanges
RING = 12  # MPI tag of the lower-precision ring allreduce
DEFAULT_TIMEOUT_S = 900.0


class Handle:
    """A pending tensor collective; ``wait()`` returns the tensor once it is complete, or
    raises :class:`CommTimeout` naming ``what`` after ``timeout_s``."""

    def __init__(self, future: Future, what: str = "a collective",
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self._future = future
        self.what = what
        self.timeout_s = timeout_s

    @classmethod
    def completed(cls, value: Any) -> Handle:
        """A handle whose communication already happened (restored from a checkpoint)."""
        future: Future = Future()
        future.set_result(value)
        return cls(future, "a completed collective")

    def wait(self, timeout: float | None = None) -> Any:
        timeout = self.timeout_s if timeout is None else timeout
        try:
            return self._future.result(timeout=timeout)
        except FutureTimeout:
            raise CommTimeout(f"{self.what} got no answer in {timeout:.0f} s (is every rank "
                              "alive? see the other ranks' logs)") from None

    def done(self) -> bool:
        return self._future.done()


class Communicator:
    def __init__(self, mpi_comm, backend: str = "mpi", torch_group=None, name: str = "world",
                 timeout_s: float = DEFAULT_TIMEOUT_S, traffic: Traffic | None = None):
        """``traffic``: where the bytes this rank sends are counted (runner/comm/traffic.py),
        shared by a rank's communicators; a new count if None."""
        if backend not in TENSOR_BACKENDS:
            raise ValueError(f"unknown tensor backend {backend!r}")
        self.MPI = mpi()
        self.mpi_comm = mpi_comm
        self.backend = backend
        self.torch_group = torch_group
        self.name = name
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.timeout_s = timeout_s
        self._tensor_comm = track(mpi_comm.Dup()) if backend == "mpi" else None
        track(mpi_comm)  # an elastic run revokes it when a peer dies (runner/comm/ulfm.py)
        self._staging = HostStaging()  # GPU tensors on the MPI path (communication thread)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"comm-{name}")
        self._busy_lock = threading.Lock()
        self.busy_s = 0.0  # seconds the communication thread spent inside collectives
        self.traffic = Traffic() if traffic is None else traffic

    # ---- tensor collectives (communication thread) -------------------------------------
    def _what(self, operation: str) -> str:
        """How a timeout names this wait: the rank, the operation and the peers."""
        return (f"rank {self.rank} of the {self.name} communicator ({self.size} ranks): "
                f"{operation}")

    def _count(self, kind: str, nbytes: int) -> None:
        if self.size > 1 and nbytes:
            self.traffic.count(f"{self.name}/{kind}", nbytes)

    def _submit(self, fn: Callable[[], Any], operation: str) -> Handle:
        def timed():
            start = time.perf_counter()
            try:
                return fn()
            finally:
                with self._busy_lock:
                    self.busy_s += time.perf_counter() - start

        return Handle(self._executor.submit(timed), self._what(operation), self.timeout_s)

    def iallreduce_(self, tensor: torch.Tensor, op: str = "sum",
                    wire: torch.dtype | None = None) -> Handle:
        """Start an in-place allreduce (``op`` is ``sum`` or ``mean``) of a contiguous tensor;
        ``wire``: the dtype its messages travel in (None: the tensor's own)."""
        if op not in ("sum", "mean"):
            raise ValueError(f"unsupported reduction {op!r}")
        if not tensor.is_contiguous():
            raise ValueError("collectives need contiguous tensors; use a flat buffer")
        wire = None if wire == tensor.dtype else wire
        itemsize = tensor.element_size() if wire is None else wire.itemsize
        self._count("allreduce", ring_bytes(tensor.numel() * itemsize, self.size))

        def run():
            if self.size > 1:
                if wire is not None and self.backend == "mpi":
                    # Over MPI the ring runs in host memory (one staging of the whole buffer).
                    with self._staging.host(_bytes(tensor)) as host:
                        self._ring_allreduce(torch.from_numpy(host).view(tensor.dtype), wire)
                elif wire is not None:
                    self._ring_allreduce(tensor.view(-1), wire)
                elif self.backend == "mpi":
                    with self._staging.host(tensor) as host:
                        self._tensor_comm.Allreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
                else:
                    import torch.distributed as dist

                    dist.all_reduce(tensor, group=self.torch_group)
                if op == "mean":
                    tensor.div_(self.size)
            return tensor

        return self._submit(run, f"allreduce of {tensor.numel()} values")

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum",
                   wire: torch.dtype | None = None) -> torch.Tensor:
        return self.iallreduce_(tensor, op, wire).wait()

    def broadcast_(self, tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
        if self.rank == root:
            self._count("broadcast", _nbytes(tensor))

        def run():
            if self.size > 1:
                if self.backend == "mpi":
                    with self._staging.host(tensor) as host:
                        self._tensor_comm.Bcast(host, root=root)
                else:
                    import torch.distributed as dist

                    dist.broadcast(tensor, src=self._global(root), group=self.torch_group)
            return tensor

        return self._submit(run, f"broadcast of {tensor.numel()} values from rank {root}").wait()

    def exchange_(self, send: torch.Tensor, send_to: Sequence[int],
                  recv_from: dict[int, torch.Tensor], wire: torch.dtype | None = None
                  ) -> Handle:
        """Send ``send`` to every rank in ``send_to`` and fill ``recv_from[peer]`` from every
        peer, all posted at once so that two ranks sending to each other cannot block;
        ``wire``: the dtype the messages travel in (None: ``send``'s own). With ``wire``,
        ``send`` is rounded when this call is made, so it may change while the message
        travels.

        Messages between two ranks arrive in the order they were posted, and this
        communicator posts in submission order, so consecutive exchanges never mix.
        """
        wire = None if wire == send.dtype else wire
        if wire is not None:
            # The rounded messages are temporaries: over MPI they live in host memory (host
            # staging keeps a pinned twin per long-lived buffer, not per temporary).
            device = torch.device("cpu") if self.backend == "mpi" else send.device
            send = send.to(device=device, dtype=wire)
            inbox = {peer: torch.empty(buf.shape, dtype=wire, device=device)
                     for peer, buf in recv_from.items()}
        else:
            inbox = recv_from

        def run():
            self._send_receive([(send, peer) for peer in send_to], list(inbox.items()),
                               EXCHANGE)
            if wire is not None:
                for peer, buf in inbox.items():
                    recv_from[peer].copy_(buf)
            return recv_from

        self._count("exchange", _nbytes(send) * len(send_to))
        peers = sorted(set(send_to) | set(recv_from))
        return self._submit(run, f"exchange with rank(s) {', '.join(map(str, peers))}")

    def _send_receive(self, sends: list[tuple[torch.Tensor, int]],
                      receives: list[tuple[int, torch.Tensor]], tag: int) -> None:
        """Post every send (tensor, peer) and receive (peer, tensor) at once and wait for all
        (communication thread). Tensors travel as their bytes, so any dtype goes over MPI."""
        if not sends and not receives:
            return
        if self.backend == "mpi":
            with contextlib.ExitStack() as staged:
                requests: list = []  # posted one by one: a post that fails keeps the others
                hosts: dict[int, Any] = {}  # a tensor sent to several peers is staged once
                try:
                    for peer, buf in receives:
                        requests.append(start_recv(
                            self._tensor_comm,
                            staged.enter_context(self._staging.host(_bytes(buf),
                                                                    copy_in=False)),
                            source=peer, tag=tag))
                    for out, peer in sends:
                        if id(out) not in hosts:
                            hosts[id(out)] = staged.enter_context(
                                self._staging.host(_bytes(out), copy_back=False))
                        requests.append(start_send(self._tensor_comm, hosts[id(out)],
                                                   dest=peer, tag=tag))
                    self.MPI.Request.Waitall(requests)
                    free_completed(requests)
                except self.MPI.Exception:
                    keep_abandoned(requests)  # and the buffers they point into
                    staged.pop_all()
                    raise
            return
        import torch.distributed as dist

        ops = [dist.P2POp(dist.irecv, _bytes(buf), self._global(peer), group=self.torch_group)
               for peer, buf in receives]
        ops += [dist.P2POp(dist.isend, _bytes(out), self._global(peer), group=self.torch_group)
                for out, peer in sends]
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    def _ring_allreduce(self, flat: torch.Tensor, wire: torch.dtype) -> None:
        """Sum ``flat`` over the ranks in place, its messages in ``wire`` (communication
        thread). Reduce-scatter: in n - 1 steps each rank passes a chunk to the next and adds
        the one it receives, in ``flat``'s dtype, so rank r ends with the whole sum of chunk
        r + 1. Allgather: that sum, rounded to ``wire``, goes round the ring, and its owner
        keeps the rounded value too, so every rank ends with the same numbers."""
        n, r = self.size, self.rank
        right, left = (r + 1) % n, (r - 1) % n
        chunks = torch.tensor_split(flat, n)

        def pass_on(index_out: int, index_in: int) -> torch.Tensor:
            received = torch.empty(chunks[index_in].numel(), dtype=wire, device=flat.device)
            self._send_receive([(chunks[index_out].to(wire), right)], [(left, received)], RING)
            return received

        for step in range(n - 1):
            index = (r - step - 1) % n
            chunks[index].add_(pass_on((r - step) % n, index))
        own = chunks[right]  # chunk r + 1: complete here
        own.copy_(own.to(wire))
        for step in range(n - 1):
            index = (r - step) % n
            chunks[index].copy_(pass_on((r + 1 - step) % n, index))

    def _global(self, rank: int) -> int:
        """torch.distributed addresses peers by global rank."""
        if self.torch_group is None:
            return rank
        import torch.distributed as dist

        return dist.get_global_rank(self.torch_group, rank)

    def staging_record(self) -> dict[str, float] | None:
        """Host staging of GPU tensors on the MPI path (seconds, MB, ms per MB); None if
        nothing was staged."""
        staging = self._staging
        if not staging.bytes:
            return None
        megabytes = staging.bytes / 2**20
        return {"seconds": staging.seconds, "megabytes": megabytes,
                "ms_per_mb": 1000 * staging.seconds / megabytes}

    # ---- control collectives (calling thread, MPI) ---------------------------------------
    def _watch(self, operation: str):
        return DEADLINES.watch(self._what(operation), self.timeout_s)

    def allreduce_numbers(self, values: Sequence[float], op: str = "sum") -> np.ndarray:
        data = np.asarray(values, dtype=np.float64)
        out = np.empty_like(data)
        mpi_op = {"sum": self.MPI.SUM, "max": self.MPI.MAX, "min": self.MPI.MIN}[op]
        with self._watch(f"allreduce ({op}) of {len(data)} numbers"):
            self.mpi_comm.Allreduce(data, out, op=mpi_op)
        return out

    @contextlib.contextmanager
    def _objects(self, operation: str):
        """An object collective, watched; a result that does not unpickle is a
        :class:`GarbledMessage` (what a peer dying in it may leave), not a pickle error."""
        with self._watch(operation):
            try:
                yield
            except self.MPI.Exception:
                raise
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
                    ImportError, IndexError, KeyError, MemoryError, OverflowError) as ex:
                raise GarbledMessage(f"{self._what(operation)}: a result did not unpickle "
                                     f"({type(ex).__name__}: {ex})") from ex

    def gather_objects(self, obj: Any, root: int = 0) -> list[Any] | None:
        with self._objects(f"gather to rank {root}"):
            return self.mpi_comm.gather(obj, root=root)

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        with self._objects(f"broadcast from rank {root}"):
            return self.mpi_comm.bcast(obj, root=root)

    def allgather_objects(self, obj: Any) -> list[Any]:
        with self._objects("allgather"):
            return self.mpi_comm.allgather(obj)

    def barrier(self) -> None:
        with self._watch("barrier"):
            self.mpi_comm.Barrier()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        retire_comm(self._tensor_comm)  # revoked, after a peer died in an elastic run
        self._tensor_comm = None


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, as a uint8 view (numpy, and so MPI, has no bfloat16)."""
    return tensor.view(-1).view(torch.uint8)


def ring_bytes(nbytes: int, n: int) -> int:
    """What each of ``n`` ranks sends in an allreduce of ``nbytes``: 2 (n - 1) / n of it, the
    volume of the bandwidth-optimal algorithms (ring; reduce-scatter then allgather) that MPI
    libraries use for large buffers, and of this module's lower-precision ring."""
    return 2 * (n - 1) * nbytes // n


class HostStaging:
    """Page-locked host twins of GPU tensors for the MPI path, kept per device buffer (the
    flat buffers live as long as the run), with the seconds the copies took and the bytes of
    tensor staged (once per operation, whichever way it went): what staging costs in ms per
    MB. CPU tensors pass through as they are."""

    def __init__(self):
        self._twins: dict[tuple, torch.Tensor] = {}
        self.seconds = 0.0
        self.bytes = 0

    @contextlib.contextmanager
    def host(self, tensor: torch.Tensor, copy_in: bool = True, copy_back: bool = True):
        """The host memory MPI reads and writes for ``tensor`` (a numpy view); on a GPU,
        ``copy_in`` fills it from the tensor first and ``copy_back`` writes it back after."""
        if tensor.device.type == "cpu":
            yield tensor.detach().numpy()
            return
        flat = tensor.detach().view(-1)
        key = (flat.device, flat.data_ptr(), flat.numel(), flat.dtype)
        twin = self._twins.get(key)
        if twin is None:
            twin = self._twins[key] = torch.empty(flat.numel(), dtype=flat.dtype,
                                                  pin_memory=True)
        self.bytes += _nbytes(flat)
        if copy_in:
            self._copy(twin, flat)
        yield twin.numpy()
        if copy_back:
            self._copy(flat, twin)

    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        start = time.perf_counter()
        dst.copy_(src)  # blocking: ordered after the kernels that wrote src on its stream
        self.seconds += time.perf_counter() - start


def tensor_backend(requested: str, device_type: str, ranks_on_host: int, gpus: int) -> str:
    """The tensor backend for ``comm.backend``: ``auto`` is NCCL when every rank on a machine
    has a GPU of its own, else MPI (on GPUs through pinned host memory: NCCL refuses two
    ranks on one device)."""
    from ..errors import UserError

    on_gpu = device_type == "cuda"
    shared = on_gpu and ranks_on_host > gpus
    if requested == "auto":
        return "nccl" if on_gpu and not shared else "mpi"
    if requested == "nccl" and not on_gpu:
        raise UserError("comm.backend=nccl needs GPUs", "use comm.backend=auto on CPU")
    if requested == "nccl" and shared:
        raise UserError(f"comm.backend={nccl_shared_gpu_problem(ranks_on_host, gpus)}",
                        NCCL_SHARED_FIX)
    if requested == "gloo" and on_gpu:
        raise UserError("comm.backend=gloo moves CPU tensors, and the model is on a GPU",
                        "use comm.backend=auto (NCCL, or MPI through pinned host memory)")
    return requested


NCCL_SHARED_FIX = ("use comm.backend=auto (MPI through pinned host memory), or at most one rank "
                   "per GPU")


def nccl_shared_gpu_problem(ranks_on_host: int, gpus: int) -> str:
    return (f"nccl needs a GPU per rank, but {ranks_on_host} ranks share "
            f"{gpus} GPU(s) on one machine (NCCL refuses two ranks on one device)")


def shutdown_torch_distributed() -> None:
    """Destroy torch.distributed's process groups once a run has ended normally on every rank:
    gloo's worker threads left to the interpreter's exit can abort the process ("terminate
    called without an active exception", seen on 4 loaded ranks). Not after a failure, where
    the teardown could wait on a peer that is gone."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def init_torch_distributed(mpi_comm, backend: str, timeout_s: float = 600.0) -> bool:
    """Start torch.distributed (NCCL or gloo) with the rendezvous address shared over MPI.
    False if it was running already (a caller's own group, e.g. a benchmark running the
    worker in its process): then the caller, not the worker, shuts it down."""
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        return False
    address = None
    if mpi_comm.Get_rank() == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        with socket.socket() as probe:  # ask the OS for a free port on this host
            probe.bind(("", 0))
            address = (host, probe.getsockname()[1])
    host, port = mpi_comm.bcast(address, root=0)
    if mpi_comm.Get_rank() == 0:
        log.info("torch.distributed (%s) rendezvous at tcp://%s:%d", backend, host, port)
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}",
                            rank=mpi_comm.Get_rank(), world_size=mpi_comm.Get_size(),
                            timeout=datetime.timedelta(seconds=timeout_s))
    return True


def torch_subgroups(groups: Sequence[Sequence[int]]) -> list:
    """Create one torch.distributed group per rank list (every rank must call this)."""
    import torch.distributed as dist

    return [dist.new_group(ranks=list(ranks)) for ranks in groups]
