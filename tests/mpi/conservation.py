"""mpiexec -n 4 python conservation.py RUN_DIR CASES_JSON: AD-PSGD and H-ADPSGD learning for
real (float64, learning rate > 0, momentum and weight decay, random per-step delays, rank 3 ten
times slower, evaluations and checkpoints that pause the gossip).

Every change to a learner's model x is recorded under its lock: each optimizer step (the
update it applied) and each merge. Then, over the learners (ranks for adpsgd, node leaders for
hadpsgd):

* conservation: sum_i x_i(end) = sum_i x_i(0) + sum of every applied update, to 1e-10
  relative: averaging moved no mass, whatever the timing;
* every snapshot a learner sent was a state its x really had (its digest is among the
  digests of x after each change), and in the k-th exchange of a pair each end received
  exactly the snapshot the other end sent: both averaged the same two vectors.
"""

from runner.comm.communicator import Communicator

from harness import (
    Recorder,
    build_trainer,
    compose_config,
    conservation_error,
    gather_learners,
    matched_exchanges,
    run_cases_on_ranks,
)

TOLERANCE = 1e-10


def checks(world_mpi, run_dir, overrides):
    comm = Communicator(world_mpi, "mpi")
    cfg = compose_config([
        *overrides, "launcher.nprocs=4", "trainer.dtype=float64", "optim.momentum=0.9",
        "optim.weight_decay=1e-4", "faults.straggler.ranks=[3]", "faults.straggler.factor=10",
        "faults.delay_s=0.004", "trainer.epochs=1", "trainer.batch_size=32",
        "trainer.eval_every=5", "trainer.checkpoint_every=7"])
    assert cfg.optim.lr > 0
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    algo = trainer.algo
    recorder = Recorder(algo) if algo.averager else None
    start = [t.clone() for t in algo.x]
    summary = trainer.run()
    node.close()
    learners = gather_learners(comm, algo, recorder, start)
    comm.close()
    if trainer.world.is_main:
        assert summary["status"] == "completed"
    assert len(learners) == (2 if cfg.algo.name == "hadpsgd" else 4)
    worst = conservation_error(learners)
    assert worst < TOLERANCE, f"sum of the models off by {worst:.3g} (relative)"
    exchanges = matched_exchanges(learners)
    steps = summary.get("steps_per_rank") if summary else None
    return (f"conserved to {worst:.2e}, {exchanges} exchanges matched, "
            f"{sum(len(r['existed']) for r in learners)} snapshots existed"
            + (f", steps {steps}" if steps else ""))


if __name__ == "__main__":  # invariants.py runs its checks too
    run_cases_on_ranks(checks)
