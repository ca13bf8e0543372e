"""trainer.prefetch_to_device (runner/train/prefetch.py), on the CPU (the thread and its hand-over
are the same code on a GPU, where tests/test_gpu.py also runs them with CUDA streams): batches
come out in order and unchanged, an empty batch passes through, an error preparing a batch
reaches the training thread at that batch, closing mid-pass stops the thread and closes the
loader's iterator, and a run trains the same model with and without it."""

import threading

import pytest
import torch

from runner.train.compute_path import ComputePath
from runner.train.prefetch import DevicePrefetch, OnDevice

from conftest import read_run, run_cli

CPU = torch.device("cpu")


class Doubling:
    """A recipe whose to_device doubles the batch, remembering the thread it ran on."""

    def __init__(self, fail_at=None):
        self.threads, self.fail_at = set(), fail_at

    def to_device(self, batch, device, dtype):
        self.threads.add(threading.current_thread().name)
        if self.fail_at is not None and int(batch[0]) == self.fail_at:
            raise ValueError(f"cannot prepare batch {self.fail_at}")
        return batch * 2


def host_batches(n, closed=None):
    try:
        for k in range(n):
            yield None if k == 2 else torch.full((3,), float(k))
    finally:
        if closed is not None:
            closed.append(True)


def test_batches_arrive_in_order_prepared_by_the_background_thread():
    path, recipe = ComputePath(device=CPU), Doubling()
    with path.batches(recipe, host_batches(6), prefetch=True) as stream:
        out = list(stream)
    assert out[2] is None and all(isinstance(b, OnDevice) for k, b in enumerate(out) if k != 2)
    got = [path.batch(recipe, b) for k, b in enumerate(out) if k != 2]
    assert [float(b[0]) for b in got] == [0, 2, 6, 8, 10]
    assert recipe.threads == {"device-prefetch"}  # path.batch passed them through
    with path.batches(recipe, host_batches(3), prefetch=False) as stream:
        assert float(path.batch(recipe, next(stream))[0]) == 0  # without: in this thread
    assert "MainThread" in recipe.threads


def test_an_error_preparing_a_batch_is_raised_in_the_training_thread_at_that_batch():
    path = ComputePath(device=CPU)
    with path.batches(Doubling(fail_at=3), host_batches(6), prefetch=True) as stream:
        assert [float(b.value[0]) if b else None for b in (next(stream), next(stream),
                                                           next(stream))] == [0, 2, None]
        with pytest.raises(ValueError, match="cannot prepare batch 3"):
            next(stream)


def test_leaving_mid_pass_stops_the_thread_and_closes_the_loader_iterator():
    closed = []
    source = host_batches(1000, closed)
    staged = DevicePrefetch(source, lambda b: b, CPU, ahead=2)
    next(staged)
    staged.close()
    assert not staged.thread.is_alive() and closed == [True]


@pytest.mark.mpi
def test_a_run_trains_the_same_model_with_and_without_prefetching(tmp_path):
    common = ["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.epochs=1",
              "trainer.progress=false", "seed=3"]
    finals = []
    for prefetch in ("true", "false"):
        run_dir = tmp_path / prefetch
        run_cli([*common, f"trainer.prefetch_to_device={prefetch}",
                 f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        metrics, summary = read_run(run_dir)
        assert summary["status"] == "completed"
        finals.append([(m["loss"], m.get("top1")) for m in metrics])
    assert finals[0] == finals[1]


def test_a_producer_that_dies_without_a_word_is_an_error_not_a_hang(monkeypatch):
    staged = DevicePrefetch(host_batches(5), lambda b: b, CPU)
    staged.closed.set()  # the producer stops at its next batch and hands nothing over
    staged.thread.join()
    while not staged.ready.empty():
        staged.ready.get()
    with pytest.raises(RuntimeError, match="ended without handing over a batch"):
        next(staged)
