"""mpiexec -n N python equivalence.py RUN_DIR CASES_JSON: train SSGD once, then the algorithm
each case selects, from the same seed in float64; each must end with SSGD's parameters on every
rank (docs/algorithms.md: dpsgd on the complete graph, hadpsgd with one node, dasgd with delay 0 and
tau 1, local SGD with period 1, each with plain SGD)."""

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks

PLAIN_SGD = ["trainer.dtype=float64", "optim.momentum=0", "optim.nesterov=false",
             "optim.weight_decay=0", "trainer.epochs=2", "trainer.batch_size=16"]
reference = {}


def train(world_mpi, run_dir, overrides):
    comm = Communicator(world_mpi, "mpi")
    cfg = compose_config([*PLAIN_SGD, f"launcher.nprocs={comm.size}", *overrides])
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    trainer.run()
    node.close()
    comm.close()
    return trainer.state.step, [flat.clone() for flat in trainer.param_buffers]


def checks(world_mpi, run_dir, overrides):
    if not reference:
        reference["ssgd"] = train(world_mpi, f"{run_dir}-ssgd", ["algo=ssgd"])
    ref_steps, ref_params = reference["ssgd"]
    steps, params = train(world_mpi, run_dir, overrides)
    assert steps == ref_steps > 0, (steps, ref_steps)
    worst = 0.0
    for ref, got in zip(ref_params, params):
        worst = max(worst, (ref - got).abs().max().item() / max(1.0, ref.abs().max().item()))
    assert worst < 1e-9, f"differs from SSGD by {worst:.3g}"
    return f"equals SSGD after {steps} steps (relative difference {worst:.2g})"


run_cases_on_ranks(checks)
