"""mpiexec -n N python dasgd_merge.py RUN_DIR CASES_JSON: train DaSGD with a real learning
rate and check every merge x <- abar + (x - s) (docs/algorithms.md, DaSGD): the mean model is the
same just before and just after it, and afterwards x_i - x_j equals the difference of the
two ranks' progress since the snapshot."""

import torch

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks


def checks(world_mpi, run_dir, overrides):
    comm = Communicator(world_mpi, "mpi")
    cfg = compose_config(["algo=dasgd", "trainer.dtype=float64", "trainer.epochs=1",
                          "trainer.batch_size=16", f"launcher.nprocs={comm.size}", *overrides])
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    algo = trainer.algo
    merge = algo._merge
    checked = []

    def checked_merge():
        progress = [(x - s).clone() for x, s in zip(algo.x, algo.snapshot)]
        before = [comm.allreduce_(x.clone(), op="mean") for x in algo.x]
        merge()
        for x, mean_before, moved in zip(algo.x, before, progress):
            mean_after = comm.allreduce_(x.clone(), op="mean")
            assert torch.allclose(mean_after, mean_before, rtol=0, atol=1e-12), "mean moved"
            # x_i - x_j = moved_i - moved_j  <=>  x_i - moved_i is the same on every rank.
            base = x - moved
            spread = (comm.allreduce_(base.clone(), op="mean") - base).abs().max().item()
            assert spread < 1e-12, f"merged models differ by more than local progress: {spread}"
            assert moved.abs().max().item() > 0 or algo.cfg.delay == 0
        checked.append(True)

    algo._merge = checked_merge
    trainer.run()
    node.close()
    comm.close()
    assert len(checked) == algo.launches > 3, (len(checked), algo.launches)
    return f"{len(checked)} merges kept the mean and the local progress"


if __name__ == "__main__":  # invariants.py runs its checks too
    run_cases_on_ranks(checks)
