"""mpiexec -n 4 python push_sum.py RUN_DIR CASES_JSON: SGP learning for real (float64, learning
rate > 0, momentum and weight decay, evaluations and checkpoints on the way):

* the push-sum weights, with the share in flight (overlap SGP), sum to n after every step, to
  1e-12;
* sum_i x_i(end) = sum_i x_i(0) + every update the optimizer applied, to 1e-10 relative:
  pushing moved no mass (the last push is folded in before the final evaluation).
"""

import torch

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks

TOLERANCE = 1e-10


def checks(world_mpi, run_dir, overrides):
    comm = Communicator(world_mpi, "mpi")
    cfg = compose_config([
        *overrides, "launcher.nprocs=4", "trainer.dtype=float64", "optim.momentum=0.9",
        "optim.weight_decay=1e-4", "trainer.epochs=1", "trainer.batch_size=32",
        "trainer.eval_every=5", "trainer.checkpoint_every=7"])
    assert cfg.optim.lr > 0
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    algo = trainer.algo
    start = [t.clone() for t in algo.z]  # x = z at the start (w = 1)
    applied = [torch.zeros_like(t) for t in algo.z]
    weight_sums = []
    apply_update, after_step = algo.apply_update, algo.after_step

    def recorded_update(optimizer):
        algo._to_numerator()
        before = [t.clone() for t in algo.z]
        apply_update(optimizer)
        for total, was, now in zip(applied, before, algo.z):
            total += now - was

    def counted_step(step):
        after_step(step)
        held = float(algo.weight) + algo.weight_in_flight
        weight_sums.append(float(comm.allreduce_numbers([held])[0]))

    algo.apply_update, algo.after_step = recorded_update, counted_step
    summary = trainer.run()
    node.close()
    end = [t * float(algo.weight) for t in algo.z]
    sums = {}
    for name, tensors in (("start", start), ("applied", applied), ("end", end)):
        flat = torch.cat([t.flatten() for t in tensors])
        comm.allreduce_(flat)
        sums[name] = flat
    comm.close()
    if trainer.world.is_main:
        assert summary["status"] == "completed"
    worst_weight = max(abs(s - 4) for s in weight_sums)
    assert len(weight_sums) == trainer.state.step and worst_weight < 1e-12, worst_weight
    error = float((sums["end"] - sums["start"] - sums["applied"]).abs().max()
                  / sums["end"].abs().max())
    assert error < TOLERANCE, f"sum of the models off by {error:.3g} (relative)"
    return (f"weights summed to n at all {len(weight_sums)} steps (within {worst_weight:.1e}); "
            f"sum of x conserved to {error:.2e}")


if __name__ == "__main__":  # invariants.py runs its checks too
    run_cases_on_ranks(checks)
