"""mpiexec -n N python equivalence.py RUN_DIR CASES_JSON: train SSGD once, then the algorithm
each case selects, from the same seed in float64; each must end with SSGD's parameters on every
rank (docs/algorithms.md: dpsgd on the complete graph, hadpsgd with one node, dasgd with delay 0 and
tau 1, local SGD with period 1, each with plain SGD). A case whose overrides include
``reference:OVERRIDE`` items is compared with that configuration instead (DiLoCo with outer
learning rate 1 and no outer momentum against local SGD). Items ``common:OVERRIDE`` apply to
both runs (a smaller model or training set than PLAIN_SGD's)."""

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
    against = tuple(o.removeprefix("reference:") for o in overrides
                    if o.startswith("reference:")) or ("algo=ssgd",)
    common = tuple(o.removeprefix("common:") for o in overrides if o.startswith("common:"))
    if (common, against) not in reference:
        reference[common, against] = train(world_mpi, f"{run_dir}-reference",
                                           [*common, *against])
    ref_steps, ref_params = reference[common, against]
    steps, params = train(world_mpi, run_dir, [*common, *(
        o for o in overrides if not o.startswith(("reference:", "common:")))])
    assert steps == ref_steps > 0, (steps, ref_steps)
    worst = 0.0
    for ref, got in zip(ref_params, params):
        worst = max(worst, (ref - got).abs().max().item() / max(1.0, ref.abs().max().item()))
    name = "SSGD" if against == ("algo=ssgd",) else " ".join(against)
    assert worst < 1e-9, f"differs from {name} by {worst:.3g}"
    return f"equals {name} after {steps} steps (relative difference {worst:.2g})"


run_cases_on_ranks(checks)
