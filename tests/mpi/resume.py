"""mpiexec -n N python resume.py RUN_DIR CASES_JSON: checkpoints, resume, graceful stop and
non-finite steps on real ranks. The first override of a case names its scenario:

* ``scenario=exact``: train with a checkpoint every 3 steps, then resume a new trainer from a
  checkpoint in the middle (one with communication in flight when the algorithm has any) and
  train to the end: the final parameters must equal the uninterrupted run's, bit for bit.
* ``scenario=preempt``: rank 1 alone gets SIGUSR1 mid-run; every rank must stop at the same
  step with a checkpoint, and ``resume=auto`` must end where the uninterrupted run ends.
* ``scenario=skip:A,B``: with ``on_nonfinite=skip_batch`` and rank 1's loss NaN at two steps,
  the ranks skip A and B steps; the model stays finite (and SSGD's replicas identical).
"""

import os
import signal

import torch

from runner.checkpoint.files import complete_checkpoints, load_rank_state
from runner.checkpoint.preemption import install_stop_handlers
from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks

BASE = ["trainer.dtype=float64", "trainer.epochs=2", "trainer.batch_size=64",
        "trainer.eval_every=10"]


def train(world_mpi, run_dir, overrides, before_step=None):
    comm = Communicator(world_mpi, "mpi")
    cfg = compose_config([*BASE, f"launcher.nprocs={comm.size}", *overrides])
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    if before_step is not None:
        step = trainer.train_step

        def hooked(*args):
            before_step(trainer)
            step(*args)

        trainer.train_step = hooked
    summary = trainer.run()
    node.close()
    comm.close()
    return trainer, summary, [flat.clone() for flat in trainer.param_buffers]


def largest_difference(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def middle_checkpoint(run_dir, rank):
    """A checkpoint before the end, preferring one taken with communication in flight."""
    found = complete_checkpoints(run_dir)[:-1]
    busy = [c for c in found if any(load_rank_state(c, rank)["algo"].get(key)
                                    for key in ("pending", "in_flight"))]
    chosen = (busy or found)[len(busy or found) // 2]
    return chosen, bool(busy)


def exact(world_mpi, run_dir, overrides):
    rank = world_mpi.Get_rank()
    first, _, reference = train(world_mpi, f"{run_dir}/whole",
                                [*overrides, "trainer.checkpoint_every=3",
                                 "trainer.keep_checkpoints=100"])
    checkpoint, in_flight = middle_checkpoint(f"{run_dir}/whole", rank)
    second, summary, resumed = train(world_mpi, f"{run_dir}/resumed",
                                     [*overrides, f"resume={checkpoint.path}"])
    assert second.resumed_from.path == checkpoint.path
    assert second.state.step == first.state.step, (second.state.step, first.state.step)
    difference = largest_difference(reference, resumed)
    assert difference == 0.0, f"resumed run differs by {difference:.3g}"
    return (f"resumed at step {checkpoint.step}/{first.state.step} "
            f"({'with' if in_flight else 'without'} communication in flight): identical")


def preempt(world_mpi, run_dir, overrides):
    rank = world_mpi.Get_rank()
    whole, _, reference = train(world_mpi, f"{run_dir}/whole", overrides)
    restore = install_stop_handlers()
    try:
        def signal_rank1(trainer):
            if rank == 1 and trainer.state.step == 5:
                os.kill(os.getpid(), signal.SIGUSR1)

        stopped, summary, _ = train(world_mpi, f"{run_dir}/run", overrides, signal_rank1)
    finally:
        restore()
    assert stopped.stop_status == "preempted", "rank did not stop"
    steps = world_mpi.allgather(stopped.state.step)
    assert len(set(steps)) == 1 and steps[0] < whole.state.step, f"stopped at steps {steps}"
    if rank == 0:
        assert summary["status"] == "preempted", summary["status"]
    [checkpoint] = [c for c in complete_checkpoints(f"{run_dir}/run") if c.step == steps[0]]
    assert checkpoint.reason == "preempted" or checkpoint.samples % 1437 == 0, checkpoint
    resumed, summary, params = train(world_mpi, f"{run_dir}/run", [*overrides, "resume=auto"])
    assert resumed.stop_status is None and resumed.resumed_from.path == checkpoint.path
    if rank == 0:
        assert summary["status"] == "completed"
    difference = largest_difference(reference, params)
    assert difference == 0.0, f"stopped and resumed run differs by {difference:.3g}"
    return f"every rank stopped at step {steps[0]}; resumed to the uninterrupted result"


def skip(world_mpi, run_dir, overrides):
    expected = [int(n) for n in overrides[0].removeprefix("scenario=skip:").split(",")]
    trainer, summary, params = train(world_mpi, run_dir, [
        *overrides[1:], "trainer.on_nonfinite=skip_batch", "faults.nonfinite_loss.ranks=[1]",
        "faults.nonfinite_loss.steps=[4,9]"])
    assert all(torch.isfinite(p).all() for p in params), "non-finite parameters"
    if world_mpi.Get_rank() == 0:
        assert summary["skipped_batches"] == expected, summary["skipped_batches"]
        assert summary["status"] == "completed"
        if trainer.algo.identical_replicas:
            assert summary["replicas_identical"], "SSGD replicas parted"
    return f"skipped {expected} steps per rank; model finite"


def checks(world_mpi, run_dir, overrides):
    scenario = overrides[0].removeprefix("scenario=")
    if scenario.startswith("skip:"):
        return skip(world_mpi, run_dir, overrides)
    return {"exact": exact, "preempt": preempt}[scenario](world_mpi, run_dir, overrides[1:])


run_cases_on_ranks(checks)
