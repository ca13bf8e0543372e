"""mpiexec -n 4 python straggler.py RUN_DIR CASES_JSON: train each case with
``faults.straggler.ranks=[3] faults.straggler.factor=4``; rank 3's compute seconds per step
must be well above the other ranks' (it sleeps 3x its forward/backward time, they do not)."""

import statistics

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks


def checks(world_mpi, run_dir, overrides):
    comm = Communicator(world_mpi, "mpi")
    cfg = compose_config([*overrides, "launcher.nprocs=4", "launcher.procs_per_node=2",
                          "faults.straggler.ranks=[3]", "faults.straggler.factor=4",
                          "trainer.epochs=1", "trainer.batch_size=64"])
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    trainer.run()
    node.close()
    # Asynchronous ranks take different numbers of steps: compare seconds per step.
    per_step = comm.allgather_objects(trainer.timers.seconds["compute"] / trainer.step)
    comm.close()
    assert per_step[3] > 2.0 * statistics.median(per_step[:3]), per_step
    return "straggler slowed: " + " ".join(f"{s * 1e3:.1f}" for s in per_step) + " ms/step"


run_cases_on_ranks(checks)
