"""``trainer.prefetch_to_device``: the next batch is moved to the device (the recipe's
``to_device``: the copy, and whatever the recipe does there, e.g. decoding JPEGs on the GPU)
by a background thread while the current step trains.

Why: a recipe whose ``to_device`` does real work (recipe=imagenet with ``loader=gpu`` decodes
and crops a whole batch there) would otherwise do it in the training thread, between two
steps, with the GPU idle. The thread runs on a CUDA stream of its own; the training thread's
stream waits for that batch's event before using it, and every tensor of the batch is marked
as used by the training stream, so the allocator does not hand its memory back to the side
stream while a step still reads it.

Errors raised while preparing a batch (an undecodable file, a worker's UserError) reach the
training thread at that batch, as they would without prefetching. ``close()`` stops the thread
and waits for it before anyone iterates the loader again (one DataLoader serves every pass).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

POLL_S = 0.1  # how often a blocked producer checks whether it was closed


class OnDevice(NamedTuple):
    """A batch already on the device: ComputePath.batch hands it over as it is."""
    value: Any
    ready: Any  # torch.cuda.Event recorded on the side stream, or None on the CPU


class _Failed(NamedTuple):
    error: BaseException


_END = object()


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


class DevicePrefetch:
    """Iterate host batches (``source``; None stands for an empty batch and passes through)
    as :class:`OnDevice` batches prepared ``ahead`` batches in advance."""

    def __init__(self, source: Iterator[Any], prepare: Any, device: torch.device,
                 ahead: int = 1):
        self.source, self.prepare, self.device = source, prepare, device
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        # The current CUDA device is per thread: the producer takes this one's.
        self.cuda_index = (device.index if device.index is not None
                           else torch.cuda.current_device()) if self.side is not None else None
        self.ready: queue.Queue = queue.Queue(maxsize=ahead)
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._produce, name="device-prefetch",
                                       daemon=True)
        self.thread.start()

    def _put(self, item: Any) -> bool:
        while not self.closed.is_set():
            try:
                self.ready.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        stream = (torch.cuda.stream(self.side) if self.side is not None
                  else contextlib.nullcontext())
        try:
            if self.cuda_index is not None:
                torch.cuda.set_device(self.cuda_index)
            with stream:
                for host in self.source:
                    if self.closed.is_set():
                        return
                    if host is None:
                        item = None
                    else:
                        value = self.prepare(host)
                        event = None
                        if self.side is not None:
                            event = torch.cuda.Event()
                            event.record(self.side)
                        item = OnDevice(value, event)
                    if not self._put(item):
                        return
        except BaseException as ex:  # noqa: BLE001 - handed to the training thread, raised there
            self._put(_Failed(ex))
            return
        self._put(_END)

    def __iter__(self) -> DevicePrefetch:
        return self

    def __next__(self) -> OnDevice | None:
        while True:
            try:
                item = self.ready.get(timeout=POLL_S)
                break
            except queue.Empty:
                # A producer that ended has put its last word first: never wait on a dead one.
                if not self.thread.is_alive() and self.ready.empty():
                    raise RuntimeError("the device-prefetch thread ended without handing "
                                       "over a batch") from None
        if item is _END:
            raise StopIteration
        if isinstance(item, _Failed):
            raise item.error
        if item is not None and item.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(item.ready)
            for tensor in _tensors(item.value):
                if tensor.is_cuda:
                    tensor.record_stream(current)
        return item

    def close(self) -> None:
        """Stop preparing batches and wait for the thread (it may be finishing one)."""
        self.closed.set()
        self.thread.join()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
