"""mpiexec -n N python equivalence.py RUN_DIR OVERRIDE...: train SSGD, then the algorithm the
overrides select, from the same seed in float64; both must end with the same parameters on
every rank (algorithms.md: dpsgd on the complete graph, hadpsgd with one node, dasgd with
delay 0 and tau 1, local SGD with period 1, each with plain SGD)."""

import sys

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_on_ranks

run_dir, overrides = sys.argv[1], sys.argv[2:]
PLAIN_SGD = ["trainer.dtype=float64", "optim.momentum=0", "optim.nesterov=false",
             "optim.weight_decay=0", "trainer.epochs=2", "trainer.batch_size=16"]


def train(world_mpi, comm, name, extra):
    cfg = compose_config([*PLAIN_SGD, *extra])
    trainer, node = build_trainer(world_mpi, comm, f"{run_dir}/{name}", cfg)
    trainer.run()
    node.close()
    return trainer


def checks(world_mpi):
    comm = Communicator(world_mpi, "mpi")
    nprocs = f"launcher.nprocs={world_mpi.Get_size()}"
    reference = train(world_mpi, comm, "ssgd", ["algo=ssgd", nprocs])
    candidate = train(world_mpi, comm, "candidate", [nprocs, *overrides])
    assert candidate.step == reference.step > 0
    worst = 0.0
    for ref, got in zip(reference.param_buffers, candidate.param_buffers):
        worst = max(worst, (ref - got).abs().max().item() / max(1.0, ref.abs().max().item()))
    assert worst < 1e-9, f"differs from SSGD by {worst:.3g}"
    return f"equals SSGD after {candidate.step} steps (relative difference {worst:.2g})"


run_on_ranks(checks)
